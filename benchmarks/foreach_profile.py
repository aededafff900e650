"""Where foreach's host time goes, for the ~51 M-value model of beyond_fusion.py:
the per-tensor reads of a signature, the look-up, and the kernel alone.
Run: PYTHONPATH=. python3 benchmarks/foreach_profile.py"""
import cProfile
import pstats
import time

import cupy as cp
import numpy as np
import torch

import fusec
from fusec.bench.harness import time_gpu

h, layers, vocab = 512, 12, 25_000
layer = [(h,), (h,), (3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,),
         (h,), (h,), (h,), (h,)]
shapes = [(vocab, h)] + layer * layers
tensors = [[torch.randn(s, device="cuda").view(-1) for s in shapes] for _ in range(4)]
sets = list(zip(*tensors))
flat = [t for s in sets for t in s]
adam = fusec.jit("examples/adam.fz")
scalars = (1e-3, 0.9, 0.999, 1e-8, 0.1, 0.001)
adam.foreach(sets, *scalars)
runner = adam._foreach_runner


def host(fn, iters=50):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) * 1e6 / iters


print(f"| {len(flat)} x t.data_ptr() | {host(lambda: [t.data_ptr() for t in flat]):.1f} µs |")
print(f"| {len(flat)} x t.shape | {host(lambda: [t.shape for t in flat]):.1f} µs |")
print(f"| {len(flat)} x t.stride() | {host(lambda: [t.stride() for t in flat]):.1f} µs |")
print(f"| {len(flat)} x t.is_contiguous() | {host(lambda: [t.is_contiguous() for t in flat]):.1f} µs |")
print(f"| {len(flat)} x t.numel() | {host(lambda: [t.numel() for t in flat]):.1f} µs |")
print(f"| {len(flat)} x id(t) | {host(lambda: list(map(id, flat))):.1f} µs |")
print(f"| {len(flat)} x t.dtype, t.is_cuda | {host(lambda: [(t.dtype, t.is_cuda) for t in flat]):.1f} µs |")
print(f"| {len(flat)} x backend.signature | {host(lambda: list(map(runner.backend.signature, flat))):.1f} µs |")
print(f"| backend.signatures of all {len(flat)} | {host(lambda: runner.backend.signatures(flat)):.1f} µs |")
print(f"| runner._key(sets) | {host(lambda: runner._key(sets)):.1f} µs |")
key = runner._key(sets)
print(f"| key == key | {host(lambda: runner._key(sets) == key):.1f} µs |")
print(f"| whole foreach, host | {host(lambda: adam.foreach(sets, *scalars), iters=10):.1f} µs |")
prepared = runner._prepared[0][1]
args = [prepared.tables[key] if kind == "pointers" else np.float32(0.5) if kind == "scalar"
        else prepared.items if kind == "table" else prepared.chunks for kind, key in runner.kernel_args]
kernel = runner.kernel
print(f"| kernel alone, device clock | "
      f"{time_gpu(cp, lambda: runner.backend.launch(kernel, prepared.chunks * 256, args, None, False)):.1f} µs |")
print(f"| chunks {prepared.chunks}, grid {runner.backend.persistent_grids} |")
cProfile.run("for _ in range(20): adam.foreach(sets, *scalars)", "/tmp/foreach.prof")
pstats.Stats("/tmp/foreach.prof").sort_stats("tottime").print_stats(8)

# The work item's size: the kernel reads each item's bounds from the table, so it can vary at run time.
from fusec.runtime import foreach as foreach_module  # noqa: E402

for chunk in (8192, 16384, 32768, 65536, 131072, 262144):
    foreach_module.CHUNK = chunk
    runner._prepared.clear()
    adam.foreach(sets, *scalars)
    prepared = runner._prepared[0][1]
    args = [prepared.tables[key] if kind == "pointers" else np.float32(0.5) if kind == "scalar"
            else prepared.items if kind == "table" else prepared.chunks for kind, key in runner.kernel_args]
    us = time_gpu(cp, lambda: runner.backend.launch(kernel, prepared.chunks * 256, args, None, False))
    print(f"| CHUNK {chunk}: {prepared.chunks} items | kernel alone {us:.1f} µs |")
