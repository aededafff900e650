"""Launch configuration, by measurement: the seed's chain fused, f32, on the GPU.

Times the scalar variant (one element per thread) and the 16-byte vector
variant (4 floats per thread) at several block sizes, against a 16-byte copy,
with CUDA events (median of 5 loops). Run: PYTHONPATH=. python3 benchmarks/launch_config.py
"""
import cupy as cp
import numpy as np

import fusec
from fusec.bench.harness import time_gpu

f = fusec.jit("examples/scale_bias_relu.fz", backend="cuda")
x = cp.random.standard_normal(2 ** 26, dtype=cp.float32)
f(x, 1.5, -0.25)
backend = f._runner.backend
kernel = f.compiled.plan.kernels[0]
copy = cp.RawKernel(r'''extern "C" __global__ void copy16(const float4* s, float4* d, long long n)
{ long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) d[i] = s[i]; }''', "copy16")
print("| elements | variant | block | µs/call | % of copy |")
print("|---|---|---|---|---|")
for size in (2 ** 20, 2 ** 26, 2 ** 28):
    x = cp.random.standard_normal(size, dtype=cp.float32)
    y = cp.empty_like(x)
    words = size // 4
    limit = time_gpu(cp, lambda: copy(((words + 255) // 256,), (256,), (x, y, np.int64(words))))
    print(f"| 2^{size.bit_length() - 1} | copy float4 | 256 | {limit:.1f} | 100.0 |")
    for name, per_thread in ((kernel.name, 1), (f"{kernel.name}_v{kernel.vector}", kernel.vector)):
        function = backend.kernels[name][0]
        args = (x, y, np.float32(1.5), np.float32(-0.25), np.int64(size))
        for block in (64, 128, 256, 512, 1024):
            grid = ((size // per_thread + block - 1) // block,)
            us = time_gpu(cp, lambda: function(grid, (block,), args))
            print(f"| 2^{size.bit_length() - 1} | {'vector' if per_thread > 1 else 'scalar'} | {block} | {us:.1f} "
                  f"| {100 * limit / us:.1f} |")
