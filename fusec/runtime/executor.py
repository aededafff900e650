"""Running a compiled module, whatever executes the kernels.

A backend supplies array checks, allocation and the launch of one kernel;
`Executor` binds the call's arguments, checks every array before anything
launches (dtype, shape, device, layout, aliasing), allocates outputs and
intermediate buffers, and launches the kernels in order.
"""
from __future__ import annotations

import math
from typing import Protocol

from fusec.compiler import Compiled
from fusec.errors import ArgumentError
from fusec.ir.kernels import Kernel, RepeatSteps, kernel_params, needs_coordinates, vector_alignment
from fusec.ir.program import Slot
from fusec.runtime.binder import bind_dims, concrete, numpy_dtype, scalar_checker, size_of, split_args

# Threads per block: 256 is the usual choice for memory-bound elementwise
# kernels (8 warps; 8 blocks fill an H200 SM's 2,048 threads).
BLOCK_SIZE = 256


class Backend(Protocol):
    def check_array(self, param: Slot, value) -> object:
        """The array for an array parameter, or ArgumentError (kind, dtype, device, layout, writeable)."""

    def array_checker(self, param: Slot):
        """A function doing `check_array` for this parameter, as fast as the backend can."""

    def span(self, array) -> tuple[int, int]:
        """The address range [start, end) an array's elements occupy."""

    def pointer(self, array) -> int:
        """The address of an array's first element."""

    def signature(self, value) -> tuple | None:
        """A cheap key for an array argument, before any check: equal keys mean
        the same memory, shape, strides and dtype (None: no cheap key)."""

    def signatures(self, arrays: list) -> object | None:
        """The signatures of many arrays, in any form that compares with ==."""

    def empty(self, shape: tuple[int, ...], dtype) -> object: ...

    def launch(self, kernel: Kernel, n: int, args: list, stream, vector: bool) -> None:
        """Runs `kernel` (its vector variant if `vector`) over n elements; the backend picks the block size."""

    def prepare_launch(self, kernel: Kernel, n: int, vector: bool) -> tuple[list, object]:
        """What launch() fixes for these sizes: a converter per argument (None:
        passed as it is) and fire(converted arguments), on the current stream."""

    def address(self, pointer: int) -> object:
        """A launch argument for an array given by its address alone."""

    def foreign(self, value) -> bool:
        """Whether an array comes from another library (its import orders streams: see hand_off)."""

    def hand_off(self) -> None:
        """The stream ordering importing a foreign array gives, for the paths
        that read foreign arrays by signature without importing them."""

    def stream(self, value) -> object:
        """The backend's stream for a `stream=` argument (None: the current one)."""

    def table(self, array) -> object:
        """A small NumPy array (pointers, sizes, work items) where kernels can read it (foreach)."""

    # Graph backends only (GraphExecutor):
    def capture(self, launch) -> object:
        """A graph of what launch(stream) enqueues on a capturing stream."""

    def replay(self, graph, stream) -> None: ...


class Executor:
    """Calls a compiled pipeline.

    What depends only on the pipeline is prepared once: a checker per
    parameter, and each launch's arguments as positions in one flat list of
    values (parameters, then outputs, then intermediates). What depends on the
    arguments' shapes (dims, allocation shapes, each kernel's sizes) is prepared
    once per shape signature and cached. And a plain call (no out=, no stream=)
    whose arrays have the signatures of two earlier calls (address, shape,
    layout, dtype; and the same repeat counts) replays the launches recorded
    at the second (`_Call`): it checks its scalars, allocates its outputs and
    launches.
    """

    def __init__(self, compiled: Compiled, backend: Backend):
        self.compiled = compiled
        self.backend = backend
        pipeline = self.pipeline = compiled.program.pipeline(compiled.plan.pipeline)
        self.params = pipeline.params
        names = [p.name for p in self.params]
        # `out=` and `stream=` are call options unless the pipeline has a parameter of that name.
        self.options = [o for o in ("out", "stream") if o not in names]
        self.checkers = [backend.array_checker(p) if p.shape is not None else scalar_checker(p) for p in self.params]
        self.array_positions = [i for i, p in enumerate(self.params) if p.shape is not None]
        temps = [b for b in compiled.plan.buffers if b.name not in names
                 and b.name not in {o.name for o in pipeline.outputs}]
        self.temps = temps
        slots = names + [o.name for o in pipeline.outputs] + [b.name for b in temps]
        self.slot_names = slots
        position = {name: i for i, name in enumerate(slots)}
        self.roles = [p.role for p in self.params] + ["out"] * len(pipeline.outputs) + ["temp"] * len(temps)
        # Aliasing can only happen through an inout parameter or a caller's out= array.
        self.inout = [i for i, p in enumerate(self.params) if p.role == "inout"]
        self.launches = []
        for k in compiled.plan.kernels:
            params = [(p.kind, position[p.key] if p.kind in ("array", "scalar", "pointers") else p.key)
                      for p in kernel_params(k)]
            alignment = [(position[buf], size) for buf, size in vector_alignment(k)]
            self.launches.append((k, params, alignment, needs_coordinates(k)))
        # The launch order: kernel indices, and Repeats of them (a repeat body not made persistent).
        self.steps = compiled.plan.steps
        counts = [s.count for s in self.steps if isinstance(s, RepeatSteps)] + \
            [k.count for k in compiled.plan.kernels if k.count is not None]
        self.counts = {c: position[c] for c in counts if isinstance(c, str)}
        self._sizes: dict[tuple, _Sizes] = {}
        self._is_array = [p.shape is not None for p in self.params]
        self._count_positions = set(self.counts.values())
        self._calls: dict[tuple, _Call] = {}
        self._seen: set[tuple] = set()  # keys of plain calls seen once

    def __call__(self, *args, **kwargs):
        key = self._call_key(args) if not kwargs else None
        record = False
        if key is not None:
            try:
                call = self._calls.get(key)
            except TypeError:  # an unhashable repeat count: the checked path says what is wrong
                call = key = None
            if call is not None:
                result = call.run(args)
                if result is not _Call.MISALIGNED:
                    return result
            elif key is not None:  # kept from its second sighting on, so that one-off calls cost no recording
                record = key in self._seen
                if len(self._seen) >= 256:  # a caller cycling through many arrays: start afresh
                    self._seen.clear()
                self._seen.add(key)
        values, out, stream, sizes = self._bind(args, kwargs)
        self._allocate(values, out, sizes)
        launched = [] if record else None
        self._launch_all(values, sizes, stream, launched)
        if record:
            if len(self._calls) >= 256:
                self._calls.clear()
            self._calls[key] = _Call(self, values, sizes, launched, self._foreign(args, {}))
        return self._result(values)

    def _call_key(self, args: tuple, scalars: bool = False) -> tuple | None:
        """A call's key, read before any check (None: not a plain positional
        call, or an array with no cheap signature): each array's signature, and
        each scalar with its type (1, 1.0 and True are different arguments)
        where it matters: all of them with `scalars` (a graph holds their
        values), else the repeat counts (a count fixes the launch sequence)."""
        if len(args) != len(self._is_array):
            return None
        signature = self.backend.signature
        key = []
        for position, (value, is_array) in enumerate(zip(args, self._is_array)):
            if is_array:
                value = signature(value)
                if value is None:
                    return None
                key.append(value)
            elif scalars or position in self._count_positions:
                key += (type(value), value)
        return tuple(key)

    def _foreign(self, args: tuple, kwargs: dict) -> bool:
        """Whether an array argument comes from another library (see Backend.hand_off)."""
        arrays = [args[i] for i in self.array_positions if i < len(args)]
        arrays += [kwargs[p.name] for p in self.params if p.shape is not None and p.name in kwargs]
        return any(map(self.backend.foreign, arrays))

    def _bind(self, args, kwargs):
        """Checked arguments (a flat list), out=, stream=, and the sizes for these shapes."""
        out = stream = None
        if kwargs:
            out = kwargs.pop("out", None) if "out" in self.options else None
            stream = self.backend.stream(kwargs.pop("stream", None) if "stream" in self.options else None)
        values = args if not kwargs and len(args) == len(self.params) else split_args(self.pipeline, args, kwargs)
        values = [check(v) for check, v in zip(self.checkers, values)]
        shapes = tuple(values[i].shape for i in self.array_positions)
        sizes = self._sizes.get(shapes)
        if sizes is None:
            if len(self._sizes) >= 256:  # a caller cycling through many shapes: start afresh
                self._sizes.clear()
            sizes = self._sizes[shapes] = self._prepare(values)
        return values, out, stream, sizes

    def _allocate(self, values: list, out, sizes: "_Sizes") -> None:
        """Appends the outputs (allocated, or out=) and the intermediates to `values`."""
        empty = self.backend.empty
        if out is None:
            values += [empty(shape, dtype) for shape, dtype in sizes.outputs]
        else:
            values += self._given_outputs(out, sizes)
        if self.inout or out is not None:
            self._check_aliasing(values)
        values += [empty(shape, dtype) for shape, dtype in sizes.temps]

    def _launch_all(self, values: list, sizes: "_Sizes", stream, launched: list | None = None) -> None:
        """Every launch, in order; `launched` collects (kernel index, arguments, vector) of each."""
        counts = {}
        for name, position in self.counts.items():  # checked before anything launches
            counts[name] = values[position]
            if counts[name] < 0:
                raise ArgumentError(f"repeat count '{name}' is negative ({counts[name]})")
        for step in self.steps:
            if isinstance(step, RepeatSteps):
                for _ in range(step.count if isinstance(step.count, int) else counts[step.count]):
                    for k in step.kernels:
                        self._launch(k, values, sizes, stream, counts, launched)
            else:
                self._launch(step, values, sizes, stream, counts, launched)

    def _launch(self, index: int, values: list, sizes: "_Sizes", stream, counts: dict,
                launched: list | None) -> None:
        (kernel, params, alignment, coordinates), (n, extents) = self.launches[index], sizes.kernels[index]
        if n == 0:
            return
        launch_args = [values[key] if kind in ("array", "scalar") else n if kind == "numel"
                       else (key if isinstance(key, int) else counts[key]) if kind == "count" else extents[key]
                       for kind, key in params]
        # The 16-byte variant where every vector access is aligned (and, with
        # broadcasts, rows hold whole vectors); else one element per thread.
        pointer = self.backend.pointer
        vector = all(pointer(values[i]) % size == 0 for i, size in alignment) and \
            (not coordinates or extents[-1] % kernel.vector == 0)
        self.backend.launch(kernel, n, launch_args, stream, vector)
        if launched is not None:
            launched.append((index, launch_args, vector))

    def _result(self, values: list):
        first = len(self.params)
        return as_result(values[first:first + len(self.pipeline.outputs)])

    def _prepare(self, values: list) -> "_Sizes":
        dims = bind_dims(self.pipeline, {self.params[i].name: values[i].shape for i in self.array_positions})
        outputs = [(concrete(o.shape, dims), numpy_dtype(o.type)) for o in self.pipeline.outputs]
        temps = [(concrete(b.shape, dims), numpy_dtype(b.type)) for b in self.temps]
        kernels = []
        for kernel, *_ in self.launches:
            extents = [math.prod(size_of(d, dims) for d in e) for e in kernel.extents]
            kernels.append((math.prod(size_of(d, dims) for d in kernel.shape), extents))
        return _Sizes(outputs, temps, kernels)

    def _given_outputs(self, out, sizes: "_Sizes") -> list:
        """The caller's `out=` arrays (one, or a tuple), checked."""
        outputs = self.pipeline.outputs
        given = out if isinstance(out, (tuple, list)) else (out,)
        if len(given) != len(outputs):
            raise ArgumentError(f"out= takes {len(outputs)} array{'s' if len(outputs) != 1 else ''} "
                                f"({', '.join(o.name for o in outputs)}), got {len(given)}")
        result = []
        for o, array, (want, _) in zip(outputs, given, sizes.outputs):
            array = self.backend.check_array(o, array)
            if tuple(array.shape) != want:
                raise ArgumentError(f"output '{o.name}': out= array has shape {tuple(array.shape)}, expected {want}")
            result.append(array)
        return result

    def _check_aliasing(self, values: list) -> None:
        """A written array (inout or output) may share no memory with another array argument."""
        arrays = [(self.slot_names[i], self.roles[i], self.backend.span(v)) for i, v in enumerate(values)
                  if self.roles[i] != "scalar"]
        for i, (a, role_a, (a0, a1)) in enumerate(arrays):
            for b, role_b, (b0, b1) in arrays[i + 1:]:
                if role_a == "in" and role_b == "in":
                    continue  # two inputs may share memory: both are only read
                if a0 < b1 and b0 < a1:
                    raise ArgumentError(f"'{a}' and '{b}' share memory, but '{a if role_a != 'in' else b}' "
                                        "is written: pass separate arrays")


def as_result(outputs: list):
    """A call's return value: its one output, a tuple of several, or None."""
    return outputs[0] if len(outputs) == 1 else tuple(outputs) if outputs else None


class _Sizes:
    """What one shape signature fixes: output and intermediate shapes, and each kernel's sizes."""

    __slots__ = ("outputs", "temps", "kernels")

    def __init__(self, outputs, temps, kernels):
        self.outputs, self.temps, self.kernels = outputs, temps, kernels


class _Call:
    """A plain call seen twice, replayed for calls with its key (`Executor._call_key`):
    every check that depends on the arrays was made then, and each launch is
    fixed but for the scalars and the new outputs and intermediates. Input
    arrays are held by address only, so nothing is kept alive."""

    MISALIGNED = object()  # run()'s answer when a new output misses the alignment the launches assume

    def __init__(self, executor: Executor, values: list, sizes: _Sizes, launched: list, foreign: bool):
        backend, first = executor.backend, len(executor.params)
        self.empty, self.pointer = backend.empty, backend.pointer
        self.hand_off = backend.hand_off if foreign else None
        self.allocations = list(sizes.outputs) + list(sizes.temps)
        self.n_outputs = len(sizes.outputs)
        self.scalars = [(i, check) for i, (check, is_array) in enumerate(zip(executor.checkers, executor._is_array))
                        if not is_array]
        scalar_index = {i: j for j, (i, _) in enumerate(self.scalars)}  # parameter position -> index in scalars
        self.alignment: set[tuple[int, int]] = set()
        self.launches = []
        for index, args, vector in launched:
            kernel, params, alignment, _ = executor.launches[index]
            converters, fire = backend.prepare_launch(kernel, sizes.kernels[index][0], vector)
            template, new, scalars = [], [], []
            for at, ((kind, key), convert, value) in enumerate(zip(params, converters, args)):
                if kind == "array" and key >= first:  # an output or intermediate: new each call
                    new.append((at, key - first))
                    value = None
                elif kind == "array":
                    value = backend.address(backend.pointer(value))
                elif kind == "scalar":
                    scalars.append((at, scalar_index[key], convert))
                elif convert is not None:
                    value = convert(value)
                template.append(value)
            if vector:
                self.alignment |= {(i - first, size) for i, size in alignment if i >= first}
            self.launches.append((template, new, scalars, fire))

    def run(self, args: tuple):
        new = [self.empty(shape, dtype) for shape, dtype in self.allocations]
        for k, size in self.alignment:
            if self.pointer(new[k]) % size:
                return self.MISALIGNED
        scalars = [check(args[i]) for i, check in self.scalars]
        if self.hand_off is not None:
            self.hand_off()
        for template, outputs, scalar_args, fire in self.launches:
            launch_args = template.copy()
            for at, k in outputs:
                launch_args[at] = new[k]
            for at, j, convert in scalar_args:
                launch_args[at] = scalars[j] if convert is None else convert(scalars[j])
            fire(launch_args)
        return as_result(new[:self.n_outputs])
