"""Which row strategy at which row length: the measurement behind target.WARP_ROW_BYTES and RESIDENT_*.

    PYTHONPATH=. python3 benchmarks/row_strategy.py [--elements 2^26] [--backend cuda|sim]

For softmax and RMSNorm (examples/), f32 and bf16, at each row length from 128 to
16384: each strategy forced (a warp per row, a block per row with the shared
memory cache, and each with the row held in registers where its vectors hold
it) and the runtime's own choice, 16-byte vectors where the length allows,
results checked against the reference first; µs and TB/s of the minimum
traffic. With --backend sim (a small size) it only checks that every forced
kernel runs and agrees.
"""
from __future__ import annotations

import re
import sys

import numpy as np

import fusec
import fusec.passes.variants as variants
from fusec.bench.harness import dims_for, make_args, minimum_bytes, retype

LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
STRATEGIES = {  # name: (ROW_STRATEGIES, WARP_ROW_BYTES, RESIDENT_THREADS)
    "warp": (("warp", "block"), 1 << 62, ()),
    "block": (("block",), -1, ()),
    "warp-resident": (("resident", "block"), -1, (32,)),
    "block-resident": (("resident", "block"), -1, tuple(t for t in variants.RESIDENT_THREADS if t > 32)),
    "auto": (variants.ROW_STRATEGIES, variants.WARP_ROW_BYTES, variants.RESIDENT_THREADS),
    "auto32": (variants.ROW_STRATEGIES, variants.WARP_ROW_BYTES, variants.RESIDENT_THREADS),  # 32 elements a thread
}
ELEMENTS = variants.RESIDENT_ELEMENTS


def force(name: str) -> None:
    variants.ROW_STRATEGIES, variants.WARP_ROW_BYTES, variants.RESIDENT_THREADS = STRATEGIES[name]
    variants.RESIDENT_ELEMENTS = 2 * ELEMENTS if name == "auto32" else ELEMENTS


def main() -> None:
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "cuda"
    elements = eval(sys.argv[sys.argv.index("--elements") + 1].replace("^", "**")) if "--elements" in sys.argv \
        else (2 ** 26 if backend == "cuda" else 2 ** 14)
    if backend == "cuda":
        import cupy as xp

        from fusec.bench.harness import time_gpu
    else:
        xp = np
    names = sys.argv[sys.argv.index("--strategies") + 1].split(",") if "--strategies" in sys.argv else list(STRATEGIES)
    examples = sys.argv[sys.argv.index("--examples") + 1].split(",") if "--examples" in sys.argv else ["softmax", "rmsnorm"]
    print("| example | type | row length | " + " | ".join(f"{n} µs (TB/s)" for n in names)
          + " | auto's kernel | fastest |\n|" + "---|" * (len(names) + 5))
    for example in examples:
        text = open(f"examples/{example}.fz").read().split("\npipeline ", 2)
        text = text[0] if text[0].startswith("pipeline") else "pipeline " + text[1]
        for dtype in (sys.argv[sys.argv.index("--dtypes") + 1].split(",") if "--dtypes" in sys.argv else ("f32", "bf16")):
            program = retype(text, dtype, example)
            pipeline = program.pipelines[0]
            for length in LENGTHS:
                if length > elements:
                    continue
                dims = dims_for(pipeline, elements, length)
                args = make_args(xp, pipeline, dims, seed=1)
                want = fusec.jit(program.source.text, backend="numpy")(
                    *[a.get() if hasattr(a, "get") else a for a in args])
                times, kernels = {}, {}
                for name in names:
                    force(name)
                    f = fusec.jit(program.source.text, backend=backend)
                    got = f(*args)
                    kernels[name] = _chosen(f, length)
                    for g, w in zip(*(v if isinstance(v, tuple) else (v,) for v in (got, want))):
                        g = g.get() if hasattr(g, "get") else g
                        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                                   rtol=2e-2 if dtype == "bf16" else 1e-5, atol=2e-2 if dtype == "bf16" else 1e-5)
                    times[name] = time_gpu(xp, lambda: f(*args)) if backend == "cuda" else float("nan")
                tb = {k: minimum_bytes(pipeline, dims) / (us * 1e-6) / 1e12 for k, us in times.items()}
                fastest = min(times, key=times.get) if backend == "cuda" else "-"
                cells = " | ".join(f"{times[n]:.1f} ({tb[n]:.2f})" for n in names)
                print(f"| {example} | {dtype} | {length} | {cells} | {kernels.get('auto', '-')} | {fastest} |", flush=True)
                for name in (n for n in names if n != "auto"):  # a forced strategy that could not serve this length
                    if ("resident" in name) != bool(re.search(r"_r\d+_", kernels[name])):
                        print(f"  ({name}: fell back to {kernels[name]})")


def _chosen(f, length: int) -> str:
    """The variant of the row kernel the runtime takes for rows of `length` (arrays aligned)."""
    (launch,) = [k for k in f.compiled.interface.kernels if k.variants[0].max_row is not None][:1] or \
        f.compiled.interface.kernels[:1]
    return next((v.name for v in launch.variants if v.takes_rows(length)), "?")


if __name__ == "__main__":
    main()
