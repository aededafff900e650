"""Running a compiled module, whatever executes the kernels.

A backend supplies array checks, allocation and the launch of one kernel;
`Executor` binds the call's arguments, checks every array before anything
launches (dtype, shape, device, layout, aliasing), allocates outputs and
intermediate buffers, and launches the kernels in order.
"""
from __future__ import annotations

import math
from typing import Protocol

from ..bind import bind_dims, check_scalar, concrete, numpy_dtype, size_of, split_args
from ..compiler import Compiled
from ..errors import ArgumentError
from ..ir import Slot
from ..plan import Kernel, kernel_params, needs_coordinates, vector_alignment

# Threads per block: 256 is the usual choice for memory-bound elementwise
# kernels (8 warps; 8 blocks fill an H200 SM's 2,048 threads).
BLOCK_SIZE = 256


class Backend(Protocol):
    def check_array(self, param: Slot, value) -> object:
        """The array for an array parameter, or ArgumentError (kind, dtype, device, layout, writeable)."""

    def span(self, array) -> tuple[int, int]:
        """The address range [start, end) an array's elements occupy."""

    def empty(self, shape: tuple[int, ...], dtype) -> object: ...

    def launch(self, kernel: Kernel, n: int, args: list, stream, vector: bool) -> None:
        """Runs `kernel` (its vector variant if `vector`) over n elements; the backend picks the block size."""

    def stream(self, value) -> object:
        """The backend's stream for a `stream=` argument (None: the current one)."""


class Executor:
    """Calls a compiled pipeline. What depends only on the pipeline is prepared
    once; what depends on the arguments' shapes is prepared once per shape
    signature and cached, so a repeated call does little more than check its
    arguments and launch."""

    def __init__(self, compiled: Compiled, backend: Backend):
        self.compiled = compiled
        self.backend = backend
        self.pipeline = compiled.program.pipeline(compiled.plan.pipeline)
        names = {p.name for p in self.pipeline.params}
        # `out=` and `stream=` are call options unless the pipeline has a parameter of that name.
        self.options = [o for o in ("out", "stream") if o not in names]
        self.params = self.pipeline.params
        self.roles = {p.name: p.role for p in self.params} | {o.name: "out" for o in self.pipeline.outputs}
        self.launches = [(k, [(p.kind, p.key) for p in kernel_params(k)], vector_alignment(k),
                          needs_coordinates(k)) for k in compiled.plan.kernels]
        self.allocated = [b for b in compiled.plan.buffers if b.name not in names
                          and b.name not in {o.name for o in self.pipeline.outputs}]
        self._sizes: dict[tuple, _Sizes] = {}

    def __call__(self, *args, **kwargs):
        out = stream = None
        if kwargs:
            out = kwargs.pop("out", None) if "out" in self.options else None
            stream = self.backend.stream(kwargs.pop("stream", None) if "stream" in self.options else None)
        values = args if not kwargs and len(args) == len(self.params) else split_args(self.pipeline, args, kwargs)
        arrays, scalars = {}, {}
        for p, value in zip(self.params, values):
            if p.shape is not None:
                arrays[p.name] = self.backend.check_array(p, value)
            else:
                scalars[p.name] = check_scalar(p, value)
        shapes = tuple(a.shape for a in arrays.values())
        sizes = self._sizes.get(shapes)
        if sizes is None:
            if len(self._sizes) >= 256:  # a caller cycling through many shapes: start afresh
                self._sizes.clear()
            sizes = self._sizes[shapes] = self._prepare(arrays)
        arrays.update(self._outputs(out, sizes))
        spans = {name: self.backend.span(a) for name, a in arrays.items()}
        self._check_aliasing(spans)
        for buf, shape, dtype in sizes.allocations:  # intermediates that cross kernels
            arrays[buf] = self.backend.empty(shape, dtype)
            spans[buf] = self.backend.span(arrays[buf])
        for (kernel, params, alignment, coordinates), (n, extents) in zip(self.launches, sizes.kernels):
            if n == 0:
                continue
            launch_args = []
            for kind, key in params:
                if kind == "array":
                    launch_args.append(arrays[key])
                elif kind == "scalar":
                    launch_args.append(scalars[key])
                else:
                    launch_args.append(n if kind == "numel" else extents[key])
            # The 16-byte variant where every vector access is aligned (and, with
            # broadcasts, rows hold whole vectors); else one element per thread.
            vector = all(spans[buf][0] % size == 0 for buf, size in alignment) and \
                (not coordinates or extents[-1] % kernel.vector == 0)
            self.backend.launch(kernel, n, launch_args, stream, vector)
        outputs = tuple(arrays[o.name] for o in self.pipeline.outputs)
        return outputs[0] if len(outputs) == 1 else outputs if outputs else None

    def _prepare(self, arrays: dict) -> "_Sizes":
        dims = bind_dims(self.pipeline, {name: a.shape for name, a in arrays.items()})
        outputs = [(o.name, concrete(o.shape, dims), numpy_dtype(o.type)) for o in self.pipeline.outputs]
        allocations = [(b.name, concrete(b.shape, dims), numpy_dtype(b.type)) for b in self.allocated]
        kernels = []
        for kernel, *_ in self.launches:
            extents = [math.prod(size_of(d, dims) for d in e) for e in kernel.extents]
            kernels.append((math.prod(size_of(d, dims) for d in kernel.shape), extents))
        return _Sizes(outputs, allocations, kernels)

    def _outputs(self, out, sizes: "_Sizes") -> dict:
        """Output arrays: allocated, or the caller's `out=` (one array, or a tuple)."""
        if out is None:
            return {name: self.backend.empty(shape, dtype) for name, shape, dtype in sizes.outputs}
        outputs = self.pipeline.outputs
        given = out if isinstance(out, (tuple, list)) else (out,)
        if len(given) != len(outputs):
            raise ArgumentError(f"out= takes {len(outputs)} array{'s' if len(outputs) != 1 else ''} "
                                f"({', '.join(o.name for o in outputs)}), got {len(given)}")
        result = {}
        for o, array, (_, want, _) in zip(outputs, given, sizes.outputs):
            array = self.backend.check_array(o, array)
            if tuple(array.shape) != want:
                raise ArgumentError(f"output '{o.name}': out= array has shape {tuple(array.shape)}, expected {want}")
            result[o.name] = array
        return result

    def _check_aliasing(self, spans: dict) -> None:
        """A written array (inout or output) may share no memory with another array argument."""
        roles = self.roles
        names = list(spans)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if roles[a] == "in" and roles[b] == "in":
                    continue  # two inputs may share memory: both are only read
                (a0, a1), (b0, b1) = spans[a], spans[b]
                if a0 < b1 and b0 < a1:
                    raise ArgumentError(f"'{a}' and '{b}' share memory, but '{a if roles[a] != 'in' else b}' "
                                        "is written: pass separate arrays")


class _Sizes:
    """What one shape signature fixes: output and temporary shapes, and each kernel's sizes."""

    __slots__ = ("outputs", "allocations", "kernels")

    def __init__(self, outputs, allocations, kernels):
        self.outputs, self.allocations, self.kernels = outputs, allocations, kernels
