"""foreach (multi-tensor apply): one launch over many sets of arrays."""
from __future__ import annotations

import itertools

import numpy as np

from fusec.errors import ArgumentError
from fusec.ir.launch import LaunchInterface, MultiTensor, PointerTable, ScalarArg, WorkItemCount, WorkItems, unhandled
from fusec.runtime.binder import Binder, BoundCall, allocate, mixed_kinds
from fusec.runtime.executor import Backend, Executor, as_result


class SetBinder:
    """The checks of a foreach call, the same on every backend: the list of
    sets, the scalars (given once), each set as a call would be checked, and
    no written array shared between sets."""

    def __init__(self, binder: Binder):
        self.binder = binder
        self.params = binder.params
        self.array_names = [p.name for p in self.params if p.is_array]
        self.scalar_positions = [i for i, p in enumerate(self.params) if not p.is_array]

    def bind(self, sets, scalar_args: tuple, scalar_kwargs: dict) -> tuple[dict[int, object], list[BoundCall]]:
        """The checked scalars (by parameter position) and every set's checked call."""
        scalars = self.scalars(scalar_args, scalar_kwargs)
        return scalars, self.sets(sets, scalars)

    def scalars(self, args: tuple, kwargs: dict) -> dict[int, object]:
        """The checked scalars, by parameter position."""
        names = [self.params[i].name for i in self.scalar_positions]
        if len(args) > len(names) or set(kwargs) - set(names):
            raise ArgumentError(f"foreach takes the scalars {', '.join(names) or '(none)'}")
        given = dict(zip(names, args))
        twice = sorted(set(given) & set(kwargs))
        if twice:
            raise ArgumentError(f"foreach got scalar '{twice[0]}' twice")
        given |= kwargs
        missing = [name for name in names if name not in given]
        if missing:
            raise ArgumentError(f"foreach is missing scalar{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        scalars = {i: self.binder.checkers[i](given[self.params[i].name]) for i in self.scalar_positions}
        self.binder.check_counts([scalars.get(i) for i in range(len(self.params))])
        return scalars

    def sets(self, sets, scalars: dict[int, object]) -> list[BoundCall]:
        """Every set checked as a call would be, then across sets."""
        if not isinstance(sets, (list, tuple)) or not sets:
            raise ArgumentError("foreach takes a non-empty list of argument sets, one tuple of arrays each")
        calls = []
        for j, arrays in enumerate(sets):
            if not isinstance(arrays, (list, tuple)) or len(arrays) != len(self.array_names):
                raise ArgumentError(f"foreach set {j}: expected {len(self.array_names)} arrays "
                                    f"({', '.join(self.array_names)}), got {arrays!r:.60}")
            given = iter(arrays)
            args = [scalars[i] if i in scalars else next(given) for i in range(len(self.params))]
            try:
                calls.append(self.binder.bind(args, {}))  # every check of a call, aliasing within the set too
            except ArgumentError as exc:
                raise ArgumentError(f"foreach set {j}: {exc}") from None
        for j, call in enumerate(calls[1:], 1):
            if call.kind is not calls[0].kind:
                raise ArgumentError(f"foreach set {j}: " + str(mixed_kinds(("its arrays", sets[j][0]),
                                                                             ("set 0's", sets[0][0]),
                                                                             calls[0].kind, call.kind)))
        self._check_across_sets([c.values for c in calls])
        return calls

    def _check_across_sets(self, per_set: list[list]) -> None:
        """No written array may share memory with any other array: one sweep over
        the arrays sorted by address. (Within a set the binder has checked
        already, so an overlap with a written array is always across sets.)"""
        spans = []
        for j, values in enumerate(per_set):
            for param, value in zip(self.params, values):
                if param.is_array:
                    start, end = self.binder.arrays.span(value)
                    if end > start:
                        spans.append((start, end, param.written, j))
        spans.sort()
        end_any = end_written = 0
        for start, end, written, j in spans:
            if (written and start < end_any) or start < end_written:
                raise ArgumentError(f"foreach set {j} shares memory with another set, and one of them writes it: "
                                    "pass separate arrays")
            end_any = max(end_any, end)
            if written:
                end_written = max(end_written, end)


class MultiTensorExecutor(Executor):
    """Runs a pipeline compiled with `multi_tensor=True`: its one kernel reads
    a table of pointers per array parameter (one entry per set) and a table of
    work items.

    What a list of sets fixes (every array checked, the pointer tables and the
    work items, on the device) is prepared once and kept for the next call
    whose arrays have the same signatures (address, shape, layout and dtype,
    read without importing the arrays): an optimizer stepping the same
    parameters pays for one launch and that comparison. A preparation depends
    on nothing else, so it holds no arrays: a gradient freed and allocated
    again at the same address with the same shape matches it, as it should.
    At most MAX_PREPARED are kept, the least recently used dropped first.
    """

    MAX_PREPARED = 4

    def __init__(self, interface: LaunchInterface, backend: Backend):
        super().__init__(interface, backend)
        (self.kernel,) = self.kernels
        assert isinstance(self.kernel.launch.form, MultiTensor), "foreach runs a MultiTensor kernel"
        ((self.variant, self.block),) = self.kernel.variants
        self.chunk = self.kernel.launch.form.chunk
        first_output = len(self.params)
        alignment = self.variant.alignment
        self.input_alignment = [(i, size) for i, size in alignment if i < first_output]
        self.output_alignment = [(i - first_output, size) for i, size in alignment if i >= first_output]
        self.set_binder = SetBinder(self.binder)
        self._prepared: list[tuple[tuple, _Prepared]] = []  # (key, preparation), most recent first

    def foreach(self, sets, *scalar_args, **scalar_kwargs) -> list:
        """The pipeline over many sets of arrays in one launch: `sets` is a list
        with one tuple of array arguments per set, in declaration order; the
        scalars, given once, are shared. Returns each set's outputs; inout
        arrays are updated in place."""
        scalars = self.set_binder.scalars(scalar_args, scalar_kwargs)
        prepared = self._lookup(sets, scalars)
        if not self.signature.outputs:  # updates in place (an optimizer): nothing to allocate or return
            if prepared.chunks:
                self._launch_sets(prepared, scalars)
            return [None] * len(sets)
        # Each set's outputs: new arrays of the sets' kind (torch tensors for tensors), and the backend's views.
        allocated = [allocate(prepared.kind, shapes) for shapes in prepared.output_shapes]
        if prepared.chunks:
            self._launch_sets(prepared, scalars, [views for _, views in allocated])
        return [as_result(results) for results, _ in allocated]

    def _lookup(self, sets, scalars: dict) -> "_Prepared":
        """The preparation kept for these arrays (compared with ==, most recent
        first: hashing ~800 signatures would cost more than comparing them), or a new one."""
        key = self._key(sets)
        if key is not None:
            for j, (kept, prepared) in enumerate(self._prepared):
                if kept == key:
                    self._prepared.insert(0, self._prepared.pop(j))
                    return prepared
        prepared = self._prepare_sets(sets, scalars)
        if key is not None:
            self._prepared = [(key, prepared)] + self._prepared[:self.MAX_PREPARED - 1]
        return prepared

    def _key(self, sets) -> tuple | None:
        """Each set's length and every array's signature, or None where some
        array has none (then nothing is kept, and every call checks everything)."""
        if not isinstance(sets, (list, tuple)) or not set(map(type, sets)) <= {tuple, list}:
            return None
        signatures = self.backend.signatures(list(itertools.chain.from_iterable(sets)))
        return None if signatures is None else (list(map(len, sets)), signatures)

    def _prepare_sets(self, sets, scalars: dict) -> "_Prepared":
        """Every set checked (as a call would check it), then across sets; the tables built."""
        per_set, sizes, output_shapes = [], [], []
        calls = self.set_binder.sets(sets, scalars)
        for call in calls:
            set_sizes = self._sizes_for(call.values, call.dims)
            per_set.append(call.values)
            sizes.append(set_sizes.kernels[0][0])
            output_shapes.append(set_sizes.outputs)
        pointer = self.backend.pointer
        aligned = [all(pointer(values[i]) % size == 0 for i, size in self.input_alignment) for values in per_set]
        tables = {source.slot: self._pointer_table([values[source.slot] for values in per_set])
                  for source in self.kernel.sources
                  if isinstance(source, PointerTable) and source.slot < len(self.params)}
        items = work_items(sizes, aligned, self.variant.elements_per_thread, self.chunk)
        return _Prepared(tables, sizes, aligned, self.backend.table(items), len(items), output_shapes, calls[0].kind)

    def _launch_sets(self, prepared: "_Prepared", scalars: dict, outputs: list[list] | None = None) -> None:
        """One launch over every set; `outputs`: each set's new output arrays."""
        tables, items = prepared.tables, prepared.items
        if outputs:
            first = len(self.params)
            tables = tables | {first + k: self._pointer_table([out[k] for out in outputs])
                               for k in range(len(outputs[0]))}
            pointer = self.backend.pointer
            aligned = [ok and all(pointer(out[k]) % size == 0 for k, size in self.output_alignment)
                       for ok, out in zip(prepared.aligned, outputs)]
            if aligned != prepared.aligned:  # an allocator that hands out less aligned memory
                items = self.backend.table(work_items(prepared.sizes, aligned, self.variant.elements_per_thread,
                                                      self.chunk))
        args = []
        for source, pack in zip(self.kernel.sources, self.kernel.packers):
            match source:
                case PointerTable(slot):
                    value = tables[slot]
                case ScalarArg(slot):
                    value = scalars[slot]
                case WorkItems():
                    value = items
                case WorkItemCount():
                    value = prepared.chunks
                case _:
                    unhandled(source)
            args.append(value if pack is None else pack(value))
        grid = self._grid(self.variant, self.block, prepared.chunks, [])
        stream = prepared.kind.stream()  # torch tensors: torch's current stream, where they were written
        fire = self.backend.launcher(self.variant.name, grid, self.block)
        if stream is None:
            fire(args)
        else:
            fire(args, stream=stream)

    def _pointer_table(self, arrays: list):
        return self.backend.table(np.array([self.backend.pointer(a) for a in arrays], np.uint64))


def work_items(sizes: list[int], aligned: list[bool], width: int, chunk: int) -> np.ndarray:
    """The work items (launch.WORK_ITEM): every `chunk` elements of every set,
    its whole vectors marked where the set's arrays are aligned."""
    sizes = np.asarray(sizes, np.int64)
    counts = -(-sizes // chunk)
    sets = np.repeat(np.arange(len(sizes), dtype=np.int64), counts)
    start = (np.arange(counts.sum(), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)) * chunk
    end = np.minimum(start + chunk, sizes[sets])
    vector_end = np.where(np.asarray(aligned, bool)[sets], start + (end - start) // width * width, start)
    return np.stack([sets, start, vector_end, end], axis=1)


class _Prepared:
    """What one list of argument sets fixes."""

    __slots__ = ("tables", "sizes", "aligned", "items", "chunks", "output_shapes", "kind")

    def __init__(self, tables, sizes, aligned, items, chunks, output_shapes, kind):
        self.tables, self.sizes, self.aligned = tables, sizes, aligned
        self.items, self.chunks, self.output_shapes = items, chunks, output_shapes
        self.kind = kind  # of the sets' arrays: what outputs are allocated as, and the stream launched on
