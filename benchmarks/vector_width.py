"""How many elements a thread of the vector variant should take: fusec sizes the
vector by the widest array (16 bytes of it); this times wider vectors (32 and 64
bytes of the widest array, so the narrow arrays of quantize and mixed-precision
pipelines move 8 or 16 bytes) against the float4 copy of the same bytes.
Run: PYTHONPATH=. python3 benchmarks/vector_width.py"""
import cupy as cp
import fusec.passes.build_kernel as kernel_pass
import numpy as np

from fusec.bench.harness import Bench, dims_for, make_args, retype, time_gpu
from fusec.frontend import load

CASES = [("quantize", "f32"), ("scale_bias_relu", "f32"), ("adam", "f32"), ("bf16_swiglu", "bf16"),
         ("bias_gelu", "f16")]
print("| pipeline | dtype | elements | vector bytes | elements a thread | µs/call | % of copy |\n|---|---|---|---|---|---|---|")
for vector_bytes in (16, 32, 64):
    kernel_pass.VECTOR_BYTES = vector_bytes
    for stem, dtype in CASES:
        path = f"examples/{stem}.fz"
        program = load(path) if dtype == "as written" else retype(open(path).read(), dtype, stem)
        name = program.pipelines[0].name
        bench = Bench(program, name, dtype)
        bench.check(2 ** 16 + 3)
        width = bench.fused.compiled.plan.kernels[0].vector
        for size in (2 ** 26, 2 ** 28):
            dims = dims_for(bench.pipeline, size)
            args = make_args(cp, bench.pipeline, dims, seed=1)
            words = max(1, bench.minimum_bytes(dims) // 32)
            src, dst = cp.ones(words * 4, cp.float32), cp.empty(words * 4, cp.float32)
            copy = time_gpu(cp, lambda: bench.copy((-(-words // 256),), (256,), (src, dst, np.int64(words))))
            us = time_gpu(cp, lambda: bench.fused(*args))
            print(f"| {name} | {dtype} | 2^{size.bit_length() - 1} | {vector_bytes} | {width} | {us:.1f} | "
                  f"{100 * copy / us:.1f} |")
