"""Issue 6's three measurements, in one run on the H200. Every result is
checked (against the NumPy reference or torch) before it is timed.

    PYTHONPATH=. python3 benchmarks/beyond_fusion.py [graphs] [repeat] [foreach]

µs/call is the median of back-to-back loops timed with CUDA events (for a
launch-bound call that is the host's dispatch rate); "host µs" is what the
calling thread spends per call. Each table is the median of three rounds.

1. CUDA graphs: the seed's chain unfused at 2^12 elements, plain and as one
   graph replay, beside a bare CuPy kernel launch and a bare graph launch.
2. repeat: examples/time_step.fz at 2^20 elements, 100 steps: one persistent
   kernel, the unfused form (200 launches), and the unfused form as a graph.
3. foreach: one Adam step over 193 f32 tensors shaped like a 12-layer
   transformer's parameters (hidden 512, vocabulary 25,000: ~51 M values):
   fusec's one launch, fusec's one launch per tensor, torch's fused and
   foreach Adam, and a device copy moving the same bytes.
"""
import sys

import cupy as cp
import numpy as np
import torch

import fusec
from fusec.bench.harness import time_gpu, time_host
from fusec.reference import run as reference


def table(title, variants, base_label, host=True, iters=500, extra=None):
    """Each variant timed in turn, three rounds (the host's speed drifts within
    a run, and several variants are host-bound); the medians, with a speed-up
    against base_label, and each round's device-clock µs. Returns the medians."""
    rounds = [{label: both(fn, host, iters) for label, fn in variants.items()} for _ in range(3)]
    rows = {label: (float(np.median([r[label][0] for r in rounds])),
                    float(np.median([r[label][1] for r in rounds])) if host else None) for label in variants}
    rows |= extra or {}
    print(f"\n### {title}\n\n| variant | µs/call | host µs/call | speed-up |\n|---|---|---|---|")
    base = rows[base_label][0]
    for label, (us, host_us) in rows.items():
        print(f"| {label} | {us:.1f} | {'' if host_us is None else f'{host_us:.1f}'} | {base / us:.2f}× |")
    print("\nEach round (µs/call): " + "; ".join(
        f"{label}: {', '.join(f'{r[label][0]:.1f}' for r in rounds)}" for label in variants))
    return rows


def both(fn, host, iters):
    """(µs per call on the device's clock, host µs per call). Few iterations for
    a long call, so that the host never waits for a full launch queue."""
    return time_gpu(cp, fn), (time_host(cp, fn, iters=iters) if host else None)


SECTIONS = sys.argv[1:] or ["graphs", "repeat", "foreach"]


def graphs():
    x = cp.random.standard_normal(4096, dtype=cp.float32)
    plain = fusec.jit("examples/scale_bias_relu.fz", fuse=False)
    graph = fusec.jit("examples/scale_bias_relu.fz", fuse=False, graph=True)
    for scale in (1.5, -2.0):
        expected = reference(graph.program, "scale_bias_relu", x.get(), scale, -0.25)
        np.testing.assert_allclose(graph(x, scale, -0.25).get(), expected, rtol=1e-6)
        np.testing.assert_allclose(plain(x, scale, -0.25).get(), expected, rtol=1e-6)
    captured = next(iter(graph._runner._graphs.values()))[0]
    copy = cp.RawKernel(r'''extern "C" __global__ void copy4(const float4* a, float4* b, long long n)
    { long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) b[i] = a[i]; }''', "copy4")
    y = cp.empty_like(x)
    copy_args = (x, y, np.int64(1024))
    table("CUDA graphs: the seed's chain unfused, 2^12 f32", {
        "three launches (fusec unfused)": lambda: plain(x, 1.5, -0.25),
        "one graph replay (fusec unfused, graph=True)": lambda: graph(x, 1.5, -0.25),
        "bare CuPy kernel launch (a float4 copy), for scale": lambda: copy((4,), (256,), copy_args),
        "bare cupy.cuda.Graph.launch of the same graph, for scale": captured.launch,
    }, "three launches (fusec unfused)")


def repeat():
    n = 2 ** 20
    rng = cp.random.default_rng(0)
    xs, vs = rng.standard_normal(n, dtype=cp.float32), rng.standard_normal(n, dtype=cp.float32)
    k = rng.random(n, dtype=cp.float32) + 0.5
    forms = {"one persistent kernel (fusec fused)": fusec.jit("examples/time_step.fz"),
             "200 launches (fusec unfused)": fusec.jit("examples/time_step.fz", fuse=False),
             "200 launches as one graph (fusec unfused, graph=True)":
                 fusec.jit("examples/time_step.fz", fuse=False, graph=True)}
    program = forms["200 launches (fusec unfused)"].program
    hx, hv = xs.get(), vs.get()
    reference(program, "time_step", hx, hv, k.get(), 0.1, 0.01)
    for f in forms.values():
        x1, v1 = xs.copy(), vs.copy()
        f(x1, v1, k, 0.1, 0.01)
        np.testing.assert_allclose(x1.get(), hx, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(v1.get(), hv, rtol=1e-3, atol=1e-4)
    table("repeat: examples/time_step.fz, 2^20 f32 elements × 100 steps",
          {label: lambda f=f: f(xs, vs, k, 0.1, 0.01) for label, f in forms.items()},
          "200 launches (fusec unfused)", host=False)


def foreach():
    hidden, layers, vocab = 512, 12, 25_000
    h = hidden
    layer = [(h,), (h,), (3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,),
             (h,), (h,), (h,), (h,)]
    shapes = [(vocab, hidden)] + layer * layers
    total = sum(int(np.prod(s)) for s in shapes)
    params = [torch.randn(s, device="cuda") for s in shapes]
    grads = [torch.randn(s, device="cuda") for s in shapes]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    optimizers = {}
    for kind in ("fused", "foreach"):
        copies = [p.clone().requires_grad_() for p in params]
        for p, g in zip(copies, grads):
            p.grad = g.clone()
        optimizers[kind] = (torch.optim.Adam(copies, lr=1e-3, **{kind: True}), copies)
    sets = [(p.view(-1), g.view(-1), mm.view(-1), vv.view(-1)) for p, g, mm, vv in zip(params, grads, m, v)]
    adam = fusec.jit("examples/adam.fz")
    scalars = (1e-3, 0.9, 0.999, 1e-8, 1 - 0.9, 1 - 0.999)
    adam.foreach(sets, *scalars)
    for opt, copies in optimizers.values():
        opt.step()
        for p, r in zip(params, copies):
            torch.testing.assert_close(p, r.detach(), rtol=1e-5, atol=1e-6)
    cupy_sets = [tuple(cp.from_dlpack(t) for t in s) for s in sets]  # imported once: the per-tensor loop's best case
    source = cp.empty(total * 7 // 2, cp.float32)
    target = cp.empty_like(source)
    variants = {
        "torch.optim.Adam(fused=True)": optimizers["fused"][0].step,
        "torch.optim.Adam(foreach=True)": optimizers["foreach"][0].step,
        "fusec foreach, one launch (torch tensors)": lambda: adam.foreach(sets, *scalars),
        "fusec, one launch per tensor (CuPy views)": lambda: [adam(*s, *scalars) for s in cupy_sets],
    }
    copy = {"device copy of the same bytes (the limit)": both(lambda: cp.copyto(target, source), False, 0)}
    rows = table(f"foreach: one Adam step, {len(shapes)} f32 tensors, {total / 1e6:.1f} M values "
                 f"({total * 28 / 1e9:.2f} GB moved)", variants, "torch.optim.Adam(fused=True)", iters=10, extra=copy)
    print(f"\nfusec foreach: {total * 28 / rows['fusec foreach, one launch (torch tensors)'][0] / 1e6:.2f} TB/s; "
          f"the copy: {total * 28 / rows['device copy of the same bytes (the limit)'][0] / 1e6:.2f} TB/s")


for section in SECTIONS:
    {"graphs": graphs, "repeat": repeat, "foreach": foreach}[section]()
