"""Does the cost model pick the fastest partition? Candidates timed on the GPU beside its predictions.

    PYTHONPATH=. python3 benchmarks/decision_quality.py [--calibrate] [--json OUT.json] [--only NAME ...]

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
measured order, and the median |ln(predicted / measured)|.

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
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from fusec.bench.harness import time_gpu

ELEMENTS = 2 ** 26
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


def candidates(job) -> tuple[str, str, dict[tuple, str], dict[tuple, float]]:
    """In a worker: (name, dtype, groups -> how it was found, groups -> predicted µs)."""
    name, dtype, source_text, source_name, seed = job
    from fusec.errors import Source
    from fusec.frontend import check_source
    from fusec.passes.fusion import CAPS, FusionOptions, Pricer, ranked_partitions
    from fusec.passes.lower import lower
    from fusec.passes.partitions import Context, greedy, neighbours, random_partition
    program = check_source(Source(source_name, source_text))
    graph = lower(program, program.pipelines[0])
    ctx = Context.of(graph)
    pricer = Pricer(ctx, FusionOptions())
    rng = random.Random(seed)
    found: dict[tuple, str] = {}

    def add(groups, how):
        found.setdefault(tuple(map(tuple, groups)), how)
    ranked = ranked_partitions(graph)
    pick = ranked[0][2]
    add(pick, "model's pick")
    add([[i] for i in sorted(ctx.live)], "unfused")
    add(greedy(ctx, lambda g, s: None)[0], "all fused")
    for cap in CAPS:
        add(greedy(ctx, pricer.within(cap))[0], f"greedy {cap}")
    for us, how, groups in ranked[1:5]:
        add(groups, f"model's rank ({how})")
    for n in neighbours(ctx, [list(g) for g in pick]):
        add(n, "neighbour of the pick")
    for _ in range(MAX_RANDOM * 3):
        if sum(1 for how in found.values() if how == "random") >= MAX_RANDOM:
            break
        add(random_partition(ctx, rng), "random")
    predicted = {g: pricer.total([list(x) for x in g]) for g in found}
    for g in sorted(found, key=predicted.get)[:5]:  # the model's five best among everything found
        if found[g] != "model's pick":
            found[g] += " (model top 5)"
    return name, dtype, found, predicted


def compile_one(job):
    """In a worker: one candidate compiled, its module built for the device (the disk cache keeps it)."""
    source_text, source_name, groups = job
    from fusec.compiler import CompileOptions, compile_pipeline
    from fusec.errors import Source
    from fusec.frontend import check_source
    from fusec.runtime.backends.cuda import compile_module, device_arch
    program = check_source(Source(source_name, source_text))
    compiled = compile_pipeline(program, program.pipelines[0].name, CompileOptions(partition=groups))
    compile_module(compiled.cuda, device_arch(), native=True)
    return compiled.cuda, compiled.interface


def main() -> None:
    import cupy as cp

    from fusec.passes.cost import compute_ps, target_costs
    from fusec.runtime.backends.cuda import CudaBackend
    from fusec.runtime.executor import Executor
    calibrate = "--calibrate" in sys.argv
    only = sys.argv[sys.argv.index("--only") + 1:] if "--only" in sys.argv else None
    dtypes = ("f32",) if "--f32" in sys.argv else ("f32", "bf16")
    rng = random.Random(11)
    costs = target_costs("sm_90")
    started = time.perf_counter()
    programs = {(n, d): p for n, d, p in corpus(dtypes) if not only or n in only}
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        jobs = [(n, d, p.source.text, p.source.name, 11) for (n, d), p in programs.items()]
        enumerated = list(pool.map(candidates, jobs))
        print(f"candidates enumerated [{time.perf_counter() - started:.0f} s]", flush=True)
        compile_jobs = [(programs[(n, d)].source.text, programs[(n, d)].source.name, g)
                        for n, d, found, _ in enumerated for g in found]
        built = iter(pool.map(compile_one, compile_jobs, chunksize=1))
        modules = {(n, d, g): next(built) for n, d, found, _ in enumerated for g in found}
        print(f"{len(modules)} candidates compiled [{time.perf_counter() - started:.0f} s]", flush=True)
    results = []
    for name, dtype, found, predicted in enumerated:
        program = programs[(name, dtype)]
        args = make_args(cp, program.pipelines[0])
        reference = None
        entries = []
        for groups, how in found.items():
            cuda, interface = modules[(name, dtype, groups)]
            run = Executor(interface, CudaBackend(cuda, interface))
            fresh = [a.copy() if isinstance(a, cp.ndarray) else a for a in args]
            out = run(*fresh)
            outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
            outs += [a for a, p in zip(fresh, program.pipelines[0].params) if p.role == "inout"]
            got = [cp.asnumpy(o).astype(np.float64) for o in outs]
            del fresh, out, outs
            if reference is None:
                reference = got
            ok = all(np.allclose(g, r, rtol=3e-2 if dtype == "bf16" else 2e-4, atol=1e-3, equal_nan=True)
                     for g, r in zip(got, reference))
            kernels = []
            for launch in interface.kernels:
                attrs = run.backend.attributes(launch.variants[0].name)
                kernels.append({"name": launch.name, "est_regs": launch.variants[0].est_regs,
                                "num_regs": attrs["num_regs"], "local": attrs["local_size_bytes"],
                                "ept": launch.variants[0].elements_per_thread,
                                "bytes": launch.prediction.bytes_per_element,
                                "loaded": sum(a.type.itemsize for a in launch.kernel.loads if a.contiguous),
                                "compute_ps": compute_ps(launch.kernel, costs),
                                "predicted_us": launch.prediction.us})
            entries.append({"groups": groups, "how": how, "ok": bool(ok), "predicted": predicted[groups],
                            "kernels": kernels, "run": run})
        passes = 1 if calibrate else 2
        for p in range(passes):
            order = list(range(len(entries)))
            rng.shuffle(order)
            for idx in order:
                e = entries[idx]
                e[f"t{p}"] = time_gpu(cp, lambda: e["run"](*args))
        for e in entries:
            e.pop("run")
        report(name, dtype, entries, passes)
        results.append({"pipeline": name, "dtype": dtype, "candidates": entries})
        print(f"  [{time.perf_counter() - started:.0f} s]", flush=True)
        if "--json" in sys.argv:  # after every pipeline: a run cut short keeps what it measured
            with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
                json.dump(results, f)
    if not calibrate:
        summary(results)


def make_args(cp, pipeline):
    rng = cp.random.default_rng(3)
    args = []
    for p in pipeline.params:
        if p.shape is None:
            args.append(5 if p.type.is_int else 0.3)
            continue
        shape = tuple(d if isinstance(d, int) else (ELEMENTS // 1024 if len(p.shape) > 1 and j == 0 else
                                                   (1024 if len(p.shape) > 1 else ELEMENTS))
                      for j, d in enumerate(p.shape))
        a = rng.standard_normal(shape, dtype=cp.float32) * 0.5 + 0.1
        if p.name == "stiffness":
            a = cp.abs(a) + 0.5
        args.append(a.astype(p.type.numpy_dtype))
    return args


def report(name, dtype, entries, passes):
    key = f"t{passes - 1}"
    ok = [e for e in entries if e["ok"]]
    best = min(ok, key=lambda e: e[key])
    pick = next(e for e in entries if e["how"].startswith("model's pick"))
    print(f"{name} {dtype}: {len(entries)} candidates ({len(entries) - len(ok)} wrong); "
          f"pick {pick[key]:.0f} µs ({len(pick['groups'])} kernels, predicted {pick['predicted']:.0f}); "
          f"fastest {best[key]:.0f} µs ({best['how']}, {len(best['groups'])} kernels); "
          f"pick/fastest {pick[key] / best[key]:.3f}", flush=True)


def summary(results):
    rows, taus, errors = [], [], []
    for r in results:
        e = [c for c in r["candidates"] if c["ok"]]
        noise = statistics.median(abs(c["t0"] - c["t1"]) / c["t1"] for c in e)
        best = min(e, key=lambda c: c["t1"])
        pick = next(c for c in e if c["how"].startswith("model's pick"))
        rows.append((r["pipeline"], r["dtype"], pick["t1"] / best["t1"], len(e), noise))
        concordant = discordant = 0
        for i in range(len(e)):
            for j in range(i + 1, len(e)):
                a, b = e[i], e[j]
                diff = abs(a["t1"] - b["t1"]) / min(a["t1"], b["t1"])
                if diff <= max(0.03, 3 * noise):
                    continue
                s = (a["t1"] - b["t1"]) * (a["predicted"] - b["predicted"])
                concordant += s > 0
                discordant += s < 0
        if concordant + discordant:
            taus.append((concordant - discordant) / (concordant + discordant))
        errors += [abs(math.log(c["predicted"] / c["t1"])) for c in e]
    print("\n| pipeline | type | candidates | pick / fastest | noise |\n|---|---|---|---|---|")
    for name, dtype, ratio, n, noise in rows:
        print(f"| {name} | {dtype} | {n} | {ratio:.3f} | {noise * 100:.1f} % |")
    print(f"\npicks within 5 %: {sum(r[2] <= 1.05 for r in rows)} of {len(rows)}; "
          f"Kendall tau (pairs > 3 %): median {statistics.median(taus):.3f}, min {min(taus):.3f}; "
          f"median |ln(pred/meas)| {statistics.median(errors):.3f}")


if __name__ == "__main__":
    main()
