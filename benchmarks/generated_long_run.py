"""The generator's long run: many generated programs through every check the tests make.

    python benchmarks/generated_long_run.py --count 20000 --jobs 2 --sim-every 25 --json run.json
    python benchmarks/generated_long_run.py --shrink 1234 --stage compile   # a minimal repro of one failure

Each program (tests/generator.py, seeds START.. START+COUNT) goes through the front end (a valid
one must check; an invalid one must raise located errors on its mistake's line), and each accepted
one through the reference at every size profile and the fused, unfused and persistent compiles;
every 50th through the CLI; every SIM_EVERY-th valid, compilable one through the three sim forms
(tests/helpers.py: bit for bit between forms, tolerances in ulps against the reference). Workers
are processes of their own, with glibc's heap checks on, so that a crash (a stray write in the sim)
is recorded against its seed and the run goes on. Prints the figures and the failures grouped by
kind, each with the first seeds that show it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

STAGES = ("front end", "reference", "compile", "cli", "sim")


def check_one(seed: int, sim: bool) -> dict:
    """Every check of one program; the first failure of each stage, as text."""
    import generator
    import helpers

    from fusec.errors import FzError
    record = {"seed": seed, "failures": {}}
    program = generator.generate(seed)
    record.update(valid=program.valid, mistake=program.mistake)
    try:
        checked = helpers.check_generated(program)
    except AssertionError as exc:
        record["failures"]["front end"] = _first_line(exc)
        return record
    except Exception as exc:
        record["failures"]["front end"] = f"internal: {type(exc).__name__}: {exc}"
        return record
    record["accepted"] = checked is not None
    if checked is None:
        return record
    for stage, check in (("reference", lambda: helpers.check_generated_reference(program, checked)),
                         ("compile", lambda: helpers.check_generated_compiles(program, checked)),
                         ("cli", lambda: _cli(program) if seed % 50 == 0 else None),
                         ("sim", lambda: _sim(program, checked, record) if sim and program.compiles else None)):
        try:
            check()
        except AssertionError as exc:
            record["failures"][stage] = _first_line(exc)
        except FzError as exc:
            record["failures"][stage] = f"FzError: {str(exc).splitlines()[0]}"
        except Exception as exc:
            record["failures"][stage] = f"internal: {type(exc).__name__}: {exc}"
    record["sim"] = sim and program.compiles
    return record


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else f"{type(exc).__name__} at {traceback.format_tb(exc.__traceback__)[-1]}"


def _cli(program) -> None:
    from fusec.cli import main
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / program.name
        path.write_text(program.source)
        for flags in ([], ["--unfused"], ["--persistent", "--emit", "report"], ["--emit", "ir"]):
            out = Path(folder) / "out.txt"
            code = main(["compile", str(path), "--pipeline", program.pipeline, "-o", str(out), *flags])
            assert code == (0 if program.compiles else 1), f"fusec compile {' '.join(flags)}: exit {code}"


def _sim(program, checked, record: dict) -> None:
    import helpers

    import fusec
    pipelines = {form: fusec.jit(program.source, backend="sim", pipeline=program.pipeline, **options)
                 for form, options in helpers.SIM_FORMS.items()}
    record["floats"] = {}
    helpers.check_generated_sim(program, checked, pipelines, record["floats"])


# ---- workers: one process each; a line of JSON per program


def worker(seeds: list[int], sim_every: int) -> None:
    warnings.simplefilter("ignore")
    for seed in seeds:
        print(json.dumps({"start": seed}), flush=True)
        record = check_one(seed, sim=sim_every > 0 and seed % sim_every == 0)
        print(json.dumps(record), flush=True)


def run(seeds: list[int], jobs: int, sim_every: int) -> list[dict]:
    """Consecutive seeds, split among `jobs` worker processes; a worker that dies is restarted after its seed."""
    env = dict(os.environ, MALLOC_CHECK_="3", PYTHONWARNINGS="ignore")
    pending = [list(range(seeds[0] + k, seeds[-1] + 1, jobs)) for k in range(jobs)]
    records, procs = [], {}
    started = time.time()

    logs = [tempfile.TemporaryFile("w+") for _ in range(jobs)]  # a pipe could fill and stall a worker

    def spawn(k):
        if pending[k]:
            logs[k].seek(0)
            logs[k].truncate()
            seeds_left = f"{pending[k][0]}:{pending[k][-1] + 1}:{jobs}"  # what is left of this worker's share
            procs[k] = (subprocess.Popen([sys.executable, __file__, "--worker", seeds_left,
                                          "--sim-every", str(sim_every)], stdout=subprocess.PIPE,
                                         stderr=logs[k], text=True, env=env), None)
    for k in range(jobs):
        spawn(k)
    while procs:
        for k, (proc, _) in list(procs.items()):
            line = proc.stdout.readline()
            if line:
                item = json.loads(line)
                if "start" in item:
                    procs[k] = (proc, item["start"])
                else:
                    records.append(item)
                    pending[k].remove(item["seed"])
                    if len(records) % 500 == 0:
                        print(f"{len(records)} programs, {time.time() - started:.0f} s", file=sys.stderr, flush=True)
                continue
            proc.wait()
            current = procs.pop(k)[1]
            if current is not None and current in pending[k]:  # it died on this seed
                logs[k].seek(0)
                err = logs[k].read().strip().splitlines()
                records.append({"seed": current, "failures": {"crash": (err[-1] if err else f"exit {proc.returncode}")},
                                "crashed": True})
                pending[k].remove(current)
            spawn(k)
    return sorted(records, key=lambda r: r["seed"])


# ---- figures


def signature(text: str) -> str:
    """A failure's kind: its message with names, numbers and quoted values blurred."""
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\b\d[\d.e+-]*\b", "N", text)
    text = re.sub(r"\[\[.*?\]\]|\[[^\]]*\]", "[…]", text)
    text = re.sub(r"np\.\w+\([^)]*\)", "V", text)
    return text[:160]


def summarize(records: list[dict], elapsed: float) -> dict:
    tried = len(records)
    valid = sum(1 for r in records if r.get("valid"))
    accepted = sum(1 for r in records if r.get("accepted"))
    rejected = sum(1 for r in records if r.get("accepted") is False)
    internal = sum(1 for r in records if any(v.startswith("internal") for v in r["failures"].values()))
    crashes = sum(1 for r in records if r.get("crashed"))
    sim_runs = sum(1 for r in records if r.get("sim"))
    disagree = sum(1 for r in records if "sim" in r["failures"] and not r["failures"]["sim"].startswith("internal"))
    floats = collections.Counter()
    for r in records:
        floats.update(r.get("floats", {}))
    groups = collections.defaultdict(list)
    for r in records:
        for stage, text in r["failures"].items():
            groups[(stage, signature(text))].append(r["seed"])
    return {"tried": tried, "generated valid": valid, "accepted": accepted, "rejected with a located error": rejected,
            "programs with a failure": sum(1 for r in records if r["failures"]), "internal errors": internal,
            "crashes": crashes, "through the sim": sim_runs, "sim disagreements": disagree,
            "float elements compared": floats["elements"], "beyond their tolerance": floats["beyond"],
            "excused as ill-conditioned": floats["excused"],
            "seconds": round(elapsed),
            "failures": [{"stage": stage, "kind": kind, "programs": len(seeds), "seeds": seeds[:8]}
                         for (stage, kind), seeds in sorted(groups.items(), key=lambda g: -len(g[1]))]}


def print_summary(summary: dict) -> None:
    for key, value in summary.items():
        if key != "failures":
            print(f"{key}: {value}")
    print("\n| stage | failure | programs | first seeds |\n|---|---|---|---|")
    for f in summary["failures"]:
        print(f"| {f['stage']} | {f['kind'].replace('|', '/')} | {f['programs']} | {', '.join(map(str, f['seeds']))} |")


# ---- shrinking one failure to a small repro


def shrink(seed: int, stage: str) -> str:
    """Drops lines of the program for `seed` while the same kind of failure stays in `stage`."""
    import dataclasses

    import generator
    program = generator.generate(seed)
    target = check_one(seed, sim=stage == "sim")["failures"].get(stage)
    if target is None:
        return f"seed {seed}: no failure in {stage}"
    kind = signature(target)

    def fails(lines: list[str]) -> bool:
        candidate = dataclasses.replace(program, source="\n".join(lines) + "\n")
        saved, generator.generate = generator.generate, lambda *a, **k: candidate
        try:
            got = check_one(seed, sim=stage == "sim")["failures"].get(stage)
        except Exception:
            return False
        finally:
            generator.generate = saved
        return got is not None and signature(got) == kind
    lines = program.source.rstrip("\n").split("\n")
    changed = True
    while changed:
        changed = False
        for i in range(len(lines)):
            if fails(lines[:i] + lines[i + 1:]):
                lines = lines[:i] + lines[i + 1:]
                changed = True
                break
    return f"# seed {seed}, {stage}: {target}\n" + "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--sim-every", type=int, default=25, help="every Nth seed also on the sim (0: none)")
    parser.add_argument("--json", help="write the records and the summary here")
    parser.add_argument("--shrink", type=int, metavar="SEED", help="print a small repro of SEED's failure")
    parser.add_argument("--stage", choices=STAGES, default="compile", help="the stage whose failure --shrink keeps")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("FUSEC_CACHE_DIR", str(Path(tempfile.gettempdir()) / "fusec-long-run"))
    if args.worker:
        worker(list(range(*map(int, args.worker.split(":")))), args.sim_every)
        return 0
    if args.shrink is not None:
        print(shrink(args.shrink, args.stage))
        return 0
    started = time.time()
    records = run(list(range(args.start, args.start + args.count)), min(args.jobs, args.count), args.sim_every)
    summary = summarize(records, time.time() - started)
    print_summary(summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "records": records}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
