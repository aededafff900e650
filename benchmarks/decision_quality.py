"""Does the cost model pick the fastest partition? Candidates timed on the GPU beside its predictions.

    PYTHONPATH=. python3 benchmarks/decision_quality.py [--calibrate] [--f32] [--json OUT.json]
        [--only NAME,NAME] [--shard I/N] [--deadline SECONDS]
    python3 benchmarks/decision_quality.py --summary SHARD.json ...
    bash benchmarks/decision_quality.sh        (every GPU of the host, one shard each)

Pipelines: every example, and generated wide (8-32 inputs, every output mixing
every input through exp/sin/tanh), deep (chains of 16-32 stages) and
transcendental-heavy ones; f32 and bf16, at 2^26 elements. Candidates, chosen
independently of the fusion pass: all fused, unfused, the greedy partitions
under budgets from 32 to 255, the model's five best, every one-move neighbour
of its pick, and random partitions (up to 40). Each is compiled (NVRTC in a
process pool), checked against the unfused result, and timed in two passes in
shuffled order. Reported per pipeline: the model's pick against the fastest
candidate of the second pass; over all candidate pairs whose times differ by
more than 3 % and three times the noise, Kendall's tau-b of predicted and
measured order, and the median |ln(predicted / measured)|; and the pick `fusec
tune` would make (the fastest in the first pass of the partitions it times)
against the fastest of the second pass.

With --calibrate: one pass, and each kernel's features (bytes, arithmetic,
estimated and real registers) written to the JSON for fitting the model.
"""
from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace

from fusec.bench.harness import dims_for, time_gpu
from fusec.bench.harness import make_args as harness_args

ELEMENTS = int(os.environ.get("FUSEC_ELEMENTS", 2 ** 26))
MAX_RANDOM = int(os.environ.get("FUSEC_MAX_RANDOM", 40))


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
        lines, prev = [], "x"
        ops = ("sin({})", "{} * 1.01 + 0.1", "tanh({})", "exp(-abs({}))", "sqrt(abs({}) + 1.0)", "{} * {}")
        for d in range(depth):
            op = ops[d % len(ops)]
            expr = op.format(prev, prev) if op.count("{}") == 2 else op.format(prev)
            name = f"t{d}" if d < depth - 1 else "y"
            lines.append(f"    {name} = {expr} + x * {0.01 * (d + 1):.2f};")
            prev = name
        out[f"deep{depth}"] = f"pipeline deep{depth}(x: f32[n]) -> (y: f32[n]) {{\n" + "\n".join(lines) + "\n}\n"
    for n in (8, 16):
        params = ", ".join(f"x{i}: f32[n]" for i in range(n))
        body = [f"    a{i} = erf(x{i}) * log1p(abs(x{i})) + atan2(x{i}, 1.5);" for i in range(n)]
        body.append("    y = " + " + ".join(f"a{i}" for i in range(n)) + ";")
        out[f"transcendental{n}"] = f"pipeline transcendental{n}({params}) -> (y: f32[n]) {{\n" + "\n".join(body) + "\n}\n"
    return out


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


def candidates(job) -> tuple:
    """In a worker: (name, dtype, groups -> how it was found, groups -> predicted µs, the tune set)."""
    name, dtype, source_text, source_name, seed = job
    from fusec.compiler import CompileOptions, compile_pipeline
    from fusec.errors import Source
    from fusec.frontend import check_source
    from fusec.passes.fusion import CAPS, FusionOptions, Pricer, ranked_partitions
    from fusec.passes.lower import lower
    from fusec.passes.partitions import Context, greedy, neighbours, random_partition
    from fusec.passes import guard
    from fusec.runtime import tuning
    from fusec.runtime.backends.cuda import ptxas_observations
    program = check_source(Source(source_name, source_text))
    pipeline = program.pipelines[0].name
    graph = lower(program, program.pipelines[0])
    ctx = Context.of(graph)
    rng = random.Random(seed)
    found: dict[tuple, str] = {}

    def add(groups, how):
        found.setdefault(tuple(map(tuple, groups)), how)
    # The pick as fusec.jit makes it on the cuda backend: the close candidates
    # compiled and the choice made again on their real registers (guard.refine).
    options = CompileOptions()
    refined = guard.refine(compile_pipeline(program, pipeline, options), options,
                           lambda **c: compile_pipeline(program, pipeline, replace(options, **c)),
                           lambda c: ptxas_observations(c, "sm_90"))
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
    tuned = [groups for groups, _, _ in tuning.candidates(refined, CompileOptions())]
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
    return name, dtype, found, predicted, [tuple(map(tuple, g)) for g in tuned]


def compile_one(job):
    """In a worker: one candidate compiled, its module built for the device (the disk cache keeps it)."""
    source_text, source_name, groups, arch = job
    from fusec.compiler import CompileOptions, compile_pipeline
    from fusec.errors import Source
    from fusec.frontend import check_source
    from fusec.runtime.backends.cuda import compile_module
    program = check_source(Source(source_name, source_text))
    compiled = compile_pipeline(program, program.pipelines[0].name, CompileOptions(partition=groups))
    compile_module(compiled.cuda, arch, native=True)
    return compiled.cuda, compiled.interface


def _flag(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> None:
    if "--summary" in sys.argv:  # the shards' JSON files, one table
        results = []
        for path in sys.argv[sys.argv.index("--summary") + 1:]:
            with open(path) as f:
                results += json.load(f)
        summary(results)
        return
    import multiprocessing

    import cupy as cp

    from fusec.passes.cost import target_costs
    from fusec.runtime.backends.cuda import CudaBackend, device_arch
    from fusec.runtime.executor import Executor
    calibrate = "--calibrate" in sys.argv
    only = _flag("--only")
    only = only.split(",") if only else None
    dtypes = ("f32",) if "--f32" in sys.argv else ("f32", "bf16")
    shard, shards = map(int, _flag("--shard", "0/1").split("/"))
    deadline = float(_flag("--deadline", "1e9"))
    out_path = _flag("--json")
    rng = random.Random(11)
    costs = target_costs("sm_90")
    started = time.perf_counter()
    programs = {(n, d): p for n, d, p in corpus(dtypes) if not only or n in only}
    # shards balanced by source length (a proxy for candidates and compile time)
    load = [0] * shards
    mine = []
    for key in sorted(programs, key=lambda k: -len(programs[k].source.text)):
        s = load.index(min(load))
        load[s] += len(programs[key].source.text)
        if s == shard:
            mine.append(key)
    arch = device_arch()
    workers = max(2, (os.cpu_count() or 4) // shards - 1)
    results = []
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = [(n, d, programs[(n, d)].source.text, programs[(n, d)].source.name, 11) for n, d in mine]
        pending = []
        for future in as_completed([pool.submit(candidates, job) for job in jobs]):
            name, dtype, found, predicted, tuned = future.result()
            program = programs[(name, dtype)]
            builds = {g: pool.submit(compile_one, (program.source.text, program.source.name, g, arch)) for g in found}
            pending.append((name, dtype, found, predicted, tuned, builds))
        print(f"[shard {shard}] {len(pending)} pipelines enumerated, "
              f"{sum(len(p[2]) for p in pending)} candidates [{time.perf_counter() - started:.0f} s]", flush=True)
        for name, dtype, found, predicted, tuned, builds in pending:
            if time.perf_counter() - started > deadline:
                print(f"[shard {shard}] deadline: {name} {dtype} and later not measured", flush=True)
                break
            passes = 1 if calibrate else 2
            try:
                entries = measure(cp, programs[(name, dtype)], dtype, found, predicted, tuned, builds, passes, rng,
                                  lambda cuda, interface: Executor(interface, CudaBackend(cuda, interface)),
                                  lambda fn: time_gpu(cp, fn), costs)
            except Exception:  # one pipeline's failure is reported, the others still measured
                print(f"{name} {dtype}: failed\n{traceback.format_exc()}", flush=True)
                continue
            cp.get_default_memory_pool().free_all_blocks()
            report(name, dtype, entries, passes)
            results.append({"pipeline": name, "dtype": dtype, "candidates": entries})
            print(f"  [shard {shard}, {time.perf_counter() - started:.0f} s]", flush=True)
            if out_path:  # after every pipeline: a run cut short keeps what it measured
                with open(out_path, "w") as f:
                    json.dump(results, f)
        for *_, builds in pending:
            for b in builds.values():
                b.cancel()
    if not calibrate and shards == 1:
        summary(results)


def measure(cp, program, dtype, found, predicted, tuned, builds, passes, rng, executor, timer, costs) -> list[dict]:
    """Each candidate checked against the unfused result, then timed in `passes` shuffled passes."""
    from fusec.passes.cost import compute_ps
    args = make_args(cp, program.pipelines[0])
    order = sorted(found, key=lambda g: found[g] != "unfused")  # the unfused result first: the reference
    reference, entries = None, []
    for groups in order:
        cuda, interface = builds[groups].result()
        run = executor(cuda, interface)
        ok = _check(cp, run, args, program.pipelines[0], dtype, reference)
        if reference is None:
            reference, ok = ok, True
        kernels = []
        for launch in interface.kernels:
            attrs = run.backend.attributes(launch.variants[0].name) if hasattr(run.backend, "attributes") else {}
            kernels.append({"name": launch.name, "est_regs": launch.variants[0].est_regs,
                            "num_regs": attrs.get("num_regs"), "local": attrs.get("local_size_bytes"),
                            "ept": launch.variants[0].elements_per_thread,
                            "bytes": launch.prediction.bytes_per_element,
                            "loaded": sum(a.type.itemsize for a in launch.kernel.loads if a.contiguous),
                            "compute_ps": compute_ps(launch.kernel, costs),
                            "predicted_us": launch.prediction.us})
        entries.append({"groups": groups, "how": found[groups], "ok": bool(ok), "tuned": groups in tuned,
                        "predicted": predicted[groups], "kernels": kernels, "run": run})
    del reference
    for p in range(passes):
        shuffled = list(range(len(entries)))
        rng.shuffle(shuffled)
        for idx in shuffled:
            e = entries[idx]
            e[f"t{p}"] = timer(lambda: e["run"](*args))
    for e in entries:
        e.pop("run")
    return entries


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


def make_args(cp, pipeline):
    """The bench harness's arguments: rows of 1024 where the pipeline has rows."""
    return harness_args(cp, pipeline, dims_for(pipeline, ELEMENTS, 1024), 3)


def report(name, dtype, entries, passes):
    key = f"t{passes - 1}"
    ok = [e for e in entries if e["ok"]]
    best = min(ok, key=lambda e: e[key])
    pick = next(e for e in entries if e["how"] == "model's pick")
    print(f"{name} {dtype}: {len(entries)} candidates ({len(entries) - len(ok)} wrong); "
          f"pick {pick[key]:.0f} µs ({len(pick['groups'])} kernels, predicted {pick['predicted']:.0f}); "
          f"fastest {best[key]:.0f} µs ({best['how']}, {len(best['groups'])} kernels, "
          f"predicted {best['predicted']:.0f}); pick/fastest {pick[key] / best[key]:.3f}", flush=True)


def pairs(e, noise):
    """(concordant, discordant, tied in prediction) over the pairs whose measured times
    differ by more than 3 % and three times the noise."""
    concordant = discordant = ties = 0
    for i in range(len(e)):
        for j in range(i + 1, len(e)):
            a, b = e[i], e[j]
            if abs(a["t1"] - b["t1"]) / min(a["t1"], b["t1"]) <= max(0.03, 3 * noise):
                continue
            s = (a["t1"] - b["t1"]) * (a["predicted"] - b["predicted"])
            concordant += s > 0
            discordant += s < 0
            ties += s == 0
    return concordant, discordant, ties


def tau_b(c, d, ties):
    """Kendall's tau-b where only the prediction can tie (measured ties were left out)."""
    return (c - d) / math.sqrt((c + d + ties) * (c + d)) if c + d else float("nan")


def summary(results):
    rows, errors, total = [], [], [0, 0, 0]
    for r in results:
        e = [c for c in r["candidates"] if c["ok"]]
        noise = statistics.median(abs(c["t0"] - c["t1"]) / c["t1"] for c in e)
        best = min(e, key=lambda c: c["t1"])
        pick = next(c for c in e if c["how"] == "model's pick")
        unrefined = next((c for c in e if c["how"].startswith("model's pick before compiling")), pick)
        tuned = min((c for c in e if c.get("tuned")), key=lambda c: c["t0"], default=pick)
        c, d, t = pairs(e, noise)
        total = [total[0] + c, total[1] + d, total[2] + t]
        err = statistics.median(abs(math.log(c_["predicted"] / c_["t1"])) for c_ in e)
        errors += [abs(math.log(c_["predicted"] / c_["t1"])) for c_ in e]
        rows.append((r["pipeline"], r["dtype"], len(r["candidates"]), len(r["candidates"]) - len(e),
                     pick["t1"] / best["t1"], unrefined["t1"] / best["t1"], tuned["t1"] / best["t1"], len(pick["groups"]), len(best["groups"]),
                     best["how"], tau_b(c, d, t), c + d + t, err, noise))
    print("\n| pipeline | type | candidates (wrong) | pick / fastest | estimate's pick / fastest | tuned / fastest | kernels: pick, fastest "
          "| fastest found as | tau-b (pairs) | median abs ln(pred/meas) | noise |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for name, dtype, n, wrong, ratio, estimated, tuned, kp, kb, how, tau, npairs, err, noise in rows:
        print(f"| {name} | {dtype} | {n} ({wrong}) | {ratio:.3f} | {estimated:.3f} | {tuned:.3f} | {kp}, {kb} | {how} | "
              f"{tau:.2f} ({npairs}) | {err:.2f} | {noise * 100:.1f} % |")
    taus = [r[10] for r in rows if not math.isnan(r[10])]
    print(f"\n{len(rows)} pipelines. Picks within 5 %: {sum(r[4] <= 1.05 for r in rows)} of {len(rows)} "
          f"(on the estimate alone: {sum(r[5] <= 1.05 for r in rows)}); "
          f"tuned within 2 %: {sum(r[6] <= 1.02 for r in rows)} of {len(rows)}; "
          f"Kendall tau-b over all such pairs {tau_b(*total):.3f} ({sum(total)} pairs; per pipeline median "
          f"{statistics.median(taus):.3f}, min {min(taus):.3f}); "
          f"median |ln(pred/meas)| {statistics.median(errors):.3f}")


if __name__ == "__main__":
    main()
