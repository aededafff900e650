"""The row reductions' table on one device call: fusec against the copy of the same traffic.

    PYTHONPATH=. python3 benchmarks/rows_table.py [--elements 2^26] [--lengths 1024,4096,...]
        [--examples softmax,log_softmax,rmsnorm,layernorm,add_rmsnorm,cross_entropy] [--backend sim]
        [--cluster-threads 512,1024] [--cluster-elements 32] [--resident-threads 8,16,...,256] [--dtypes f32,bf16]
        [--cluster-form resident|streaming]

For each example (examples/, its first pipeline retyped to f32 and bf16) and row
length: the result checked against the NumPy reference first (on at most 2^20
elements: a few rows of the same length), then fusec (the runtime's own choice of
row kernel, named) and a 16-byte copy of the pipeline's minimum traffic (as `fusec bench` times it), timed
side by side at `--elements`; µs, TB/s and % of the copy. Peers (torch eager,
torch.compile, Liger) are `fusec bench`'s; this script leaves them out so that
the whole table fits one device command.
"""
from __future__ import annotations

import re
import sys

import numpy as np

import fusec
from fusec.bench.harness import chosen, dims_for, make_args, minimum_bytes, retype

EXAMPLES = ["softmax", "log_softmax", "rmsnorm", "layernorm", "add_rmsnorm", "cross_entropy"]
LENGTHS = [256, 1024, 4096, 16384, 65536, 262144]
CHECK_ELEMENTS = 2 ** 20


def option(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def first_pipeline(example: str, dtype: str):
    text = open(f"examples/{example}.fz").read().split("\npipeline ", 2)
    text = text[0] if text[0].startswith("pipeline") else "pipeline " + text[1]
    return retype(text, dtype, example)


def labels_in_range(args, pipeline, xp):
    """cross-entropy's labels inside the vocabulary (one row's ignored)."""
    names = [p.name for p in pipeline.params]
    if "label" in names:
        vocab = args[0].shape[-1]
        label = xp.asarray(np.random.default_rng(1).integers(0, vocab, args[names.index("label")].shape))
        label[0, 0] = -100
        args[names.index("label")] = label.astype(args[names.index("label")].dtype)
    return args


def main() -> None:
    backend = option("--backend", "cuda")
    elements = eval(option("--elements", "2^26" if backend == "cuda" else "2^14").replace("^", "**"))
    lengths = [int(n) for n in option("--lengths", ",".join(map(str, LENGTHS))).split(",")]
    examples = option("--examples", ",".join(EXAMPLES)).split(",")
    dtypes = option("--dtypes", "f32,bf16").split(",")
    import fusec.passes.variants as variants  # measurements' knobs: the cluster kernels' shapes
    if "--cluster-threads" in sys.argv:  # the threads a block of a cluster kernel may have
        variants.CLUSTER_THREADS = tuple(int(t) for t in option("--cluster-threads", "").split(","))
    if "--resident-threads" in sys.argv:  # the threads of a block holding a whole row (longer rows: clusters)
        variants.RESIDENT_THREADS = tuple(int(t) for t in option("--resident-threads", "").split(","))
    if "--cluster-elements" in sys.argv:  # the elements of its row a thread of a cluster's block holds
        variants.CLUSTER_ELEMENTS = int(option("--cluster-elements", ""))
    if "--cluster-form" in sys.argv:  # a cluster a row, or persistent clusters streaming their rows (target.CLUSTER_FORM)
        variants.CLUSTER_FORM = option("--cluster-form", "")
        assert variants.CLUSTER_FORM in ("resident", "streaming"), variants.CLUSTER_FORM
    if "--separate-totals" in sys.argv:  # totals over the rows as before: partial sums, finishes, epilogue apart
        import fusec.passes.lower as lower
        lower.TOTALS = False
    if backend == "cuda":
        import cupy as xp

        from fusec.bench.harness import time_copy, time_gpu
    else:
        xp = np
    print(f"{elements} elements a call\n")
    print("| example | type | row length | fusec µs | copy µs | TB/s | % of copy | kernel |\n|---|---|---|---|---|---|---|---|")
    for example in examples:
        for dtype in dtypes:
            program = first_pipeline(example, dtype)
            pipeline = program.pipelines[0]
            f = fusec.jit(program.source.text, backend=backend)
            reference = fusec.jit(program.source.text, backend="numpy")
            for length in lengths:
                if length > elements:
                    continue
                small = dims_for(pipeline, max(length, min(CHECK_ELEMENTS, elements)), length)
                args = labels_in_range(make_args(xp, pipeline, small, seed=1), pipeline, xp)
                got = f(*args)
                want = reference(*[a.get() if hasattr(a, "get") else a for a in args])
                for g, w in zip(*(v if isinstance(v, tuple) else (v,) for v in (got, want))):
                    g = g.get() if hasattr(g, "get") else g
                    tolerance = 2e-2 if dtype == "bf16" else 1e-5
                    np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                               rtol=tolerance, atol=tolerance, err_msg=f"{example} {dtype} {length}")
                dims = dims_for(pipeline, elements, length)
                traffic = minimum_bytes(pipeline, dims)
                kernel = chosen(f, length)
                name = kernel.split(" ")[0].split("+")[0]
                variant = next((v for k in f.compiled.interface.kernels for v in k.variants if v.name == name), None)
                if variant is not None and getattr(variant.grid, "cluster", 0):  # resident: a cluster a row
                    kernel += " streaming" if variant.grid.persistent else " resident"
                if backend == "cuda" and "_c" in kernel:  # a cluster kernel: registers, clusters the device runs at once
                    facts = f._runner.backend.attributes(name)
                    kernel += f" ({facts['num_regs']} regs, {facts.get('clusters_at_once')} at once)"
                if backend != "cuda":
                    print(f"| {example} | {dtype} | {length} | - | - | - | - | {kernel} |", flush=True)
                    continue
                args = labels_in_range(make_args(xp, pipeline, dims, seed=2), pipeline, xp)
                us = time_gpu(xp, lambda: f(*args))
                copy_us = time_copy(xp, traffic)
                print(f"| {example} | {dtype} | {length} | {us:.1f} | {copy_us:.1f} | {traffic / us / 1e6:.2f} | "
                      f"{100 * copy_us / us:.1f} | {re.sub(r'^[a-z_0-9]+?_k', 'k', kernel)} |", flush=True)


if __name__ == "__main__":
    main()
