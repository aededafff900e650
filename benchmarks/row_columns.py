"""Column sums held by the row kernel (RowBlock.chunks) against column sums in kernels of their own.

    PYTHONPATH=. python3 benchmarks/row_columns.py [--elements 2^26] [--lengths 1024,4096,16384]
        [--examples rmsnorm,layernorm] [--dtypes f32,bf16] [--ways apart,block,auto,...] [--backend sim]

For each example's derived backward (`fusec compile --grad`, its first pipeline
retyped to f32 and bf16) and row length: the backward with its weights' column
sums in kernels of their own (passes.lower.ROW_COLUMN_SUMS off, as before the
row kernel could hold them), then with them in the row kernel, each way of
taking a run of rows forced in turn (variants.CHUNK_GROUPS: threads a row, rows
at a time; "block" the last variant, a block a row with its sums in memory),
then the cost model's own choice; every result checked against the first
first, then timed side by side with a 16-byte copy of the minimum traffic
(what `fusec bench` calls the copy). µs and % of the copy.
"""
from __future__ import annotations

import sys

import numpy as np

import fusec
import fusec.passes.lower as lower
import fusec.passes.variants as variants
from fusec.bench.harness import chosen, dims_for, make_args, minimum_bytes
from fusec.frontend import load
from fusec.frontend.grad import backward_source

GROUPS = variants.CHUNK_GROUPS  # the table as fusec has it

def option(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def backward(example: str, dtype: str) -> str:
    """The derived backward of the example's pipeline of `dtype` (its first, retyped)."""
    program = load(f"examples/{example}.fz")
    name = next(p.name for p in program.pipelines
                if any(q.type.name == dtype for q in p.params if q.shape is not None))
    return backward_source(program, name)


def _nvrtc(job) -> None:
    from fusec.runtime.backends.cuda import compile_module
    compile_module(*job, native=True)


def warm(sources: list[str], arch: str) -> None:
    """Every module compiled by NVRTC in processes of their own, into fusec's disk
    cache: the device call's cores, not one, compile them."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_nvrtc, [(source, arch) for source in dict.fromkeys(sources)]))


def settings(chosen_groups) -> None:
    """A way's knobs: the sums apart (None), or the groups the row kernel may take."""
    lower.ROW_COLUMN_SUMS = chosen_groups is not None
    variants.CHUNK_GROUPS = GROUPS if chosen_groups is None else chosen_groups


def main() -> None:
    backend = option("--backend", "cuda")
    elements = eval(option("--elements", "2^26" if backend == "cuda" else "2^12").replace("^", "**"))
    lengths = [int(n) for n in option("--lengths", "1024,4096,16384").split(",")]
    examples = option("--examples", "rmsnorm,layernorm").split(",")
    dtypes = option("--dtypes", "f32,bf16").split(",")
    if backend == "cuda":
        import cupy as xp

        from fusec.bench.harness import time_copy, time_gpu
    else:
        xp = np
    groups = GROUPS
    ways = [("apart", None)] + [(f"r{g}x{r}{'p' if p else ''}", ((g, r, p),)) for g, r, p in groups] + \
        [("block", ()), ("auto", groups)]
    if "--ways" in sys.argv:  # some of them: apart, block, auto, r64x4p, ...
        wanted = option("--ways", "").split(",")
        ways = [w for w in ways if w[0] in wanted]
    print(f"{elements} elements a call\n")
    print("| backward | type | row length | way | µs | % of copy | kernels |\n|---|---|---|---|---|---|---|")
    if backend == "cuda":
        from fusec.compiler import CompileOptions, compile_pipeline
        from fusec.runtime.backends.cuda import device_arch
        sources = []
        for example in examples:
            for dtype in dtypes:
                program = load(backward(example, dtype))
                for way, chosen_groups in ways:
                    settings(chosen_groups)
                    options = CompileOptions(fuse="auto" if way in ("apart", "auto") else "all", arch=device_arch())
                    sources.append(compile_pipeline(program, program.pipelines[0].name, options).cuda)
        settings(groups)
        warm(sources, device_arch())
    for example in examples:
        for dtype in dtypes:
            source = backward(example, dtype)
            pipeline = load(source).pipelines[0]
            compiled = []
            for way, chosen_groups in ways:
                settings(chosen_groups)
                f = fusec.jit(source, backend=backend, fuse="auto" if way in ("apart", "auto") else "all")
                f.compiled  # compiled now, under this way's settings
                compiled.append((way, f))
            settings(groups)
            for length in lengths:
                dims = dims_for(pipeline, elements, length)
                args = make_args(xp, pipeline, dims, seed=3)
                traffic = minimum_bytes(pipeline, dims)
                copy_us = time_copy(xp, traffic) if backend == "cuda" else float("nan")
                want = None
                for way, f in compiled:
                    settings(dict(ways)[way])  # its own, should a first call plan again (the guard)
                    got = [np.asarray(g.get() if hasattr(g, "get") else g, np.float64) for g in f(*args)]
                    if want is None:
                        want = got
                    tolerance = 2e-2 if dtype == "bf16" else 1e-4
                    for g, w in zip(got, want):
                        scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
                        np.testing.assert_allclose(g, w, rtol=tolerance, atol=tolerance * scale,
                                                   err_msg=f"{example} {dtype} {length} {way}")
                    us = time_gpu(xp, lambda: f(*args)) if backend == "cuda" else float("nan")
                    kernel = chosen(f, length)
                    if backend == "cuda":  # what ptxas gave each row kernel taken
                        facts = [f._runner.backend.attributes(name) for name in kernel.split(" ")[0].split("+")]
                        kernel += " (" + ", ".join(f"{a['num_regs']} regs" + (f", {a['spill_bytes']} B spilled"
                                                                               if a.get("spill_bytes") else "")
                                                   for a in facts) + ")"
                    print(f"| {example} | {dtype} | {length} | {way} | {us:.1f} | {100 * copy_us / us:.1f} | "
                          f"{kernel} |", flush=True)
                settings(groups)
    settings(groups)


if __name__ == "__main__":
    main()
