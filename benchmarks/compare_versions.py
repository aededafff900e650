"""Two fusec source trees timed side by side on the GPU, in one run.

    python3 benchmarks/compare_versions.py OLD_TREE NEW_TREE [--rounds 3]

Each round runs a child process per tree (`PYTHONPATH=TREE`), alternating, so
the host's and the device's drift falls on both alike; the table gives each
figure's median over the rounds and new / old. Only fusec's public API is
used, so any two versions compare. Every result is checked against the NumPy
reference before anything is timed.

Figures: every example both trees have, fused (a file's first pipeline), f32, µs per call at 2^26 elements (CUDA events);
host µs per call at 4096 elements for a checked call (`out=` given), a
replayed call (the same arrays as the two calls before), a graph replay
(`graph=True`, the seed's chain unfused: three kernels) and one foreach Adam
step over 193 f32 tensors (~51 M values, torch tensors).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, os, statistics, sys, time
from pathlib import Path
import cupy as cp, numpy as np
import fusec
from fusec.reference import run as reference

def gpu_us(fn, reps=5):
    fn(); cp.cuda.Device().synchronize()
    t = time.perf_counter(); fn(); cp.cuda.Device().synchronize()
    iters = max(1, min(200, int(0.02 / max(time.perf_counter() - t, 1e-6))))
    out = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(iters): fn()
        b.record(); b.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, b) * 1000 / iters)
    return statistics.median(out)

def host_us(fn, iters=2000, reps=5):
    for _ in range(50): fn()
    out = []
    for _ in range(reps):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        for _ in range(iters): fn()
        out.append((time.perf_counter() - t) * 1e6 / iters)
    cp.cuda.Device().synchronize()
    return statistics.median(out)

import ml_dtypes
DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64, "bool": np.bool_,
          **{f"{k}{b}": np.dtype(f"{'int' if k == 'i' else 'uint'}{b}") for k in "iu" for b in (8, 16, 32, 64)}}

def args_for(program, n, seed, xp):
    rng = np.random.default_rng(seed)
    pipeline = program.pipelines[0]
    dims = {}
    for p in pipeline.params:
        for j, d in enumerate(p.shape or ()):
            if isinstance(d, str):
                dims.setdefault(d, 1024 if (len(p.shape) > 1 and j == len(p.shape) - 1) else None)
    inner = 1024 if any(v == 1024 for v in dims.values()) else 1
    dims = {d: (v or n // inner) for d, v in dims.items()}
    out = []
    for p in pipeline.params:
        if p.shape is None:
            out.append(7 if p.type.name.startswith(("i", "u")) else 0.5)
            continue
        shape = tuple(d if isinstance(d, int) else dims[d] for d in p.shape)
        a = (rng.standard_normal(shape) * 0.5 + 0.1).astype(np.float32)
        if p.name == "stiffness":  # time_step's oscillator in its stable range
            a = np.abs(a) + 0.5
        out.append(xp.asarray(a.astype(DTYPES[p.type.name])))
    if pipeline.name == "time_step":
        out[3:5] = [0.1, 0.05]
    return out

result = {}
for path in os.environ["FUSEC_COMPARE_EXAMPLES"].split():
    f = fusec.jit(path, backend="cuda")
    if not callable(f):  # a file of several pipelines: its first
        f = getattr(f, f.program.pipelines[0].name)
    program = f.program
    host = args_for(program, 4096 + 3, 1, np)
    expected = reference(program, program.pipelines[0].name, *[a.copy() if isinstance(a, np.ndarray) else a for a in host])
    dev = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in host]
    got = f(*dev)
    for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
        if e is not None:
            tol = 2e-2 if np.asarray(e).dtype.itemsize == 2 else 1e-4
            np.testing.assert_allclose(cp.asnumpy(g).astype(np.float64), np.asarray(e).astype(np.float64), rtol=tol, atol=tol)
    big = args_for(program, 2 ** 26, 2, cp)
    result[f"{Path(path).stem} fused, 2^26, µs"] = gpu_us(lambda: f(*big))

f = fusec.jit("examples/scale_bias_relu.fz", backend="cuda")
x = cp.random.standard_normal(4096, dtype=cp.float32)
y = f(x, 1.5, -0.25)
np.testing.assert_allclose(y.get(), np.maximum(x.get() * 1.5 - 0.25, 0), rtol=1e-5, atol=1e-6)
result["host µs: checked call (out=)"] = host_us(lambda: f(x, 1.5, -0.25, out=y))
result["host µs: replayed call"] = host_us(lambda: f(x, 1.5, -0.25))
g = fusec.jit("examples/scale_bias_relu.fz", backend="cuda", fuse=False, graph=True)
np.testing.assert_allclose(g(x, 1.5, -0.25).get(), y.get(), rtol=1e-5, atol=1e-6)
result["host µs: graph replay (3 kernels)"] = host_us(lambda: g(x, 1.5, -0.25))

import torch
h, layers, vocab = 512, 12, 25_000
layer = [(h,), (h,), (3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,), (h,), (h,), (h,), (h,)]
shapes = [(vocab, h)] + layer * layers
params = [torch.randn(s, device="cuda") for s in shapes]
grads = [torch.randn(s, device="cuda") for s in shapes]
m = [torch.zeros_like(p) for p in params]
v = [torch.zeros_like(p) for p in params]
sets = [(p.view(-1), gg.view(-1), mm.view(-1), vv.view(-1)) for p, gg, mm, vv in zip(params, grads, m, v)]
adam = fusec.jit("examples/adam.fz", backend="cuda")
scalars = (1e-3, 0.9, 0.999, 1e-8, 1 - 0.9, 1 - 0.999)
copies = [p.clone() for p in params]
adam.foreach(sets, *scalars)
p0, g0 = copies[1], grads[1]
mm = 0.1 * g0; vv = 0.001 * g0 * g0
ref = p0 - 1e-3 * (mm / 0.1) / (torch.sqrt(vv / 0.001) + 1e-8)
torch.testing.assert_close(params[1], ref, rtol=1e-5, atol=1e-6)
result["host µs: foreach Adam step (193 tensors)"] = host_us(lambda: adam.foreach(sets, *scalars), iters=200)
result["device µs: foreach Adam step (193 tensors)"] = gpu_us(lambda: adam.foreach(sets, *scalars))
print("RESULT " + json.dumps(result))
'''


def run_tree(tree: Path, examples: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{tree}:{os.environ.get('PYTHONPATH', '')}",
               FUSEC_COMPARE_EXAMPLES=" ".join(examples))
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=tree, env=env, capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{tree} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    old, new = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    # The examples both trees have (a later tree adds some), each file's first pipeline.
    examples = sorted({p.name for p in old.glob("examples/*.fz")} & {p.name for p in new.glob("examples/*.fz")})
    examples = [f"examples/{name}" for name in examples]
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for r in range(rounds):
        for label, tree in (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old)):
            runs[label].append(run_tree(tree, examples))
            print(f"round {r + 1}: {label} done", flush=True)
    print(f"\n| figure | old ({old.name}) | new ({new.name}) | new / old |\n|---|---|---|---|")
    for key in runs["old"][0]:
        a = statistics.median(run[key] for run in runs["old"])
        b = statistics.median(run[key] for run in runs["new"])
        print(f"| {key} | {a:.1f} | {b:.1f} | {b / a:.3f} |")


if __name__ == "__main__":
    main()
