"""Fast math on the device: each compute-bound pipeline accurate and with fast_math=True,
beside a copy of the same traffic, at 2^26 elements; results checked first.

    PYTHONPATH=. python3 benchmarks/fast_math.py

Pipelines: a chain of ten f32 functions (the fusion-decision issue's probe), the
transcendental example, and the GELU forms (tanh and erf) in f32 and bf16. Prints
µs, % of the copy, and the largest difference from the accurate result.
"""
from __future__ import annotations

import fusec
from fusec.bench.harness import time_gpu

N = 2 ** 26
CHAIN = """pipeline chain(x: f32[n]) -> (y: f32[n]) {
    a = sin(x) + cos(x * 0.5);
    b = exp(a * 0.25) * log(abs(a) + 1.5);
    c = tanh(b) + sigmoid(a - b);
    d = exp2(c * 0.5) + log2(abs(c) + 1.25);
    y = sin(d) * cos(c) + exp(-abs(d));
}
"""
GELU_TANH = "pipeline g(x: {t}[n]) -> (y: {t}[n]) {{\n    y = 0.5 * x * (1.0 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));\n}}\n"
GELU_ERF = "pipeline g(x: {t}[n]) -> (y: {t}[n]) {{\n    y = 0.5 * x * (1.0 + erf(x * 0.7071067811865476));\n}}\n"


def main() -> None:
    import cupy as cp
    cases = [("chain of ten (f32)", CHAIN, "f32"), ("transcendental_chain (f32)", "examples/transcendental_chain.fz", "f32")]
    for t in ("f32", "bf16"):
        cases += [(f"GELU tanh ({t})", GELU_TANH.format(t=t), t), (f"GELU erf ({t})", GELU_ERF.format(t=t), t)]
    print("| pipeline | copy µs | accurate µs (% of copy) | fast math µs (% of copy) | largest difference |")
    print("|---|---|---|---|---|")
    for name, source, dtype in cases:
        accurate, fast = fusec.jit(source), fusec.jit(source, fast_math=True)
        (param,) = accurate.compiled.program.pipelines[0].params
        x = cp.random.default_rng(1).standard_normal(N, dtype=cp.float32).astype(param.type.numpy_dtype)
        a, f = accurate(x), fast(x)
        diff = float(cp.max(cp.abs(a.astype(cp.float32) - f.astype(cp.float32))))
        out = cp.empty_like(a)
        copy = time_gpu(cp, lambda: cp.copyto(out, x))
        ta, tf = time_gpu(cp, lambda: accurate(x)), time_gpu(cp, lambda: fast(x))
        print(f"| {name} | {copy:.1f} | {ta:.1f} ({100 * copy / ta:.0f} %) | {tf:.1f} ({100 * copy / tf:.0f} %) | "
              f"{diff:.2g} |", flush=True)


if __name__ == "__main__":
    main()
