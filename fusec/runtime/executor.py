"""Running a compiled module, whatever executes the kernels.

A backend supplies array checks, allocation and the launch of one kernel;
`Executor` binds the call's arguments, checks every array before anything
launches (dtype, shape, device, layout, aliasing), allocates outputs and
intermediate buffers, and launches the kernels in order.
"""
from __future__ import annotations

import math
from typing import Protocol

from ..bind import bind_dims, concrete, numpy_dtype, scalar_checker, size_of, split_args
from ..compiler import Compiled
from ..errors import ArgumentError
from ..ir import Slot
from ..plan import Kernel, Repeat, kernel_params, needs_coordinates, vector_alignment

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
    once per shape signature and cached. A repeated call then checks its
    arguments, allocates its outputs and launches, and little else.
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
        counts = [s.count for s in self.steps if isinstance(s, Repeat)] + \
            [k.count for k in compiled.plan.kernels if k.count is not None]
        self.counts = {c: position[c] for c in counts if isinstance(c, str)}
        self._sizes: dict[tuple, _Sizes] = {}

    def __call__(self, *args, **kwargs):
        values, out, stream, sizes = self._bind(args, kwargs)
        self._allocate(values, out, sizes)
        self._launch_all(values, sizes, stream)
        return self._result(values)

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

    def _launch_all(self, values: list, sizes: "_Sizes", stream) -> None:
        counts = {}
        for name, position in self.counts.items():  # checked before anything launches
            counts[name] = values[position]
            if counts[name] < 0:
                raise ArgumentError(f"repeat count '{name}' is negative ({counts[name]})")
        for step in self.steps:
            if isinstance(step, Repeat):
                for _ in range(step.count if isinstance(step.count, int) else counts[step.count]):
                    for k in step.kernels:
                        self._launch(k, values, sizes, stream, counts)
            else:
                self._launch(step, values, sizes, stream, counts)

    def _launch(self, index: int, values: list, sizes: "_Sizes", stream, counts: dict) -> None:
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

    def _result(self, values: list):
        first = len(self.params)
        outputs = values[first:first + len(self.pipeline.outputs)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs) if outputs else None

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


class _Sizes:
    """What one shape signature fixes: output and intermediate shapes, and each kernel's sizes."""

    __slots__ = ("outputs", "temps", "kernels")

    def __init__(self, outputs, temps, kernels):
        self.outputs, self.temps, self.kernels = outputs, temps, kernels

