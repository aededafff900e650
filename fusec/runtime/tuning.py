"""Measured choice: the cost model's best few partitions timed on the device, the winner cached.

`fusec tune FILE.fz` and `fusec.jit(..., tune=True)` time the model's five
best partitions and the one-move neighbours of its pick (at most
`MAX_CANDIDATES`), each checked against the first before it counts, timed in
interleaved rounds (`interleaved_medians`, the clearly slower left out after
the first rounds), and keep the fastest per pipeline, shape class and GPU in fusec's cache (as Triton's
autotuner keeps a config per key). A later compile of the same pipeline for
the same shape class on the same GPU uses the winner (`cached_partition`).
"""
from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable

from fusec import __version__, cache
from fusec.compiler import Compiled, CompileOptions, compile_pipeline
from fusec.passes.fusion import predict_partition, ranked_partitions
from fusec.passes.partitions import Context, neighbours

# On the H200 the partitions within 2 % of the fastest were up to the 12th-28th of the
# pick's neighbours in the model's order (fusion_hurts f32, BENCHMARKS.md, the tenth
# session): eight candidates missed them.
MAX_CANDIDATES = 24
# Each candidate timed once a round, in a shuffled order, over ROUNDS rounds; a sample is a
# loop of calls of at least SAMPLE_US. On the H200 a compute-bound kernel's time drifts by
# 2-4 % over seconds as the power cap moves the clock (BENCHMARKS.md, the ninth session):
# timed one candidate after another, the drift would decide between candidates that close.
ROUNDS = 7
# After PRUNE_AFTER rounds, a candidate slower than the fastest by more than PRUNE_MARGIN
# (on the median of its rounds so far; twice the drift above) is timed no more.
PRUNE_AFTER, PRUNE_MARGIN = 2, 0.08
SAMPLE_US = 2000.0
WARM_CALLS, MAX_SAMPLE_CALLS = 3, 4096


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


def tune(compiled: Compiled, options: CompileOptions,
         measure: Callable[[list[Compiled]], list[float | None]]) -> list[Timing]:
    """Every candidate compiled, then measured together (`measure` returns µs for
    each, or None where its results differ from the first candidate's); fastest first."""
    program, name = compiled.program, compiled.interface.pipeline
    found = candidates(compiled, options)
    built = [compile_pipeline(program, name, _with(options, groups)) for groups, _, _ in found]
    timings = [Timing(groups, how, predicted, us) for (groups, how, predicted), us in zip(found, measure(built))]
    return sorted(timings, key=lambda t: (t.measured_us is None, t.measured_us or 0.0))


def interleaved_medians(calls: list[Callable[[], object]], time_calls: Callable[[Callable, int], float],
                        rounds: int = ROUNDS, seed: int = 0) -> list[float]:
    """µs a call of each of `calls`: each sized first (`sample_calls`), then `rounds`
    rounds timing each once in a shuffled order; the median of its rounds.
    `time_calls(call, n)` is the µs of n calls back to back. A drift of the device's
    speed over the rounds falls on every candidate alike. From round PRUNE_AFTER on,
    those slower than the fastest by more than PRUNE_MARGIN are left out (their
    median is of the rounds they had)."""
    reps = [sample_calls(call, time_calls) for call in calls]
    samples: list[list[float]] = [[] for _ in calls]
    timing, rng = list(range(len(calls))), random.Random(seed)
    for r in range(rounds):
        if r >= PRUNE_AFTER:
            so_far = {i: statistics.median(samples[i]) for i in timing}
            best = min(so_far.values())
            timing = [i for i in timing if so_far[i] <= best * (1 + PRUNE_MARGIN)]
        rng.shuffle(timing)
        for i in timing:
            samples[i].append(time_calls(calls[i], reps[i]) / reps[i])
    return [statistics.median(s) for s in samples]


def sample_calls(call: Callable[[], object], time_calls: Callable[[Callable, int], float]) -> int:
    """Calls in one sample of `call`: after WARM_CALLS untimed calls (the first calls of a
    pipeline are checked and recorded: slower on the host), doubled until a sample takes
    SAMPLE_US, at most MAX_SAMPLE_CALLS (a call of nothing to do takes no time)."""
    time_calls(call, WARM_CALLS)
    n = 1
    while n < MAX_SAMPLE_CALLS and time_calls(call, n) < SAMPLE_US:
        n *= 2
    return min(n, MAX_SAMPLE_CALLS)


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


def event_time_calls(cp, call: Callable[[], object], n: int) -> float:
    """µs of n calls back to back on the current CUDA stream, timed with CUDA events."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(n):
        call()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1000


def device_measure(args: list, arch: str, rounds: int = ROUNDS) -> Callable[[list[Compiled]], list[float | None]]:
    """measure(candidates) on the current CUDA device: each run on copies of `args`
    (checked arguments: the caller's arrays are never written) and its results held
    against the first candidate's (None where they differ), then the others timed
    together with CUDA events (`interleaved_medians`)."""
    import cupy as cp
    import numpy as np

    from fusec.runtime.backends.cuda import CudaBackend
    from fusec.runtime.executor import Executor

    def results_of(compiled: Compiled, run, fresh) -> list:
        out = run(*fresh)
        results = [cp.asnumpy(o).astype(np.float64) for o in (out if isinstance(out, tuple) else (out,))
                   if o is not None]
        return results + [cp.asnumpy(a).astype(np.float64)
                          for a, p in zip(fresh, compiled.interface.signature.params) if p.role == "inout"]

    def measure(candidates: list[Compiled]) -> list[float | None]:
        first, calls = None, []
        for compiled in candidates:
            run = Executor(compiled.interface, CudaBackend(compiled.cuda, compiled.interface, arch=arch))
            fresh = [a.copy() if isinstance(a, cp.ndarray) else a for a in args]
            results = results_of(compiled, run, fresh)
            if first is None:
                first = results
            elif not all(np.allclose(r, f, rtol=1e-3, atol=1e-5, equal_nan=True) for r, f in zip(results, first)):
                calls.append(None)
                continue
            calls.append(lambda run=run, fresh=fresh: run(*fresh))
        timed = iter(interleaved_medians([c for c in calls if c is not None],
                                         lambda call, n: event_time_calls(cp, call, n), rounds))
        return [None if c is None else next(timed) for c in calls]
    return measure
