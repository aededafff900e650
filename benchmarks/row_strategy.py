"""Which row strategy at which row length: the measurement behind target.WARP_ROW_MAX.

    PYTHONPATH=. python3 benchmarks/row_strategy.py [--elements 2^26] [--backend cuda|sim]

For softmax and RMSNorm (examples/), f32 and bf16, at each row length from 128 to
16384: the warp-per-row and the block-per-row kernels (each forced), 16-byte
vectors where the length allows, results checked against the reference first;
µs and TB/s of the minimum traffic. WARP_ROW_MAX should be the longest row at
which the warp kernel is still the faster. With --backend sim (a small size) it
only checks that every forced kernel runs and agrees.
"""
from __future__ import annotations

import sys

import numpy as np

import fusec
import fusec.passes.variants as variants
from fusec.bench.harness import dims_for, make_args, minimum_bytes, retype

LENGTHS = [128, 256, 512, 1024, 2048, 4096, 16384]
FORCED = {"warp": 1 << 62, "block": -1}


def main() -> None:
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "cuda"
    elements = eval(sys.argv[sys.argv.index("--elements") + 1].replace("^", "**")) if "--elements" in sys.argv \
        else (2 ** 26 if backend == "cuda" else 2 ** 14)
    if backend == "cuda":
        import cupy as xp

        from fusec.bench.harness import time_gpu
    else:
        xp = np
    print("| example | type | row length | warp µs (TB/s) | block µs (TB/s) | faster |\n|---|---|---|---|---|---|")
    for example in ("softmax", "rmsnorm"):
        text = open(f"examples/{example}.fz").read().split("\npipeline ", 2)
        text = text[0] if text[0].startswith("pipeline") else "pipeline " + text[1]
        for dtype in ("f32", "bf16"):
            program = retype(text, dtype, example)
            pipeline = program.pipelines[0]
            for length in LENGTHS:
                if length > elements:
                    continue
                dims = dims_for(pipeline, elements, length)
                args = make_args(xp, pipeline, dims, seed=1)
                want = fusec.jit(program.source.text, backend="numpy")(
                    *[a.get() if hasattr(a, "get") else a for a in args])
                times = {}
                for name, limit in FORCED.items():
                    variants.WARP_ROW_MAX = limit
                    f = fusec.jit(program.source.text, backend=backend)
                    got = f(*args)
                    launched = getattr(f._runner.backend, "launched", None)
                    assert launched is None or ("_warp" in launched[-1]) == (name == "warp"), launched
                    got = got.get() if hasattr(got, "get") else got
                    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                                               rtol=2e-2 if dtype == "bf16" else 1e-5, atol=1e-5)
                    times[name] = time_gpu(xp, lambda: f(*args)) if backend == "cuda" else float("nan")
                tb = {k: minimum_bytes(pipeline, dims) / (us * 1e-6) / 1e12 for k, us in times.items()}
                faster = min(times, key=times.get) if backend == "cuda" else "-"
                print(f"| {example} | {dtype} | {length} | {times['warp']:.1f} ({tb['warp']:.2f}) | "
                      f"{times['block']:.1f} ({tb['block']:.2f}) | {faster} |", flush=True)


if __name__ == "__main__":
    main()
