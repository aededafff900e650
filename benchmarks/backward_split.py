"""The derived backward's fusion on one device call: the cost model's partition
(fuse="auto") against everything fused (fuse="all") and unfused, each predicted
(at the cost model's nominal 2^26 elements) and timed, the results checked against each other first.

    PYTHONPATH=. python3 benchmarks/backward_split.py [--examples rmsnorm,layernorm,softmax]
        [--dtypes f32,bf16] [--elements 2^26] [--length 4096] [--backend sim]

For each example (examples/NAME.fz's first pipeline, retyped) the backward the
cost model chooses (what `fusec compile --grad` prints and fusec.torch_op runs)
is compiled in the three forms; each form's kernels, their predicted µs at the
call's size and the measured µs a call are printed. A check of the model's
decisions where the backward of a row kernel splits (issue 12: bf16 RMSNorm's
backward splits its row_mean, predicted 195 µs against 199 for one row kernel).
"""
from __future__ import annotations

import sys

import numpy as np

import fusec
from fusec.bench.harness import dims_for, make_args, retype
from fusec.frontend.grad import backward_program


def option(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> None:
    backend = option("--backend", "cuda")
    elements = eval(option("--elements", "2^26" if backend == "cuda" else "2^12").replace("^", "**"))
    length = int(option("--length", "4096" if backend == "cuda" else "256"))
    examples = option("--examples", "rmsnorm,layernorm,softmax").split(",")
    dtypes = option("--dtypes", "f32,bf16").split(",")
    if backend == "cuda":
        import cupy as xp

        from fusec.bench.harness import time_gpu
    else:
        xp = np
    print(f"{elements} elements a call, rows of {length}\n")
    print("| backward | type | form | kernels | predicted µs (2^26) | measured µs |\n|---|---|---|---|---|---|")
    for example in examples:
        for dtype in dtypes:
            text = open(f"examples/{example}.fz").read().split("\npipeline ", 2)
            text = text[0] if text[0].startswith("pipeline") else "pipeline " + text[1]
            forward = retype(text, dtype, example)
            grad = backward_program(forward, forward.pipelines[0].name)
            pipeline = grad.pipelines[0]
            dims = dims_for(pipeline, elements, length)
            args = make_args(xp, pipeline, dims, seed=3)
            results = {}
            for form in ("auto", "all", "none"):
                f = fusec.jit(grad.source.text, backend=backend, fuse=form, pipeline=pipeline.name)
                got = f(*args)
                results[form] = [np.asarray(g.get() if hasattr(g, "get") else g, np.float64)
                                 for g in (got if isinstance(got, tuple) else (got,))]
                kernels = f.compiled.interface.kernels
                predicted = sum(k.prediction.us for k in kernels if k.prediction)  # at the nominal 2^26
                us = time_gpu(xp, lambda: f(*args)) if backend == "cuda" else float("nan")
                names = " + ".join(k.name.split("_k", 1)[-1] for k in kernels)
                print(f"| {pipeline.name} | {dtype} | {form} | {len(kernels)}: {names} | {predicted:.1f} | {us:.1f} |",
                      flush=True)
            tolerance = 2e-2 if dtype == "bf16" else 1e-4
            for form in ("all", "none"):
                for a, b in zip(results["auto"], results[form]):
                    np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance, err_msg=f"{example} {dtype} {form}")


if __name__ == "__main__":
    main()
