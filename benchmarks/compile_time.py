"""Cold and warm compile time of the seed's chain through fusec.jit: one new
process each, timed from after the imports to the end of the first call.
Run: PYTHONPATH=. python3 benchmarks/compile_time.py"""
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import time, cupy as cp, fusec
x = cp.ones(4096, cp.float32); cp.cuda.Device().synchronize()
t = time.perf_counter()
f = fusec.jit("examples/scale_bias_relu.fz")
f(x, 1.5, -0.25); cp.cuda.Device().synchronize()
print(f"{(time.perf_counter() - t) * 1000:.1f}")
'''
with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, FUSEC_CACHE_DIR=cache)
    for label in ("cold (empty disk cache)", "warm (disk cache)", "warm (disk cache)"):
        ms = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
        print(f"| {label} | {ms.stdout.strip()} ms |")
