"""What each operation of the op table costs on the GPU, per element, in fusec's own emitted code.

    PYTHONPATH=. python3 benchmarks/op_costs.py [--json OUT.json]

For each op and float type, a pipeline sums K = 32 independent applications
of the op to affine copies of its input (`op(x * c_k + d)`, each argument in
the op's domain), and a twin sums the affine copies alone. Both run at 2^24
elements (compute-bound: well past the copy time); the difference over N * K
is the op's cost in device-nanoseconds per element (the whole GPU busy), and
its throughput in ops per ns. The results feed the cost model's op table
(fusec/target_data/sm_90.json).
"""
from __future__ import annotations

import json
import sys

import cupy as cp
import numpy as np

import fusec
from fusec.bench.harness import time_gpu

K = 32
N = 2 ** 24

# op -> (argument domain: "signed" (|v| <= 0.75) or "positive" (0.75..2.25), how to apply it to v)
UNARY = {name: ("signed", f"{name}({{v}})") for name in
         "sin cos tan asin acos atan sinh cosh tanh sigmoid erf exp exp2 expm1 floor ceil round trunc abs".split()}
UNARY |= {name: ("positive", f"{name}({{v}})") for name in "sqrt rsqrt cbrt log log2 log10 log1p".split()}
BINARY = {
    "add": ("signed", "{v} + {w}"), "mul": ("signed", "{v} * {w}"), "div": ("signed", "{v} / ({w} + 2.0)"),
    "mod": ("positive", "{v} % {w}"), "min": ("signed", "min({v}, {w})"), "max": ("signed", "max({v}, {w})"),
    "pow": ("positive", "pow({v}, {w})"), "atan2": ("signed", "atan2({v}, {w})"),
    "fma": ("signed", "fma({v}, {w}, 0.25)"),
}


def chain(op: str, dtype: str, identity: bool) -> str:
    domain, form = {**UNARY, **BINARY}[op]
    terms = []
    for k in range(K):
        c = 1 + k / 64
        v = f"x * {c!r}" if domain == "signed" else f"x * {c!r} + 1.5"
        w = f"x * {(1 + (k + 7) / 64)!r} + {0.5 if domain == 'signed' else 1.0}"
        terms.append(f"({v})" if identity else form.format(v=f"({v})", w=f"({w})"))
    return f"pipeline chain(x: {dtype}[n]) -> (y: {dtype}[n]) {{\n    y = {' + '.join(terms)};\n}}\n"


def measure(op: str, dtype: str) -> dict:
    np_dtype = np.float32 if dtype == "f32" else np.float64
    x = cp.asarray((np.random.default_rng(0).random(N) - 0.5).astype(np_dtype))
    times = {}
    for identity in (False, True):
        f = fusec.jit(chain(op, dtype, identity), backend="cuda")
        y = f(x)
        assert bool(cp.isfinite(y).all()), f"{op} {dtype}: non-finite results (arguments out of its domain)"
        times[identity] = time_gpu(cp, lambda: f(x))
    per_op_ns = (times[False] - times[True]) * 1e3 / (N * K)
    return {"op": op, "dtype": dtype, "us": times[False], "baseline_us": times[True],
            "ns_per_element": max(per_op_ns, 0.0), "ops_per_ns": (1 / per_op_ns) if per_op_ns > 0 else None}


def main() -> None:
    rows = []
    for dtype in ("f32", "f64"):
        for op in list(BINARY) + list(UNARY):
            rows.append(measure(op, dtype))
            r = rows[-1]
            print(f"| {op} | {dtype} | {r['us']:.1f} | {r['baseline_us']:.1f} | {r['ns_per_element'] * 1e3:.3f} |",
                  flush=True)
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as out:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "N": N, "K": K,
                       "rows": rows}, out, indent=1)


if __name__ == "__main__":
    print(f"| op | type | µs ({K} ops/element) | µs (affine only) | ps per op-element |\n|---|---|---|---|---|")
    main()
