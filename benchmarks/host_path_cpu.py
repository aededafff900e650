"""The cuda backend's host path without a GPU: CuPy and the CUDA driver replaced
by stand-ins whose calls cost (almost) nothing, so what is timed is fusec's own
Python per call (binder, executor, recorded calls, the backend's packing).

    PYTHONPATH=. python3 benchmarks/host_path_cpu.py [--profile checked|replay|new]

Figures are for comparing two versions of fusec on one machine; the device's
own costs (a launch, an allocation) are measured by benchmarks/launch_floor.py.
"""
import cProfile
import pstats
import sys
import time
import types

import numpy as np

import fusec
import fusec.jit
import fusec.passes.guard as guard
from fusec.runtime.backends import cuda


class MemoryPointer:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr):
        self.ptr, self.device_id = ptr, 0


class ndarray:  # what the cuda backend reads of a CuPy array
    _next = 1 << 20

    def __init__(self, shape, dtype=np.float32):
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        self.dtype = np.dtype(dtype)
        self.strides = (self.dtype.itemsize,)
        self.size = self.shape[0] if len(self.shape) == 1 else int(np.prod(self.shape))
        self.nbytes = self.size * self.dtype.itemsize
        ndarray._next += 1 << 16
        self.data = MemoryPointer(ndarray._next)
        self._c_contiguous, self._strides = True, self.strides
        self.flags = types.SimpleNamespace(c_contiguous=True)


class Device:
    id, compute_capability, attributes = 0, "90", {"MultiProcessorCount": 132}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


STREAM = types.SimpleNamespace(ptr=0)
cp = types.SimpleNamespace(
    ndarray=ndarray, empty=ndarray, asarray=lambda a: a,
    cuda=types.SimpleNamespace(get_current_stream=lambda: STREAM, runtime=types.SimpleNamespace(getDevice=lambda: 0),
                               Device=lambda *a: Device()))
driver = types.SimpleNamespace(cuLaunchKernel=lambda *a: (0,), cuModuleGetFunction=lambda *a: (0, "function"),
                               cuOccupancyMaxActiveBlocksPerMultiprocessor=lambda *a: (0, 8))
cuda.cupy, cuda.driver, cuda.available, cuda.device_arch = (lambda: cp), (lambda: driver), (lambda: True), (lambda: "sm_90")
cuda.load_module, cuda.checked, cuda.function_attribute = (lambda *a: None), (lambda r: r[1]), (lambda f, a: 1024)
fusec.jit.resolve_backend = lambda backend: "cuda"
guard.replan, guard.observe = (lambda compiled, observed, again: compiled), (lambda compiled, attributes: ())


def per_call(fn, n=30000):
    for _ in range(300):
        fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) * 1e6 / n)
    return best


def main():
    f = fusec.jit("examples/scale_bias_relu.fz", backend="cuda")
    x = ndarray(4096)
    y = f(x, 1.5, -0.25)
    runner = f._runner

    def new_signature():
        runner._seen.clear()
        runner._calls.clear()
        f(x, 1.5, -0.25)
    calls = {"replay": lambda: f(x, 1.5, -0.25), "checked": lambda: f(x, 1.5, -0.25, out=y), "new": new_signature}
    print("| call | µs (fusec's Python alone) |\n|---|---|")
    for name, what in (("replay", "f(x, s, b), replayed"), ("checked", "f(x, s, b, out=y), replayed"),
                       ("new", "f(x, s, b), a new signature: checked in full")):
        print(f"| {what} | {per_call(calls[name]):.2f} |")
    if "--profile" in sys.argv:
        which = calls[sys.argv[sys.argv.index("--profile") + 1]]
        cProfile.runctx("for _ in range(30000): which()", globals(), {"which": which}, "/tmp/host_path.prof")
        pstats.Stats("/tmp/host_path.prof").sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
