"""Running a compiled module, whatever executes the kernels.

A backend supplies the array module, a way to allocate, and a way to launch
one kernel; `Executor` binds the call's arguments, allocates outputs and
intermediate buffers, and launches the kernels in order.
"""
from __future__ import annotations

import math
from typing import Protocol

from ..bind import bind_dims, check_scalar, concrete, numpy_dtype, size_of, split_args
from ..compiler import Compiled
from ..ir import Slot
from ..plan import Kernel, kernel_params

# Threads per block: 256 is the usual choice for memory-bound elementwise
# kernels (8 warps; 8 blocks fill an H200 SM's 2,048 threads).
BLOCK_SIZE = 256


class Backend(Protocol):
    def check_array(self, param: Slot, value) -> object:
        """The array for an array parameter, or ArgumentError (kind, dtype, device, layout, writeable)."""
    def empty(self, shape: tuple[int, ...], dtype) -> object: ...
    def launch(self, kernel: Kernel, grid: int, block: int, args: list) -> None: ...


class Executor:
    def __init__(self, compiled: Compiled, backend: Backend):
        self.compiled = compiled
        self.backend = backend
        self.pipeline = compiled.program.pipeline(compiled.plan.pipeline)

    def __call__(self, *args, **kwargs):
        pipeline, plan = self.pipeline, self.compiled.plan
        values = split_args(pipeline, args, kwargs)
        arrays, scalars = {}, {}
        for p, value in zip(pipeline.params, values):
            if p.is_array:
                arrays[p.name] = self.backend.check_array(p, value)
            else:
                scalars[p.name] = check_scalar(p, value)
        dims = bind_dims(pipeline, {name: a.shape for name, a in arrays.items()})
        for out in pipeline.outputs:
            arrays[out.name] = self.backend.empty(concrete(out.shape, dims), numpy_dtype(out.type))
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
            self.backend.launch(kernel, -(-n // BLOCK_SIZE), BLOCK_SIZE, launch_args)
        outputs = tuple(arrays[o.name] for o in pipeline.outputs)
        return outputs[0] if len(outputs) == 1 else outputs if outputs else None
