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
from ..plan import Kernel, kernel_params

# Threads per block: 256 is the usual choice for memory-bound elementwise
# kernels (8 warps; 8 blocks fill an H200 SM's 2,048 threads).
BLOCK_SIZE = 256


class Backend(Protocol):
    def check_array(self, param: Slot, value) -> object:
        """The array for an array parameter, or ArgumentError (kind, dtype, device, layout, writeable)."""

    def span(self, array) -> tuple[int, int]:
        """The address range [start, end) an array's elements occupy."""

    def empty(self, shape: tuple[int, ...], dtype) -> object: ...

    def launch(self, kernel: Kernel, n: int, args: list, stream) -> None:
        """Runs `kernel` over n elements (the backend picks the block size)."""

    def stream(self, value) -> object:
        """The backend's stream for a `stream=` argument (None: the current one)."""


class Executor:
    def __init__(self, compiled: Compiled, backend: Backend):
        self.compiled = compiled
        self.backend = backend
        self.pipeline = compiled.program.pipeline(compiled.plan.pipeline)
        names = {p.name for p in self.pipeline.params}
        # `out=` and `stream=` are call options unless the pipeline has a parameter of that name.
        self.options = [o for o in ("out", "stream") if o not in names]

    def __call__(self, *args, **kwargs):
        pipeline, plan = self.pipeline, self.compiled.plan
        out = kwargs.pop("out", None) if "out" in self.options else None
        stream = self.backend.stream(kwargs.pop("stream", None) if "stream" in self.options else None)
        values = split_args(pipeline, args, kwargs)
        arrays, scalars = {}, {}
        for p, value in zip(pipeline.params, values):
            if p.is_array:
                arrays[p.name] = self.backend.check_array(p, value)
            else:
                scalars[p.name] = check_scalar(p, value)
        dims = bind_dims(pipeline, {name: a.shape for name, a in arrays.items()})
        arrays.update(self._outputs(out, dims))
        self._check_aliasing(arrays)
        for buf in plan.buffers:
            if buf.name not in arrays:
                arrays[buf.name] = self.backend.empty(concrete(buf.shape, dims), numpy_dtype(buf.type))
        for kernel in plan.kernels:
            n = math.prod(size_of(d, dims) for d in kernel.shape)
            if n == 0:
                continue
            launch_args = []
            for param in kernel_params(kernel):
                if param.kind == "array":
                    launch_args.append(arrays[param.key])
                elif param.kind == "scalar":
                    launch_args.append(scalars[param.key])
                elif param.kind == "numel":
                    launch_args.append(n)
                else:
                    launch_args.append(math.prod(size_of(d, dims) for d in kernel.extents[param.key]))
            self.backend.launch(kernel, n, launch_args, stream)
        outputs = tuple(arrays[o.name] for o in pipeline.outputs)
        return outputs[0] if len(outputs) == 1 else outputs if outputs else None

    def _outputs(self, out, dims) -> dict:
        """Output arrays: allocated, or the caller's `out=` (one array, or a tuple)."""
        outputs = self.pipeline.outputs
        if out is None:
            return {o.name: self.backend.empty(concrete(o.shape, dims), numpy_dtype(o.type)) for o in outputs}
        given = out if isinstance(out, (tuple, list)) else (out,)
        if len(given) != len(outputs):
            raise ArgumentError(f"out= takes {len(outputs)} array{'s' if len(outputs) != 1 else ''} "
                                f"({', '.join(o.name for o in outputs)}), got {len(given)}")
        result = {}
        for o, array in zip(outputs, given):
            array = self.backend.check_array(o, array)
            want = concrete(o.shape, dims)
            if tuple(array.shape) != want:
                raise ArgumentError(f"output '{o.name}': out= array has shape {tuple(array.shape)}, expected {want}")
            result[o.name] = array
        return result

    def _check_aliasing(self, arrays: dict) -> None:
        """A written array (inout or output) may share no memory with another array argument."""
        roles = {p.name: p.role for p in self.pipeline.params} | {o.name: "out" for o in self.pipeline.outputs}
        spans = {name: self.backend.span(a) for name, a in arrays.items()}
        names = list(arrays)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if roles[a] not in ("inout", "out") and roles[b] not in ("inout", "out"):
                    continue  # two inputs may share memory: both are only read
                (a0, a1), (b0, b1) = spans[a], spans[b]
                if a0 < b1 and b0 < a1:
                    raise ArgumentError(f"'{a}' and '{b}' share memory, but '{a if roles[a] != 'in' else b}' "
                                        "is written: pass separate arrays")
