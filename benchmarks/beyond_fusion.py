"""Issue 6's three measurements, in one run (not yet run on the H200: the
session that wrote it had no device time left). Checks each result first.

    PYTHONPATH=. python3 benchmarks/beyond_fusion.py

1. CUDA graphs: the seed's chain unfused at 2^12 elements, plain and as one
   graph replay (`fusec bench examples/scale_bias_relu.fz --graph` gives more).
2. repeat: examples/time_step.fz at 2^20 elements, 100 steps: one persistent
   kernel, the unfused form (200 launches), and the unfused form as a graph.
3. foreach: one Adam step over ~200 f32 tensors shaped like a transformer's
   parameters (~50 M values): fusec's one launch, fusec's one launch per tensor,
   and torch.optim.Adam(fused=True).
"""
import cupy as cp
import numpy as np
import torch

import fusec
from fusec.bench import time_gpu
from fusec.reference import run as reference


def row(label, us, base=None):
    ratio = f"{base / us:.2f}×" if base else ""
    print(f"| {label} | {us:.1f} | {ratio} |")


print("| variant | µs/call | speed-up |\n|---|---|---|")

# 1. graphs
x = cp.random.standard_normal(4096, dtype=cp.float32)
plain = fusec.jit("examples/scale_bias_relu.fz", fuse=False)
graph = fusec.jit("examples/scale_bias_relu.fz", fuse=False, graph=True)
np.testing.assert_allclose(graph(x, 1.5, -0.25).get(), plain(x, 1.5, -0.25).get())
base = time_gpu(cp, lambda: plain(x, 1.5, -0.25))
row("seed's chain, unfused, 2^12: three launches", base)
row("seed's chain, unfused, 2^12: one graph replay", time_gpu(cp, lambda: graph(x, 1.5, -0.25)), base)

# 2. repeat
n = 2 ** 20
rng = cp.random.default_rng(0)
xs, vs = rng.standard_normal(n, dtype=cp.float32), rng.standard_normal(n, dtype=cp.float32)
k = rng.random(n, dtype=cp.float32) + 0.5
forms = {"persistent (fused)": fusec.jit("examples/time_step.fz"),
         "unfused (200 launches)": fusec.jit("examples/time_step.fz", fuse=False),
         "unfused, one graph": fusec.jit("examples/time_step.fz", fuse=False, graph=True)}
program = forms["persistent (fused)"].program
hx, hv = xs.get(), vs.get()
reference(program, "time_step", hx, hv, k.get(), 0.1, 0.01)
for label, f in forms.items():
    x1, v1 = xs.copy(), vs.copy()
    f(x1, v1, k, 0.1, 0.01)
    np.testing.assert_allclose(x1.get(), hx, rtol=1e-3, atol=1e-4)
times = {label: time_gpu(cp, lambda f=f: f(xs, vs, k, 0.1, 0.01)) for label, f in forms.items()}
for label, us in times.items():
    row(f"time_step 2^20 × 100 steps: {label}", us, times["unfused (200 launches)"])

# 3. foreach against torch's fused Adam
hidden, layers, vocab = 1024, 12, 8192
shapes = [(vocab, hidden)] + [s for _ in range(layers) for s in
                              [(hidden,), (hidden,), (3 * hidden, hidden), (3 * hidden,), (hidden, hidden), (hidden,),
                               (hidden,), (hidden,), (4 * hidden, hidden), (4 * hidden,), (hidden, 4 * hidden),
                               (hidden,), (hidden,), (hidden,), (hidden,), (hidden,)]]
params = [torch.randn(s, device="cuda") for s in shapes]
grads = [torch.randn(s, device="cuda") for s in shapes]
print(f"<!-- {len(shapes)} tensors, {sum(p.numel() for p in params) / 1e6:.1f} M values -->")
ref = [p.clone().requires_grad_() for p in params]
opt = torch.optim.Adam(ref, lr=1e-3, fused=True)
for p, g in zip(ref, grads):
    p.grad = g.clone()
m = [torch.zeros_like(p) for p in params]
v = [torch.zeros_like(p) for p in params]
sets = [(p.view(-1), g.view(-1), mm.view(-1), vv.view(-1)) for p, g, mm, vv in zip(params, grads, m, v)]
adam = fusec.jit("examples/adam.fz")
scalars = (1e-3, 0.9, 0.999, 1e-8, 1 - 0.9, 1 - 0.999)
adam.foreach(sets, *scalars)
opt.step()
for p, r in zip(params, ref):
    torch.testing.assert_close(p, r.detach(), rtol=1e-5, atol=1e-6)
torch_us = time_gpu(cp, opt.step)
row("Adam step, ~200 tensors: torch.optim.Adam(fused=True)", torch_us)
row("Adam step, ~200 tensors: fusec foreach (one launch)", time_gpu(cp, lambda: adam.foreach(sets, *scalars)), torch_us)
row("Adam step, ~200 tensors: fusec, one launch per tensor",
    time_gpu(cp, lambda: [adam(*s, *scalars) for s in sets]), torch_us)
