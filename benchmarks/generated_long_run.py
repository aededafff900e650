"""The generator's long run: many generated programs through every check the tests make.

    python benchmarks/generated_long_run.py --count 20000 --jobs 2 --sim-every 25 --json run.json
    python benchmarks/generated_long_run.py --shrink 1234 --stage compile   # a small repro of one failure

Each program (tests/generator.py, seeds START.. START+COUNT) goes through the front end (a valid
one must check; an invalid one must raise located errors on its mistake's line), and each accepted
one through the reference at every size profile and the fused, unfused and persistent compiles;
every 50th through the CLI; every SIM_EVERY-th valid, compilable one through the three sim forms
(tests/helpers.py: bit for bit between forms, tolerances in ulps against the reference). The checks
run in worker processes with glibc's heap checks on (`helpers.check_seeds_isolated`), so that a crash
(a stray write in the sim) is recorded against its seed and the run goes on. Prints the figures and
the failures grouped by kind, each with the first seeds that show it. --shrink drops lines of one
seed's program while the same kind of failure stays (in-process: not for a crash).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

STAGES = ("front end", "reference", "compile", "cli", "sim")  # as in helpers.CHECKS


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
            groups[(stage, signature(text.splitlines()[0] if text else ""))].append(r["seed"])
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

    import helpers

    from fusec.errors import FzError
    program = helpers.generate(seed)
    target = helpers.check_seed(seed)["failures"].get(stage)
    if target is None:
        return f"seed {seed}: no failure in {stage}"
    kind = signature(target.splitlines()[0])

    def fails(lines: list[str]) -> bool:
        candidate = dataclasses.replace(program, source="\n".join(lines) + "\n")
        saved, helpers.generate = helpers.generate, lambda *a, **k: candidate
        try:
            got = helpers.check_seed(seed)["failures"].get(stage)
        except (Exception, FzError):
            return False
        finally:
            helpers.generate = saved
        return got is not None and signature(got.splitlines()[0]) == kind
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
    args = parser.parse_args()
    os.environ.setdefault("FUSEC_CACHE_DIR", str(Path(tempfile.gettempdir()) / "fusec-long-run"))
    if args.shrink is not None:
        print(shrink(args.shrink, args.stage))
        return 0
    import helpers
    started = time.time()

    def progress(done: int) -> None:
        if done % 500 == 0:
            print(f"{done} programs, {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    records = helpers.check_seeds_isolated(range(args.start, args.start + args.count), min(args.jobs, args.count),
                                           sim_every=args.sim_every, cli_every=50, progress=progress)
    summary = summarize(records, time.time() - started)
    print_summary(summary)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "records": records}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
