"""Where a fusec call's host time goes, at 4096 elements: the parts timed alone,
then cProfile of the whole call. Run: PYTHONPATH=. python3 benchmarks/dispatch_profile.py"""
import cProfile
import pstats
import time

import cupy as cp
import numpy as np

import fusec


def per_call(fn, iters=20000):
    for _ in range(100):
        fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - start) * 1e6 / iters


f = fusec.jit("examples/scale_bias_relu.fz", backend="cuda")
x = cp.ones(4096, cp.float32)
y = f(x, 1.5, -0.25)
backend = f._runner.backend
kernel = f.compiled.plan.kernels[0]
function, block = backend.kernels[f"{kernel.name}_v{kernel.vector}"]
args = [x, y, np.float32(1.5), np.float32(-0.25), np.int64(4096)]
raw = cp.RawKernel(f.cuda_source, f"{kernel.name}_v{kernel.vector}")
print(f"| whole call f(x, s, b) (a seen signature: the replayed call) | {per_call(lambda: f(x, 1.5, -0.25)):.2f} µs |")
print(f"| f(x, s, b, out=y) (the checked path) | {per_call(lambda: f(x, 1.5, -0.25, out=y)):.2f} µs |")
f.__dict__.pop("_runner")  # a fresh executor, its seen signatures forgotten
runner = f._runner
print(f"| a call with a signature never seen (the checked path) | "
      f"{per_call(lambda: (runner._calls.clear(), runner._seen.clear(), f(x, 1.5, -0.25))):.2f} µs |")
print(f"| a call seen once before (the checked path, recording) | "
      f"{per_call(lambda: (runner._calls.clear(), f(x, 1.5, -0.25))):.2f} µs |")
try:
    import torch
    t = torch.ones(4096, device="cuda")
    f(t, 1.5, -0.25), f(t, 1.5, -0.25)
    print(f"| f(t, s, b) with a torch tensor (a seen signature) | {per_call(lambda: f(t, 1.5, -0.25)):.2f} µs |")
except ImportError:
    pass
print(f"| cupy.empty(4096) | {per_call(lambda: cp.empty(4096, cp.float32)):.2f} µs |")
print(f"| Function call, prepared arguments | {per_call(lambda: function((4,), (256,), args)):.2f} µs |")
print(f"| cupy.RawKernel call, prepared arguments | {per_call(lambda: raw((4,), (256,), args)):.2f} µs |")
cProfile.run("for _ in range(20000): f(x, 1.5, -0.25)", "/tmp/dispatch.prof")
pstats.Stats("/tmp/dispatch.prof").sort_stats("tottime").print_stats(14)

# The same for a replay under graph=True: the seed's chain unfused (three kernels).
g = fusec.jit("examples/scale_bias_relu.fz", backend="cuda", fuse=False, graph=True)
g(x, 1.5, -0.25)
graph = next(iter(g._runner._graphs.values()))[0]
print(f"| graph replay g(x, s, b), unfused | {per_call(lambda: g(x, 1.5, -0.25)):.2f} µs |")
print(f"| cupy.cuda.Graph.launch() of the same graph | {per_call(graph.launch):.2f} µs |")
cProfile.run("for _ in range(20000): g(x, 1.5, -0.25)", "/tmp/graph.prof")
pstats.Stats("/tmp/graph.prof").sort_stats("tottime").print_stats(10)
