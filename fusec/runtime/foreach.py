"""foreach (multi-tensor apply): one launch over many sets of arrays."""
from __future__ import annotations

import itertools

import numpy as np

from fusec.compiler import Compiled
from fusec.errors import ArgumentError
from fusec.runtime.executor import BLOCK_SIZE, Backend, Executor, as_result

# A work item's elements at most: 8 Ki, a few vectors per thread of a block.
# Measured on the H200 (benchmarks/foreach_profile.py, one Adam step over ~51 M
# values): 8 Ki items 367 µs, 16 Ki 381, 64 Ki 385, 256 Ki 442 (too few items
# to balance 132 SMs). The kernel reads each item's bounds from the table.
CHUNK = 8192


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

    def __init__(self, compiled: Compiled, backend: Backend):
        super().__init__(compiled, backend)
        (self.kernel, self.kernel_args, alignment, _), = self.launches
        first_output = len(self.params)
        self.input_alignment = [(i, size) for i, size in alignment if i < first_output]
        self.output_alignment = [(i - first_output, size) for i, size in alignment if i >= first_output]
        self.array_names = [p.name for p in self.params if p.shape is not None]
        self.scalar_positions = [i for i, p in enumerate(self.params) if p.shape is None]
        self._prepared: list[tuple[tuple, _Prepared]] = []  # (key, preparation), most recent first

    def foreach(self, sets, *scalar_args, **scalar_kwargs) -> list:
        """The pipeline over many sets of arrays in one launch: `sets` is a list
        with one tuple of array arguments per set, in declaration order; the
        scalars, given once, are shared. Returns each set's outputs; inout
        arrays are updated in place."""
        if not isinstance(sets, (list, tuple)) or not sets:
            raise ArgumentError("foreach takes a non-empty list of argument sets, one tuple of arrays each")
        scalars = self._scalars(scalar_args, scalar_kwargs)
        prepared = self._lookup(sets, scalars)
        if prepared.foreign:
            self.backend.hand_off()
        if not self.pipeline.outputs:  # updates in place (an optimizer): nothing to allocate or return
            if prepared.chunks:
                self._launch_sets(prepared, scalars)
            return [None] * len(sets)
        outputs = [[self.backend.empty(shape, dtype) for shape, dtype in shapes] for shapes in prepared.output_shapes]
        if prepared.chunks:
            self._launch_sets(prepared, scalars, outputs)
        return [as_result(out) for out in outputs]

    def _scalars(self, args: tuple, kwargs: dict) -> dict[int, object]:
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
        return {i: self.checkers[i](given[self.params[i].name]) for i in self.scalar_positions}

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
        if not set(map(type, sets)) <= {tuple, list}:
            return None
        signatures = self.backend.signatures(list(itertools.chain.from_iterable(sets)))
        return None if signatures is None else (list(map(len, sets)), signatures)

    def _prepare_sets(self, sets, scalars: dict) -> "_Prepared":
        """Every set checked (as a call would check it), then across sets; the tables built."""
        per_set, sizes, output_shapes = [], [], []
        for j, arrays in enumerate(sets):
            if not isinstance(arrays, (list, tuple)) or len(arrays) != len(self.array_names):
                raise ArgumentError(f"foreach set {j}: expected {len(self.array_names)} arrays "
                                    f"({', '.join(self.array_names)}), got {arrays!r:.60}")
            given = iter(arrays)
            args = [scalars[i] if i in scalars else next(given) for i in range(len(self.params))]
            try:
                values, _, _, set_sizes = self._bind(args, {})
                if self.inout:
                    self._check_aliasing(values)
            except ArgumentError as exc:
                raise ArgumentError(f"foreach set {j}: {exc}") from None
            per_set.append(values)
            sizes.append(set_sizes.kernels[0][0])
            output_shapes.append(set_sizes.outputs)
        self._check_across_sets(per_set)
        pointer = self.backend.pointer
        aligned = [all(pointer(values[i]) % size == 0 for i, size in self.input_alignment) for values in per_set]
        tables = {key: self._pointer_table([values[key] for values in per_set])
                  for kind, key in self.kernel_args if kind == "pointers" and key < len(self.params)}
        items = work_items(sizes, aligned, self.kernel.vector)
        foreign = any(map(self.backend.foreign, itertools.chain.from_iterable(sets)))
        return _Prepared(tables, sizes, aligned, self.backend.table(items), len(items), output_shapes, foreign)

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
                items = self.backend.table(work_items(prepared.sizes, aligned, self.kernel.vector))
        args = [tables[key] if kind == "pointers" else scalars[key] if kind == "scalar"
                else items if kind == "table" else prepared.chunks for kind, key in self.kernel_args]
        self.backend.launch(self.kernel, prepared.chunks * BLOCK_SIZE, args, None, False)

    def _pointer_table(self, arrays: list):
        return self.backend.table(np.array([self.backend.pointer(a) for a in arrays], np.uint64))

    def _check_across_sets(self, per_set: list[list]) -> None:
        """No written array may share memory with any other array: one sweep over
        the arrays sorted by address. (Within a set `_check_aliasing` has checked
        already, so an overlap with a written array is always across sets.)"""
        spans = []
        for j, values in enumerate(per_set):
            for role, value in zip(self.roles, values):
                if role != "scalar":
                    start, end = self.backend.span(value)
                    if end > start:
                        spans.append((start, end, role != "in", j))
        spans.sort()
        end_any = end_written = 0
        for start, end, written, j in spans:
            if (written and start < end_any) or start < end_written:
                raise ArgumentError(f"foreach set {j} shares memory with another set, and one of them writes it: "
                                    "pass separate arrays")
            end_any = max(end_any, end)
            if written:
                end_written = max(end_written, end)


def work_items(sizes: list[int], aligned: list[bool], width: int) -> np.ndarray:
    """The work items (plan.WORK_ITEM): every CHUNK elements of every set,
    its whole vectors marked where the set's arrays are aligned."""
    sizes = np.asarray(sizes, np.int64)
    counts = -(-sizes // CHUNK)
    sets = np.repeat(np.arange(len(sizes), dtype=np.int64), counts)
    start = (np.arange(counts.sum(), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)) * CHUNK
    end = np.minimum(start + CHUNK, sizes[sets])
    vector_end = np.where(np.asarray(aligned, bool)[sets], start + (end - start) // width * width, start)
    return np.stack([sets, start, vector_end, end], axis=1)


class _Prepared:
    """What one list of argument sets fixes."""

    __slots__ = ("tables", "sizes", "aligned", "items", "chunks", "output_shapes", "foreign")

    def __init__(self, tables, sizes, aligned, items, chunks, output_shapes, foreign):
        self.tables, self.sizes, self.aligned = tables, sizes, aligned
        self.items, self.chunks, self.output_shapes = items, chunks, output_shapes
        self.foreign = foreign  # torch tensors among the arrays: hand_off() before each launch
