"""Measured choice: the cost model's best few partitions timed on the device, the winner cached.

`fusec tune FILE.fz` and `fusec.jit(..., tune=True)` time the model's five
best partitions and the one-move neighbours of its pick (at most
`MAX_CANDIDATES`), each checked against the first before it counts, and keep
the fastest per pipeline, shape class and GPU in fusec's cache (as Triton's
autotuner keeps a config per key). A later compile of the same pipeline for
the same shape class on the same GPU uses the winner (`cached_partition`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Callable

from fusec import __version__, cache
from fusec.compiler import Compiled, CompileOptions, compile_pipeline
from fusec.passes.fusion import predict_partition, ranked_partitions
from fusec.passes.partitions import Context, neighbours

MAX_CANDIDATES = 8


@dataclass(frozen=True, slots=True)
class Timing:
    groups: tuple[tuple[int, ...], ...]
    how: str
    predicted_us: float
    measured_us: float | None  # None: its results differed from the model's pick (not counted)


def shape_class(dims: dict[str, int]) -> tuple:
    """Dims rounded up to powers of two: calls of similar sizes share a tuned choice."""
    return tuple(sorted((name, 1 << max(0, math.ceil(math.log2(max(size, 1))))) for name, size in dims.items()))


def candidates(compiled: Compiled, options: CompileOptions) -> list[tuple[tuple, str, float]]:
    """(groups, how it was found, predicted µs): the compiled choice (refined on real
    registers where it was), the model's best, and the choice's neighbours."""
    graph = compiled.graph
    fusion = options.auto_fusion()
    ranked = ranked_partitions(graph, fusion)
    chosen = tuple(map(tuple, compiled.partition.groups))
    found: dict[tuple, tuple[str, float]] = {chosen: ("the model's choice", predict_partition(graph, chosen, fusion))}
    for us, how, groups in ranked[:5]:
        found.setdefault(tuple(map(tuple, groups)), (how, us))
    if ranked:
        ctx = Context.of(graph)
        for groups in neighbours(ctx, [list(g) for g in chosen]):
            key = tuple(map(tuple, groups))
            if key not in found:
                found[key] = ("neighbour of the model's pick", predict_partition(graph, groups, fusion))
    rest = sorted((item for item in found.items() if item[0] != chosen), key=lambda item: item[1][1])
    best = [(chosen, found[chosen])] + rest[:MAX_CANDIDATES - 1]
    return [(groups, how, us) for groups, (how, us) in best]


def tune(compiled: Compiled, options: CompileOptions, measure: Callable[[Compiled], float | None]) -> list[Timing]:
    """Each candidate compiled and measured (`measure` returns µs, or None where its
    results differ from the first candidate's); fastest first."""
    program, name = compiled.program, compiled.interface.pipeline
    timings = []
    for groups, how, predicted in candidates(compiled, options):
        candidate = compile_pipeline(program, name, _with(options, groups))
        timings.append(Timing(groups, how, predicted, measure(candidate)))
    return sorted(timings, key=lambda t: (t.measured_us is None, t.measured_us or 0.0))


def _with(options: CompileOptions, groups: tuple) -> CompileOptions:
    from dataclasses import replace
    return replace(options, partition=groups, fuse="auto")


def _key(program, pipeline: str, shapes: tuple, device: str, options: CompileOptions) -> str:
    return cache.key(program.source.text, pipeline, repr(shapes), device, options.arch, str(options.fast_math),
                     str(options.max_regs), __version__)


def remember(program, pipeline: str, shapes: tuple, device: str, options: CompileOptions,
             timings: list[Timing]) -> None:
    winner = next((t for t in timings if t.measured_us is not None), None)
    if winner is None:
        return
    table = [[list(map(list, t.groups)), t.how, t.predicted_us, t.measured_us] for t in timings]
    data = json.dumps({"winner": list(map(list, winner.groups)), "timings": table})
    cache.write("tune", _key(program, pipeline, shapes, device, options), ".json", data.encode())


def cached_partition(program, pipeline: str, shapes: tuple, device: str, options: CompileOptions) -> tuple | None:
    """The tuned winner for this pipeline, shape class and GPU, or None."""
    data = cache.read("tune", _key(program, pipeline, shapes, device, options), ".json")
    if data is None:
        return None
    try:
        return tuple(tuple(g) for g in json.loads(data)["winner"])
    except (ValueError, KeyError, TypeError):
        return None


def describe(timings: list[Timing]) -> str:
    rows = ["| kernels | found as | predicted µs | measured µs |", "|---|---|---|---|"]
    for t in timings:
        measured = "differs" if t.measured_us is None else f"{t.measured_us:.1f}"
        rows.append(f"| {len(t.groups)} | {t.how} | {t.predicted_us:.1f} | {measured} |")
    return "\n".join(rows)


def device_measure(args: list, arch: str, repeats: int = 5) -> Callable[[Compiled], float | None]:
    """measure(compiled) on the current CUDA device: the median µs of `repeats`
    timed calls (CUDA events) on copies of `args` (checked arguments: the caller's
    arrays are never written), or None where the results differ from the first
    candidate measured."""
    import cupy as cp
    import numpy as np

    from fusec.runtime.backends.cuda import CudaBackend
    from fusec.runtime.executor import Executor
    first: list = []

    def measure(compiled: Compiled) -> float | None:
        run = Executor(compiled.interface, CudaBackend(compiled.cuda, compiled.interface, arch=arch))
        fresh = [a.copy() if isinstance(a, cp.ndarray) else a for a in args]
        out = run(*fresh)
        results = [cp.asnumpy(o).astype(np.float64) for o in (out if isinstance(out, tuple) else (out,))
                   if o is not None]
        results += [cp.asnumpy(a).astype(np.float64) for a, p in zip(fresh, compiled.interface.signature.params)
                    if p.role == "inout"]
        if not first:
            first.extend(results)
        elif not all(np.allclose(r, f, rtol=1e-3, atol=1e-5, equal_nan=True) for r, f in zip(results, first)):
            return None
        samples = []
        for _ in range(repeats):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            run(*fresh)
            end.record()
            end.synchronize()
            samples.append(cp.cuda.get_elapsed_time(start, end) * 1000)
        return sorted(samples)[len(samples) // 2]
    return measure
