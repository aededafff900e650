"""Does the cost model pick the fastest partition? Candidates timed on the GPU beside its predictions.

    PYTHONPATH=. python3 benchmarks/decision_quality.py [--json OUT.json] [--only NAME,NAME] [--f32]
        [--shard I/N] [--deadline SECONDS] [--probe]
    python3 benchmarks/decision_quality.py --summary SHARD.json ...
    (--hold FILE: no pipeline is timed while FILE exists; the GPU is another's)
    bash benchmarks/decision_quality.sh [DEADLINE]     (every GPU of the host, one shard each)
    FUSEC_ELEMENTS=4096 FUSEC_MAX_RANDOM=3 PYTHONPATH=. python3 benchmarks/decision_quality.py --sim --only deep16
        (no device: the same enumeration, NVRTC builds and checks, run by the sim backend; CPU times)
    PYTHONPATH=. python3 benchmarks/decision_quality.py --enumerate [--shard I/N]
        (no device: the candidates and the projected device time of each shard)

Pipelines: every example, and generated wide (8-32 inputs, every output mixing
every input through exp/sin/tanh), deep (chains of 16-32 stages) and
transcendental-heavy ones; f32 and bf16, at 2^26 elements (rows of ROW, the
length the cost model assumes: 8192). Candidates, chosen
independently of the fusion pass: all fused, unfused, the greedy partitions
under budgets from 32 to 255, the model's five best, every one-move neighbour
of its pick, the set `fusec tune` times, and random partitions (up to
FUSEC_MAX_RANDOM, 40; fewer where the projected time would pass the deadline:
the record says how many). Each is compiled (NVRTC in a process pool),
checked against the unfused result, and timed in two passes in shuffled order
(a pass: REPS rounds, each candidate once a round in a shuffled order, a sample
a loop of at least 20 ms, as the bench harness's time_gpu, or one call where a
call takes 10 ms or more: interleaved, so that the power cap's drift over a
pass falls on every candidate alike);
then the close ones (within 5 % of the fastest, or three times the pipeline's
noise; at most eight, with the model's pick, the estimate's pick and the tuned
pick) in EXTRA_PASSES more shuffled passes, so that the winner among them is
decided on the median of their passes. Then the partitions `fusec tune` times
are timed as it times them (tuning.interleaved_medians: each once a round, in
interleaved rounds), which gives the tuned pick.

Reported per pipeline, as the issue defines them: the model's pick against
the fastest candidate of the second pass; over all candidate pairs whose times
differ by more than 3 % and three times the noise, Kendall's tau-b of
predicted and measured order, and the median |ln(predicted / measured)|; the
pick `fusec tune` makes (the fastest of its partitions by its own timing)
against the fastest. Beside them, the same ratios on the median of
every pass a candidate had.

The JSON keeps every candidate's full record for refitting the model offline:
its partition, the predicted total (the fusion pass's, with the real registers
of what guard.refine compiled) and, per kernel (one table a pipeline, shared
by the candidates), the prediction and its terms, the features it came from
(bytes, op counts, elements, elements per thread), the estimated registers,
ptxas's registers, spills and stack, the SASS bytes, and each pass's samples.

With --probe (the first shard): one kernel of a deep chain of 6 to 60 stages,
f32 and bf16, timed after the pipelines where time is left: time per stage
against the kernel's SASS bytes (does a kernel slow down past the instruction
cache?).
"""
from __future__ import annotations

import json
import math
import os
import random
import statistics
import struct
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace

from fusec.bench.harness import dims_for
from fusec.runtime import tuning
from fusec.bench.harness import make_args as harness_args

ELEMENTS = int(os.environ.get("FUSEC_ELEMENTS", 2 ** 26))
MAX_RANDOM = int(os.environ.get("FUSEC_MAX_RANDOM", 40))
# Rows of a row pipeline: the length the cost model assumes (passes.cost.nominal_dims:
# the elements shared equally by [rows, cols], 8192 at 2^26), so that the
# prediction and the measurement are of the same rows. (The run of 2026-11-30 took 1024.)
ROW = int(os.environ.get("FUSEC_ROW", 0)) or round(math.sqrt(ELEMENTS))
# One pass of a candidate: REPS repetitions of a back-to-back loop of at least
# REP_SECONDS (the bench harness's time_gpu); a call of LONG_CALL seconds or more
# is a loop of its own. Long calls too take REPS samples a pass: with two (the
# ninth session's), one sample 20 % high (the power cap) moved a pick's
# second-pass median by 12 % (wide32 bf16, 2026-12-01, tenth).
REP_SECONDS, REPS, LONG_CALL = 0.02, 5, 0.01
# After the two passes: the candidates within CLOSE of the fastest (or three
# times the pipeline's noise), at most CLOSE_MAX, with the picks, timed again
# in EXTRA_PASSES shuffled passes of REPS repetitions each.
CLOSE, CLOSE_MAX, EXTRA_PASSES = 0.05, 8, 2
# The projected device time of a candidate (seconds): its check and passes from
# its predicted time (CHECK_SECONDS for the module's load and the comparison),
# times MARGIN until MARGIN_AFTER seconds were measured, then times the ratio
# of measured to projected seconds so far (at least 1) and MARGIN_MEASURED.
MARGIN, MARGIN_AFTER, MARGIN_MEASURED, CHECK_SECONDS = 1.3, 20.0, 1.1, 0.1
PROBE_DEPTHS = (6, 12, 18, 24, 30, 36, 48, 60)
PROBE_SECONDS = 15  # kept for the probe before the deadline (its kernels take 0.1-2 ms a call)


def generated() -> dict[str, str]:
    """name -> .fz source of the generated pipelines (deterministic)."""
    out = {}
    rng = random.Random(7)
    funcs = ("exp", "sin", "tanh")
    for n in (8, 12, 16, 24, 32):
        params = ", ".join(f"x{i}: f32[n]" for i in range(n))
        outs = ", ".join(f"y{j}: f32[n]" for j in range(n))
        body = []
        for j in range(n):
            terms = [f"{rng.uniform(-1, 1):.3f} * {funcs[(i + j) % 3]}(x{i} * {rng.uniform(0.05, 0.3):.3f})"
                     for i in range(n)]
            body.append(f"    y{j} = tanh({' + '.join(terms)});")
        out[f"wide{n}"] = f"pipeline wide{n}({params}) -> ({outs}) {{\n" + "\n".join(body) + "\n}\n"
    for depth in (16, 32):
        out[f"deep{depth}"] = deep(depth)
    for n in (8, 16):
        params = ", ".join(f"x{i}: f32[n]" for i in range(n))
        body = [f"    a{i} = erf(x{i}) * log1p(abs(x{i})) + atan2(x{i}, 1.5);" for i in range(n)]
        body.append("    y = " + " + ".join(f"a{i}" for i in range(n)) + ";")
        out[f"transcendental{n}"] = f"pipeline transcendental{n}({params}) -> (y: f32[n]) {{\n" + "\n".join(body) + "\n}\n"
    return out


def deep(depth: int, dtype: str = "f32") -> str:
    """A chain of `depth` stages, each one of six operations of the one before, plus x scaled."""
    lines, prev = [], "x"
    ops = ("sin({})", "{} * 1.01 + 0.1", "tanh({})", "exp(-abs({}))", "sqrt(abs({}) + 1.0)", "{} * {}")
    for d in range(depth):
        op = ops[d % len(ops)]
        expr = op.format(prev, prev) if op.count("{}") == 2 else op.format(prev)
        name = f"t{d}" if d < depth - 1 else "y"
        lines.append(f"    {name} = {expr} + x * {0.01 * (d + 1):.2f};")
        prev = name
    return f"pipeline deep{depth}(x: {dtype}[n]) -> (y: {dtype}[n]) {{\n" + "\n".join(lines) + "\n}\n"


def corpus(dtypes=("f32", "bf16")) -> list[tuple[str, str, object]]:
    """(name, dtype, checked program) of every pipeline."""
    from pathlib import Path

    from fusec.bench.harness import retype
    from fusec.errors import Source
    from fusec.frontend import check_source
    out = []
    sources = {p.stem: p.read_text() for p in sorted(Path("examples").glob("*.fz"))}
    sources.update(generated())
    for name, text in sources.items():
        for dtype in dtypes:
            try:
                program = retype(text, dtype, name)
            except ValueError:  # several float types: as written, once
                if dtype != dtypes[0]:
                    continue
                program = check_source(Source(name, text))
            out.append((name, dtype, program))
    return out


# ---------------------------------------------------------------------------
# In the workers: the candidates of a pipeline, and each candidate built.

def candidates(job) -> dict:
    """In a worker: every candidate partition of one pipeline, how it was found
    and its predicted µs, in the order they were found (the random ones last)."""
    name, dtype, source_text, source_name, seed = job
    from fusec.compiler import CompileOptions, compile_pipeline
    from fusec.errors import Source
    from fusec.frontend import check_source
    from fusec.passes import guard
    from fusec.passes.fusion import CAPS, FusionOptions, Pricer, ranked_partitions
    from fusec.passes.lower import lower
    from fusec.passes.partitions import Context, greedy, neighbours, random_partition
    from fusec.runtime.backends.cuda import ptxas_observations
    started = time.perf_counter()
    program = check_source(Source(source_name, source_text))
    pipeline = program.pipelines[0].name
    # The pick as fusec.jit makes it on the cuda backend: the close candidates
    # compiled and the choice made again on their real registers (guard.refine).
    options = CompileOptions()
    refined = guard.refine(compile_pipeline(program, pipeline, options), options,
                           lambda **c: compile_pipeline(program, pipeline, replace(options, **c)),
                           lambda c: ptxas_observations(c, "sm_90"))
    # Every candidate partitions the graph the compiler fuses (after recomputing).
    graph = refined.graph
    recomputed = len(graph.stages) != len(lower(program, program.pipelines[0]).stages)
    ctx = Context.of(graph)
    rng = random.Random(seed)
    found: dict[tuple, str] = {}

    def add(groups, how):
        found.setdefault(tuple(map(tuple, groups)), how)
    pricer = Pricer(ctx, FusionOptions(observed=guard.remembered(program, pipeline, "sm_90")))
    ranked = ranked_partitions(graph)
    pick = refined.partition.groups
    add(pick, "model's pick")
    add(ranked[0][2], "model's pick before compiling")
    add([[i] for i in sorted(ctx.live)], "unfused")
    add(greedy(ctx, lambda g, s: None)[0], "all fused")
    for cap in CAPS:
        add(greedy(ctx, pricer.within(cap))[0], f"greedy {cap}")
    for us, how, groups in ranked[1:5]:
        add(groups, f"model's rank ({how})")
    for n in neighbours(ctx, [list(g) for g in pick]):
        add(n, "neighbour of the pick")
    # what `fusec tune` would time: its pick is the fastest of these in the first pass
    tuned = [tuple(map(tuple, groups)) for groups, _, _ in tuning.candidates(refined, CompileOptions())]
    for groups in tuned:
        add(groups, "tune set")
    for _ in range(MAX_RANDOM * 3):
        if sum(1 for how in found.values() if how == "random") >= MAX_RANDOM:
            break
        add(random_partition(ctx, rng), "random")
    predicted = {g: pricer.total([list(x) for x in g]) for g in found}
    for g in sorted(found, key=predicted.get)[:5]:  # the model's five best among everything found
        if found[g] != "model's pick":
            found[g] += " (model top 5)"
    return {"pipeline": name, "dtype": dtype, "recomputed": recomputed, "tuned": tuned,
            "found": [(g, found[g], predicted[g]) for g in found], "seconds": time.perf_counter() - started}


def compile_one(job):
    """In a worker: one candidate compiled, its module built for `arch` (the disk
    cache keeps it), and the record of each of its kernels."""
    source_text, source_name, groups, arch, recomputed = job
    from fusec.compiler import CompileOptions, compile_pipeline
    from fusec.errors import Source
    from fusec.frontend import check_source
    from fusec.passes.cost import nominal_dims, target_costs
    from fusec.runtime.backends.cuda import compile_module, ptxas_report
    started = time.perf_counter()
    program = check_source(Source(source_name, source_text))
    # A given partition of the graph as lowered: fuse="all" skips the recompute
    # pass's search (the same module where it rewrites nothing; where it does,
    # the auto mode, whose graph the groups then partition).
    fuse = "auto" if recomputed else "all"
    compiled = compile_pipeline(program, program.pipelines[0].name, CompileOptions(partition=groups, fuse=fuse))
    cubin = compile_module(compiled.cuda, arch, native=True)
    ptxas, sass = ptxas_report(compiled.cuda, arch), sass_bytes(cubin)
    costs = target_costs(arch)
    nominal = nominal_dims(stage.shape for stage in compiled.graph.stages)
    run_dims = dims_of(program.pipelines[0])
    records = [kernel_record(launch, group, ptxas, sass, costs, nominal, run_dims)
               for group, launch in zip(compiled.partition.groups, compiled.interface.kernels)]
    return compiled.cuda, compiled.interface, records, time.perf_counter() - started


def kernel_record(launch, group, ptxas, sass, costs, nominal, run_dims) -> dict:
    """What the model saw of one kernel, what it predicted, and what ptxas made of it."""
    from fusec.ir.launch import RegisterLoop
    from fusec.passes.cost import MAX_REGS, compute_ps, nominal_elements, nominal_row, predict
    from fusec.passes.variants import variant_for_rows
    kernel, p = launch.kernel, launch.prediction
    # the variant the model priced (for the nominal rows; an elementwise kernel's first), and the one
    # the runtime takes for the run's rows
    variant = variant_for_rows(launch.variants, nominal_row(kernel, nominal))
    runs = variant_for_rows(launch.variants, nominal_row(kernel, run_dims))
    ops = Counter(ins.op + ("/f64" if ins.type.compute.bits == 64 else "")
                  for ins in kernel.body.instrs if ins.op not in ("load", "const"))
    iterations = launch.form.count if isinstance(launch.form, RegisterLoop) and isinstance(launch.form.count, int) else 1
    elements = nominal_elements(kernel.shape, nominal)
    real = ptxas.get(variant.name) or {}
    record = {
        "group": list(group), "name": variant.name, "runs": runs.name, "form": type(launch.form).__name__,
        "ept": variant.elements_per_thread, "variants": len(launch.variants),
        "elements": elements, "run_elements": math.prod(d if isinstance(d, int) else run_dims.get(d, 1)
                                                        for d in kernel.shape),
        "iterations": iterations,
        "loaded": sum(a.type.itemsize for a in kernel.loads if a.contiguous),
        "broadcast_loaded": sum(a.type.itemsize for a in kernel.loads if not a.contiguous),
        "stored": sum(a.type.itemsize for a, _ in kernel.stores),
        "ops": dict(ops), "compute_ps": _r(compute_ps(kernel, costs)),
        "est_regs": variant.est_regs, "ptxas_regs": real.get("regs"), "spill_bytes": real.get("spill_bytes"),
        "stack_bytes": real.get("stack_bytes"), "sass_bytes": sass.get(variant.name),
        # us, memory_us, compute_us, warps per SM, bytes an element (passes.cost.predict)
        "predicted": [_r(p.us), _r(p.memory_us), _r(p.compute_us), p.warps, p.bytes_per_element] if p else None,
    }
    if p and real.get("regs"):  # the same prediction on ptxas's registers (spilled bytes as registers past 255)
        regs = real["regs"] if not real.get("spill_bytes") else max(real["regs"], MAX_REGS) + -(-real["spill_bytes"] // 4)
        again = predict(kernel, replace(variant, est_regs=regs), elements, costs, iterations)
        record["predicted_ptxas"] = [_r(again.us), _r(again.memory_us), _r(again.compute_us), again.warps]
    return record


def sass_bytes(cubin: bytes) -> dict[str, int]:
    """Bytes of machine code of each function of a cubin (its ELF's .text.NAME sections)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:  # not a 64-bit ELF (PTX): nothing to say
        return {}
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * entsize) for i in range(count)]
    table = headers[names][4]

    def name(offset):
        return cubin[table + offset:cubin.index(b"\0", table + offset)].decode()
    return {name(h[0])[len(".text."):]: h[5] for h in headers if name(h[0]).startswith(".text.")}


def _r(x: float) -> float:
    """Four significant digits (the JSON stays small)."""
    return float(f"{x:.4g}")


# ---------------------------------------------------------------------------
# In the shard's process: the plan, the checks, the timing.

def repetitions(seconds: float) -> int:
    """Repetitions of a pass for a call of `seconds`."""
    return REPS


def pass_seconds(us: float, reps: int | None = None) -> float:
    """Device seconds of one timed pass of a candidate of `us` µs a call (a call
    first, untimed, and the repetitions)."""
    t = us * 1e-6
    return t + (reps or repetitions(t)) * max(t, REP_SECONDS)


def projected_seconds(entries: list[tuple], randoms: int) -> float:
    """Device seconds to check and time `entries` ((groups, how, predicted µs)),
    keeping the first `randoms` random ones."""
    kept = kept_candidates(entries, randoms)
    total = sum(CHECK_SECONDS + 3 * us * 1e-6 + 2 * pass_seconds(us) for _, _, us in kept)
    close = sorted(us for _, _, us in kept)[:CLOSE_MAX + 3]
    total += EXTRA_PASSES * sum(pass_seconds(us, REPS) for us in close)
    # the tune set as fusec tune times it: about the cheapest, each warmed and sized, a
    # sample a round for PRUNE_AFTER rounds, then about the best eight for the rest
    tuned = sorted(us for _, _, us in kept)[:tuning.MAX_CANDIDATES]
    total += sum((tuning.WARM_CALLS + 1) * us * 1e-6 for us in tuned)
    total += tuning.PRUNE_AFTER * sum(max(us, tuning.SAMPLE_US) * 1e-6 for us in tuned)
    total += (tuning.ROUNDS - tuning.PRUNE_AFTER) * sum(max(us, tuning.SAMPLE_US) * 1e-6 for us in tuned[:8])
    return total


def kept_candidates(entries: list[tuple], randoms: int) -> list[tuple]:
    out, seen = [], 0
    for entry in entries:
        if entry[1] == "random" or entry[1].startswith("random "):
            seen += 1
            if seen > randoms:
                continue
        out.append(entry)
    return out


def plan_randoms(pending: list[list[tuple]], seconds: float, factor: float) -> int:
    """The most random partitions a pipeline (up to MAX_RANDOM) for which the
    pipelines still to measure fit in `seconds` (their projections times `factor`)."""
    for randoms in range(MAX_RANDOM, -1, -1):
        if factor * sum(projected_seconds(e, randoms) for e in pending) <= seconds:
            return randoms
    return 0


def gpu_plan(cp, fn, reps: int | None = None, known_us: float | None = None) -> tuple[int, int]:
    """(calls a sample, samples) of a candidate: a back-to-back loop of at least
    REP_SECONDS, `reps` times (else as many as a call's length allows). A call
    first, untimed, that sizes the loop; where the time of a call is known
    (`known_us`: an earlier pass), a long call (the loop is one call) needs neither."""
    one = known_us * 1e-6 if known_us else None
    if one is None or one < LONG_CALL:
        start = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        one = one or time.perf_counter() - start
    return max(1, min(2000, int(REP_SECONDS / max(one, 1e-6)))), reps or repetitions(one)


def gpu_samples(cp, fn, reps: int | None = None, known_us: float | None = None) -> list[float]:
    """µs a call in each of a candidate's samples, taken one after another (the bench
    harness's time_gpu, whose result is the median of these)."""
    iters, n = gpu_plan(cp, fn, reps, known_us)
    return [tuning.event_time_calls(cp, fn, iters) / iters for _ in range(n)]


def cpu_time_calls(fn, n: int) -> float:
    """The sim's stand-in of tuning.event_time_calls: µs of n calls on the CPU."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) * 1e6


def cpu_plan(fn, reps: int | None = None, known_us: float | None = None) -> tuple[int, int]:
    """The sim's stand-in of gpu_plan: a sample is one call, once."""
    return 1, 1


def cpu_samples(fn, reps: int | None = None, known_us: float | None = None) -> list[float]:
    """The sim's stand-in: µs of one call on the CPU (meaningless as a GPU time: it checks the plumbing)."""
    start = time.perf_counter()
    fn()
    return [(time.perf_counter() - start) * 1e6]


def _flag(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> None:
    if "--summary" in sys.argv:  # the shards' JSON files, one table
        shards = []
        for path in sys.argv[sys.argv.index("--summary") + 1:]:
            with open(path) as f:
                shards.append(json.load(f))
        summary(shards)
        return
    import multiprocessing
    sim, enumerate_only = "--sim" in sys.argv, "--enumerate" in sys.argv
    only = _flag("--only")
    only = only.split(",") if only else None
    dtypes = ("f32",) if "--f32" in sys.argv else ("f32", "bf16")
    shard, shards = map(int, _flag("--shard", "0/1").split("/"))
    deadline = float(_flag("--deadline", "1e9"))
    probing = "--probe" in sys.argv and not enumerate_only
    pipelines_until = deadline - (PROBE_SECONDS if probing else 0)  # the pipelines' own deadline
    out_path = _flag("--json")
    hold = _flag("--hold")
    started = time.perf_counter()
    if sim or enumerate_only:
        import numpy as cp
        arch = "sm_90"
        timer, time_calls, plan = cpu_samples, cpu_time_calls, cpu_plan
        device = "none (sim backend)" if sim else "none"
    else:
        import cupy as cp

        from fusec.runtime.backends.cuda import device_arch, device_name
        arch, device = device_arch(), device_name()
        timer = lambda fn, reps=None, known_us=None: gpu_samples(cp, fn, reps, known_us)  # noqa: E731
        time_calls = lambda fn, n: tuning.event_time_calls(cp, fn, n)  # noqa: E731
        plan = lambda fn, reps=None, known_us=None: gpu_plan(cp, fn, reps, known_us)  # noqa: E731
    executor = None if enumerate_only else _executor(sim)
    programs = {(n, d): p for n, d, p in corpus(dtypes) if not only or n in only}
    # shards balanced by source length (a proxy for candidates and compile time)
    load = [0] * shards
    mine = []
    for key in sorted(programs, key=lambda k: -len(programs[k].source.text)):
        s = load.index(min(load))
        load[s] += len(programs[key].source.text)
        if s == shard:
            mine.append(key)
    workers = max(2, (os.cpu_count() or 4) // shards - 1)
    rng = random.Random(11)
    record = {"shard": f"{shard}/{shards}", "device": device, "arch": arch, "elements": ELEMENTS,
              "max_random": MAX_RANDOM, "randoms_planned": None, "deadline": deadline, "started_unix": time.time(),
              "pipelines": [], "not_measured": [], "probe": []}

    def save():
        if out_path:  # after every pipeline: a run cut short keeps what it measured
            record["elapsed"] = round(time.perf_counter() - started, 1)
            with open(out_path, "w") as f:
                json.dump(record, f, separators=(",", ":"))

    def say(text):
        print(f"[shard {shard}, {time.perf_counter() - started:.0f} s] {text}", flush=True)
    spent = [0.0, 0.0]  # seconds measured, and projected for what was measured

    def factor():
        return max(1.0, spent[0] / spent[1]) * MARGIN_MEASURED if spent[0] >= MARGIN_AFTER else MARGIN
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        enumerating = {pool.submit(candidates, (n, d, programs[(n, d)].source.text, programs[(n, d)].source.name, 11)):
                       (n, d) for n, d in mine}
        probe = {}
        ready: list[dict] = []  # enumerated, in the order they were, not yet measured
        enumerated: list[dict] = []
        while enumerating or ready:
            for future in [f for f in enumerating if f.done()]:
                key = enumerating.pop(future)
                try:
                    found = future.result()
                except Exception:
                    say(f"{key[0]} {key[1]}: enumeration failed\n{traceback.format_exc()}")
                    record["not_measured"].append(f"{key[0]} {key[1]} (enumeration failed)")
                    continue
                program = programs[key]
                found["builds"] = {} if enumerate_only else {
                    g: pool.submit(compile_one, (program.source.text, program.source.name, g, arch, found["recomputed"]))
                    for g, _, _ in found["found"]}
                ready.append(found)
                enumerated.append(found)
                say(f"{key[0]} {key[1]}: {len(found['found'])} candidates enumerated in {found['seconds']:.0f} s; "
                    f"{projected_seconds(found['found'], MAX_RANDOM):.0f} s projected on the device")
            if not enumerating and record["randoms_planned"] is None:
                left = pipelines_until - (time.perf_counter() - started)
                pending = [f["found"] for f in (enumerated if enumerate_only else ready)]
                randoms = record["randoms_planned"] = plan_randoms(pending, left, factor())
                say(f"every pipeline enumerated: {len(pending)} to measure, {randoms} random partitions each "
                    f"(of {MAX_RANDOM}) in the {left:.0f} s left: {sum(projected_seconds(f, randoms) for f in pending):.0f} "
                    f"s projected (times {factor():.2f})")
                if probing:  # compiled behind the pipelines, timed last
                    probe = {(depth, dtype): pool.submit(compile_one, (deep(depth, dtype), f"deep{depth}[{dtype}]",
                                                                        (tuple(range(depth)),), arch, False))
                             for dtype in dtypes for depth in PROBE_DEPTHS}
            if enumerate_only:
                ready.clear()  # nothing measured: the plan above is the point
            if not ready:
                if enumerating:
                    wait(list(enumerating), return_when=FIRST_COMPLETED)
                continue
            if hold and os.path.exists(hold):  # the GPU is another's for now (decision_quality.sh: fast math)
                time.sleep(0.2)
                continue
            # Until every pipeline is enumerated, the first enumerated, with every random partition.
            # Then the largest whose builds are done (else the one with fewest builds to wait for),
            # with the random partitions that the time left allows every pipeline left.
            randoms = MAX_RANDOM
            if not enumerating:
                left = pipelines_until - (time.perf_counter() - started)
                randoms = plan_randoms([f["found"] for f in ready], left, factor())

                def waiting(f):
                    building = sum(not f["builds"][g].done() for g, _, _ in kept_candidates(f["found"], randoms))
                    return (1, building) if building else (0, -projected_seconds(f["found"], randoms))
                ready.sort(key=waiting)
            found = ready.pop(0)
            kept = kept_candidates(found["found"], randoms)
            kept_groups = {g for g, _, _ in kept}
            for g, future in found["builds"].items():
                if g not in kept_groups:
                    future.cancel()
            name, dtype = found["pipeline"], found["dtype"]
            projected = projected_seconds(kept, randoms)
            if time.perf_counter() - started + projected * factor() > pipelines_until:
                say(f"deadline: {name} {dtype} not measured ({projected * factor():.0f} s projected)")
                record["not_measured"].append(f"{name} {dtype} (deadline)")
                for b in found["builds"].values():
                    b.cancel()
                continue
            begun = time.perf_counter()
            try:
                result = measure(cp, programs[(name, dtype)], found, kept, rng, executor, plan, time_calls)
            except Exception:  # one pipeline's failure is reported, the others still measured
                say(f"{name} {dtype}: failed\n{traceback.format_exc()}")
                record["not_measured"].append(f"{name} {dtype} (failed)")
                continue
            finally:
                if not sim:
                    cp.get_default_memory_pool().free_all_blocks()
            result.update(seconds=round(time.perf_counter() - begun, 1), projected=round(projected, 1),
                          enumerated_in=round(found["seconds"], 1),
                          randoms=sum(c["how"].startswith("random") for c in result["candidates"]))
            record["pipelines"].append(result)
            spent[0] += result["seconds"]
            spent[1] += projected
            say(report(result) + f" ({result['seconds']:.0f} s measured, {projected:.0f} s projected)")
            save()
        if probe:
            record["probe"] = probe_depths(cp, probe, executor, timer, deadline - (time.perf_counter() - started), say)
        save()
        say("done")
        # Builds still running (random partitions planned away, a pipeline left out) are not waited for.
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
    if shards == 1 and record["pipelines"]:
        summary([record])


def _executor(sim: bool):
    from fusec.runtime.executor import Executor
    if sim:
        from fusec.runtime.backends.sim import SimBackend
        return lambda cuda, interface: Executor(interface, SimBackend(cuda, interface))
    from fusec.runtime.backends.cuda import CudaBackend
    return lambda cuda, interface: Executor(interface, CudaBackend(cuda, interface))


def measure(cp, program, found, kept, rng, executor, plan, time_calls) -> dict:
    """Each kept candidate checked against the unfused result, then timed in two
    interleaved passes, and the close ones in EXTRA_PASSES more; then the tune set
    as `fusec tune` times it. `plan(call, reps, known µs)`: (calls a sample,
    samples); `time_calls(call, n)`: µs of n calls."""
    pipeline = program.pipelines[0]
    args = make_args(cp, pipeline)
    tuned = set(found["tuned"])
    # the unfused result first: the reference
    order = sorted(kept, key=lambda c: not c[1].startswith("unfused"))
    kernels: dict[str, int] = {}  # a kernel's record (as JSON) -> its index in the pipeline's table
    table: list[dict] = []
    reference, entries, waited = None, [], 0.0
    for groups, how, predicted in order:
        begun = time.perf_counter()
        try:
            cuda, interface, records, compile_seconds = found["builds"][groups].result()
        except Exception as exc:  # a candidate that does not build is left out, and says why
            if reference is None:
                raise
            entries.append({"groups": groups, "how": how, "ok": False, "tuned": groups in tuned,
                            "predicted": _r(predicted), "failed": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        finally:
            waited += time.perf_counter() - begun
        run = executor(cuda, interface)
        ok = _check(cp, run, args, pipeline, found["dtype"], reference)
        if reference is None:
            reference, ok = ok, True
        indices = []
        for launch, rec in zip(interface.kernels, records):
            attrs = run.backend.attributes(rec["name"]) if hasattr(run.backend, "attributes") else {}
            rec = dict(rec, num_regs=attrs.get("num_regs"), local_bytes=attrs.get("local_size_bytes"),
                       block=attrs.get("block"))
            key = json.dumps({k: v for k, v in rec.items() if k != "name"}, sort_keys=True)
            if key not in kernels:
                kernels[key] = len(table)
                table.append(rec)
            indices.append(kernels[key])
        entries.append({"groups": groups, "how": how, "ok": bool(ok), "tuned": groups in tuned,
                        "predicted": _r(predicted),
                        "predicted_est": _r(sum(r["predicted"][0] for r in records if r["predicted"])),
                        "predicted_ptxas": _r(sum((r.get("predicted_ptxas") or r["predicted"] or [0])[0]
                                                  for r in records)),
                        "kernels": indices, "compile_s": round(compile_seconds, 1), "samples": [], "run": run})
    del reference

    def timed(selected, reps=None):
        timed_pass(selected, [lambda e=e: e["run"](*args) for e in selected], plan, time_calls, rng, reps)
    built = [e for e in entries if "run" in e]
    timed(built)
    timed(built)
    for e in built:
        e["t0"], e["t1"] = (statistics.median(s) for s in e["samples"][:2])
    ok = [e for e in entries if e["ok"]]
    noise = statistics.median(abs(e["t0"] - e["t1"]) / e["t1"] for e in ok) if ok else 0.0
    close = close_set(entries, noise)
    for _ in range(EXTRA_PASSES):
        timed(close, REPS)
    tune_set = [e for e in built if e["tuned"] and e["ok"]]
    for e, us in zip(tune_set, tuning.interleaved_medians([lambda e=e: e["run"](*args) for e in tune_set], time_calls)):
        e["tune_us"] = round(us, 2)
    for e in built:
        e.pop("run")
        medians = [statistics.median(s) for s in e["samples"]]
        e.update({f"t{i}": round(t, 2) for i, t in enumerate(medians)})
        e["final"] = round(statistics.median(medians), 2)
    return {"pipeline": found["pipeline"], "dtype": found["dtype"], "recomputed": found["recomputed"],
            "dims": dims_of(pipeline), "noise": round(noise, 4), "close": len(close),
            "build_wait_s": round(waited, 1),
            "kernels": table, "candidates": entries}


def timed_pass(entries: list[dict], calls: list, plan, time_calls, rng, reps: int | None = None) -> None:
    """A pass over `entries` (their `calls`): each one's samples (`plan`: calls a sample,
    samples; sized by its first pass where it had one) taken a round at a time, each round
    in a shuffled order; appended to its "samples" as µs a call."""
    plans = []
    for e, call in zip(entries, calls):
        known = statistics.median(e["samples"][0]) if e["samples"] else None
        plans.append((e, call, *plan(call, reps, known)))
    taken: dict[int, list[float]] = {id(e): [] for e in entries}
    for r in range(max((n for *_, n in plans), default=0)):
        order = [p for p in plans if p[3] > r]
        rng.shuffle(order)
        for e, call, iters, _ in order:
            taken[id(e)].append(round(time_calls(call, iters) / iters, 2))
    for e in entries:
        e["samples"].append(taken[id(e)])


def close_set(entries: list[dict], noise: float) -> list[dict]:
    """The candidates to time again: those within max(CLOSE, 3 x noise) of the
    fastest on the mean of the two passes (at most CLOSE_MAX), and the picks."""
    ok = [e for e in entries if e["ok"]]
    if not ok:
        return []
    mean = {id(e): (e["t0"] + e["t1"]) / 2 for e in ok}
    best = min(mean.values())
    near = sorted((e for e in ok if mean[id(e)] <= best * (1 + max(CLOSE, 3 * noise))), key=lambda e: mean[id(e)])
    picks = [e for e in ok if e["how"] == "model's pick" or e["how"].startswith("model's pick before compiling")]
    picks += [min((e for e in ok if e["tuned"]), key=lambda e: e["t0"], default=None)]
    out = near[:CLOSE_MAX]
    out += [e for e in picks if e is not None and all(e is not o for o in out)]
    return out


def probe_depths(cp, probe, executor, timer, seconds, say) -> list[dict]:
    """One kernel of a deep chain at each depth: µs a stage against its SASS bytes."""
    from fusec.errors import Source
    from fusec.frontend import check_source
    out = []
    until = time.perf_counter() + seconds
    for (depth, dtype), future in sorted(probe.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        try:
            cuda, interface, (rec,), _ = future.result(timeout=max(0.0, until - time.perf_counter()))
        except FutureTimeout:
            say(f"probe: deep{depth} {dtype} not timed (no time left)")
            future.cancel()
            continue
        except Exception:
            say(f"probe: deep{depth} {dtype} failed\n{traceback.format_exc()}")
            continue
        if time.perf_counter() > until:
            say(f"probe: deep{depth} {dtype} not timed (no time left)")
            continue
        run = executor(cuda, interface)
        args = make_args(cp, check_source(Source("probe", deep(depth, dtype))).pipelines[0])
        samples = timer(lambda: run(*args), REPS)
        us = statistics.median(samples)
        out.append({"depth": depth, "dtype": dtype, "us": round(us, 2), "samples": [round(s, 2) for s in samples],
                    "kernel": rec})
        say(f"probe: deep{depth} {dtype}: {us:.1f} µs ({us / depth:.2f} a stage), predicted "
            f"{rec['predicted'][0]:.1f}, SASS {rec['sass_bytes']} bytes, {rec['ptxas_regs']} registers")
    return out


def _check(cp, run, args, pipeline, dtype, reference):
    """The outputs (as f32 on the device) when reference is None, else whether they match it."""
    fresh = [a.copy() if isinstance(a, cp.ndarray) else a for a in args]
    out = run(*fresh)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
    outs += [a for a, p in zip(fresh, pipeline.params) if p.role == "inout"]
    got = [o.astype(cp.float32) for o in outs]
    del fresh, out, outs
    if reference is None:
        return got
    # bf16: the unfused form rounds every intermediate to bf16, so the check is against the scale of the values
    rtol, scale = (5e-2, 5e-2) if dtype == "bf16" else (2e-4, 1e-5)

    def magnitude(r):
        finite = cp.abs(r[cp.isfinite(r)])
        return float(finite.max()) if finite.size else 0.0
    return all(bool(cp.allclose(g, r, rtol=rtol, atol=scale * magnitude(r) + 1e-3, equal_nan=True))
               for g, r in zip(got, reference))


def dims_of(pipeline) -> dict[str, int]:
    """The sizes of a run: ELEMENTS, in rows of ROW where the pipeline has rows."""
    return dims_for(pipeline, ELEMENTS, ROW)


def make_args(cp, pipeline):
    """The bench harness's arguments, at `dims_of`."""
    return harness_args(cp, pipeline, dims_of(pipeline), 3)


def report(result) -> str:
    entries = result["candidates"]
    ok = [e for e in entries if e["ok"]]
    best = min(ok, key=lambda e: e["t1"])
    pick = next((e for e in entries if e["how"] == "model's pick"), None)
    if pick is None or not pick["ok"]:
        return f"{result['pipeline']} {result['dtype']}: the model's pick {'failed its check' if pick else 'missing'}"
    return (f"{result['pipeline']} {result['dtype']}: {len(entries)} candidates ({len(entries) - len(ok)} wrong, "
            f"{result['close']} timed again); pick {pick['t1']:.0f} µs ({len(pick['groups'])} kernels, predicted "
            f"{pick['predicted']:.0f}); fastest {best['t1']:.0f} µs ({best['how']}, {len(best['groups'])} kernels, "
            f"predicted {best['predicted']:.0f}); pick/fastest {pick['t1'] / best['t1']:.3f} (second pass), "
            f"{pick['final'] / min(e['final'] for e in ok):.3f} (median of passes)")


# ---------------------------------------------------------------------------
# The table.

def pairs(e, noise, time="t1", predicted="predicted"):
    """(concordant, discordant, tied in prediction) over the pairs whose measured times
    differ by more than 3 % and three times the noise."""
    concordant = discordant = ties = 0
    for i in range(len(e)):
        for j in range(i + 1, len(e)):
            a, b = e[i], e[j]
            if abs(a[time] - b[time]) / min(a[time], b[time]) <= max(0.03, 3 * noise):
                continue
            s = (a[time] - b[time]) * (a[predicted] - b[predicted])
            concordant += s > 0
            discordant += s < 0
            ties += s == 0
    return concordant, discordant, ties


def passes(candidate: dict) -> int:
    """Passes a candidate was timed in (records without samples: the two)."""
    return len(candidate.get("samples") or [0, 0])


def tau_b(c, d, ties):
    """Kendall's tau-b where only the prediction can tie (measured ties were left out)."""
    return (c - d) / math.sqrt((c + d + ties) * (c + d)) if c + d else float("nan")


def summary(shards):
    """The table of every shard's pipelines (a list of pipeline records is read as one shard)."""
    results = []
    for s in shards:
        results += s if isinstance(s, list) else s["pipelines"]
    rows, errors = [], []
    totals = {k: [0, 0, 0] for k in ("t1", "final", "ptxas")}
    for r in results:
        e = [c for c in r["candidates"] if c["ok"]]
        pick = next((c for c in e if c["how"] == "model's pick"), None)
        if pick is None:
            rows.append((r["pipeline"], r["dtype"], len(r["candidates"]), None))
            continue
        for c in e:
            c.setdefault("final", (c["t0"] + c["t1"]) / 2)
        noise = statistics.median(abs(c["t0"] - c["t1"]) / c["t1"] for c in e)
        best = min(e, key=lambda c: c["t1"])
        # on the median of passes, a candidate against those timed in as many passes (the
        # close set's later passes ran on a warmer device: against the others' two, biased)
        def fastest_final(c):
            return min(o["final"] for o in e if passes(o) == passes(c))
        unrefined = next((c for c in e if c["how"].startswith("model's pick before compiling")), pick)
        # fusec tune's pick: by its own timing (records before it was kept: the first pass)
        tuned = min((c for c in e if c.get("tuned")), key=lambda c: c.get("tune_us", c["t0"]), default=pick)
        counts = {"t1": pairs(e, noise), "final": pairs(e, noise, "final"),
                  "ptxas": pairs(e, noise, predicted="predicted_ptxas") if "predicted_ptxas" in pick else (0, 0, 0)}
        for k, (c, d, t) in counts.items():
            totals[k] = [totals[k][0] + c, totals[k][1] + d, totals[k][2] + t]
        err = statistics.median(abs(math.log(c["predicted"] / c["t1"])) for c in e)
        errors += [abs(math.log(c["predicted"] / c["t1"])) for c in e]
        randoms = r.get("randoms", sum(c["how"].startswith("random") for c in r["candidates"]))
        rows.append((r["pipeline"], r["dtype"], len(r["candidates"]), {
            "wrong": len(r["candidates"]) - len(e), "randoms": randoms, "ratio": pick["t1"] / best["t1"],
            "final": pick["final"] / fastest_final(pick), "estimated": unrefined["t1"] / best["t1"],
            "tuned": tuned["t1"] / best["t1"], "tuned_final": tuned["final"] / fastest_final(tuned), "kernels": (len(pick["groups"]), len(best["groups"])),
            "how": best["how"], "tau": tau_b(*counts["t1"]), "pairs": sum(counts["t1"]),
            "tau_final": tau_b(*counts["final"]), "tau_ptxas": tau_b(*counts["ptxas"]), "err": err, "noise": noise,
            "close": r.get("close", 0)}))
    print("\n| pipeline | type | candidates (wrong; random) | pick / fastest (2nd pass) | pick / fastest (median of "
          "passes) | estimate's pick / fastest | tuned / fastest (2nd pass, median of passes) | kernels: pick, fastest | fastest found as | tau-b "
          "(pairs) | tau-b: median of passes, ptxas registers | median abs ln(pred/meas) | noise | timed again |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, dtype, n, x in rows:
        if x is None:
            print(f"| {name} | {dtype} | {n} | the model's pick failed its check | | | | | | | | | | |")
            continue
        print(f"| {name} | {dtype} | {n} ({x['wrong']}; {x['randoms']}) | {x['ratio']:.3f} | {x['final']:.3f} | "
              f"{x['estimated']:.3f} | {x['tuned']:.3f}, {x['tuned_final']:.3f} | {x['kernels'][0]}, {x['kernels'][1]} | {x['how']} | "
              f"{x['tau']:.2f} ({x['pairs']}) | {x['tau_final']:.2f}, {x['tau_ptxas']:.2f} | {x['err']:.2f} | "
              f"{x['noise'] * 100:.1f} % | {x['close']} |")
    measured = [x for *_, x in rows if x is not None]
    taus = [x["tau"] for x in measured if not math.isnan(x["tau"])]
    if not measured:
        print("\nnothing measured")
        return
    print(f"\n{len(rows)} pipelines ({len(rows) - len(measured)} whose pick failed its check). "
          f"Picks within 5 % (second pass): {sum(x['ratio'] <= 1.05 for x in measured)} of {len(rows)}; "
          f"on the median of passes: {sum(x['final'] <= 1.05 for x in measured)}; "
          f"on the estimate alone: {sum(x['estimated'] <= 1.05 for x in measured)}; "
          f"tuned within 2 %: {sum(x['tuned'] <= 1.02 for x in measured)} of {len(rows)} (median of passes: "
          f"{sum(x['tuned_final'] <= 1.02 for x in measured)}); "
          f"Kendall tau-b over all such pairs {tau_b(*totals['t1']):.3f} ({sum(totals['t1'])} pairs; per pipeline "
          f"median {statistics.median(taus) if taus else float('nan'):.3f}, min {min(taus, default=float('nan')):.3f}); "
          f"on the median of passes {tau_b(*totals['final']):.3f}; predicted on ptxas's registers "
          f"{tau_b(*totals['ptxas']):.3f}; median |ln(pred/meas)| {statistics.median(errors):.3f}")
    for s in shards:
        if isinstance(s, dict):
            print(f"shard {s['shard']} ({s['device']}): {len(s['pipelines'])} pipelines in {s.get('elapsed')} s, "
                  f"random partitions planned {s['randoms_planned']} of {s['max_random']}; not measured: "
                  f"{', '.join(s['not_measured']) or 'none'}")
            for p in s.get("probe", []):
                k = p["kernel"]
                print(f"  probe deep{p['depth']} {p['dtype']}: {p['us']:.1f} µs, {p['us'] / p['depth']:.2f} a stage, "
                      f"predicted {k['predicted'][0]:.1f}, SASS {k['sass_bytes']} bytes, {k['ptxas_regs']} registers")


if __name__ == "__main__":
    main()
