"""The cuda backend's host path without a GPU: fusec's own Python per call (binder,
executor, recorded calls, the launch as written out), with CuPy replaced by a stand-in
and the CUDA driver by a stub library whose functions return at once, under NVIDIA's
real bindings (cuda.bindings, so their argument conversions are counted); where no C
compiler or no cuda.bindings is found, by a Python stand-in.

    PYTHONPATH=. python3 benchmarks/host_path_cpu.py [--entry ex|plain] [--profile replay|held|out|fresh|new] [--check]

--check: the replayed launches as the bindings hand them to the stub, against the checked
path's; --launch-floor: benchmarks/launch_floor.py run through over the stand-ins (both are
run by tests/test_launch_bindings_sim.py).

Figures are for comparing two versions of fusec on one machine; the device's own costs
(a launch in the driver, an allocation from CuPy's pool) are what benchmarks/launch_floor.py
measures. The stand-in's allocation (a Python class, slower than CuPy's) is its own row.
"""
import cProfile
import ctypes
import hashlib
import itertools
import os
import pstats
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

STUB = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
typedef int CUresult;
uint64_t launches;
static uintptr_t next_handle = 0x10000;
CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }
CUresult cuGetErrorName(CUresult error, const char **name) { *name = "CUDA_ERROR_STUB"; return 0; }
CUresult cuGetErrorString(CUresult error, const char **text) { *text = "stub"; return 0; }
CUresult cuModuleGetFunction(void **f, void *module, const char *name) { *f = (void *)(next_handle += 64); return 0; }
CUresult cuFuncGetAttribute(int *value, int attribute, void *f) { *value = 1024; return 0; }
CUresult cuFuncSetAttribute(void *f, int attribute, int value) { return 0; }
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void *f, int block, size_t shared) { *n = 8; return 0; }
CUresult cuOccupancyMaxActiveClusters(int *n, void *f, const void *config) { *n = 4; return 0; }
/* The last launch, as the driver got it (read back by --check). */
uint64_t last_function, last_grid, last_block, last_shared, last_stream, last_params, last_cluster;
static CUresult record(void *f, unsigned grid, unsigned block, unsigned shared, void *stream, void **params) {
    launches++;
    last_function = (uintptr_t)f, last_grid = grid, last_block = block, last_shared = shared;
    last_stream = (uintptr_t)stream, last_params = (uintptr_t)params;
    return 0;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
    last_cluster = 0;
    return gy * gz * by * bz != 1 || extra ? 1 : record(f, gx, bx, shared, stream, params);
}
typedef struct { unsigned id; char pad[4]; union { char raw[64]; struct { unsigned x, y, z; } cluster; } value; } Attr;
typedef struct { unsigned gx, gy, gz, bx, by, bz, shared; void *stream; Attr *attrs; unsigned n_attrs; } Config;
CUresult cuLaunchKernelEx(const Config *c, void *f, void **params, void **extra) {
    last_cluster = c->n_attrs ? c->attrs[0].value.cluster.x : 0;
    return c->gy * c->gz * c->by * c->bz != 1 || extra ? 1 : record(f, c->gx, c->bx, c->shared, c->stream, params);
}
CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, uint64_t flags, int *status) {
    *fn = dlsym(RTLD_DEFAULT, symbol);
    if (status) *status = *fn ? 0 : 1;
    return *fn ? 0 : 500;
}
CUresult cuGetProcAddress(const char *symbol, void **fn, int version, uint64_t flags) {
    return cuGetProcAddress_v2(symbol, fn, version, flags, 0);
}
"""


def stub_driver():
    """NVIDIA's driver bindings over the stub library (loaded first, under the driver's
    soname, so the bindings' loader finds it), or None where that cannot be built."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    path = os.path.join(tempfile.gettempdir(), f"fusec-stub-{hashlib.sha1(STUB.encode()).hexdigest()[:12]}",
                        "libcuda.so.1")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        source = path[:-len("libcuda.so.1")] + "stub.c"
        with open(source, "w") as f:
            f.write(STUB)
        try:
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", path, source, "-ldl"],
                           check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            return None
    global STUB_LIBRARY
    STUB_LIBRARY = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return driver if driver.cuInit(0)[0] == 0 else None


STUB_LIBRARY = None


def last_launch(layout) -> tuple:
    """The stub driver's last launch: function, grid, block, shared bytes, stream, cluster
    and the arguments read through the kernelParams it got (laid out as `layout`)."""
    read = [ctypes.c_uint64.in_dll(STUB_LIBRARY, "last_" + name).value
            for name in ("function", "grid", "block", "shared", "stream", "cluster", "params")]
    first = ctypes.cast(read[-1], ctypes.POINTER(ctypes.c_void_p))[0]
    return (*read[:-1], layout.unpack(ctypes.string_at(first, layout.size)))


class MemoryPointer:
    __slots__ = ("ptr", "device_id", "mem")

    def __init__(self, ptr):
        self.ptr, self.device_id, self.mem = ptr, 0, object()


class ndarray:  # what the cuda backend reads of a CuPy array
    __slots__ = ("shape", "dtype", "strides", "size", "nbytes", "data", "_c_contiguous", "_strides", "flags",
                 "__weakref__")
    _next, made = 1 << 20, set()  # the addresses handed out

    def __init__(self, shape, dtype=np.float32, memptr=None):
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        self.dtype = np.dtype(dtype)
        self.strides = (self.dtype.itemsize,)
        self.size = self.shape[0] if len(self.shape) == 1 else int(np.prod(self.shape))
        self.nbytes = self.size * self.dtype.itemsize
        ndarray._next += 1 << 16
        ndarray.made.add(ndarray._next)
        self.data = MemoryPointer(ndarray._next)
        self._c_contiguous, self._strides = True, self.strides
        self.flags = types.SimpleNamespace(c_contiguous=True)


    def __setitem__(self, index, value):  # what launch_floor.py does to an array, done to nothing
        pass

    def __eq__(self, other):
        return types.SimpleNamespace(all=lambda: True)

    __hash__ = object.__hash__


class Device:
    id, compute_capability, attributes = 0, "90", {"MultiProcessorCount": 132}

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


STATE = types.SimpleNamespace(stream=types.SimpleNamespace(ptr=0), allocator=object())  # CuPy's current ones


def standins(entry: str):
    """fusec's cuda backend over the stand-ins; the driver module it launches through."""
    import fusec.jit
    import fusec.passes.guard as guard
    from fusec.runtime.backends import cuda
    cp = types.SimpleNamespace(
        ndarray=ndarray, empty=ndarray, asarray=lambda a: a,
        cuda=types.SimpleNamespace(get_current_stream=lambda: STATE.stream, Device=lambda *a: Device(),
                                   runtime=types.SimpleNamespace(getDevice=lambda: 0),
                                   get_allocator=lambda: STATE.allocator))
    driver = stub_driver()
    if driver is None:  # the Python stand-in: the bindings' own conversions are not counted
        print("(no stub driver: cuda.bindings or a C compiler is missing; the driver is a Python stand-in)")
        config = types.SimpleNamespace
        driver = types.SimpleNamespace(
            cuLaunchKernel=lambda *a: (0,), cuLaunchKernelEx=lambda *a: (0,), CUstream=int,
            CUlaunchConfig=lambda: config(numAttrs=0), cuModuleGetFunction=lambda *a: (0, "function"),
            cuOccupancyMaxActiveBlocksPerMultiprocessor=lambda *a: (0, 8))
        cuda.checked, cuda.function_attribute = (lambda r: r[1]), (lambda f, a: 1024)
    cuda.cupy, cuda.driver, cuda.available, cuda.device_arch = (lambda: cp), (lambda: driver), (lambda: True), \
        (lambda: "sm_90")
    cuda.load_module = lambda *a: getattr(driver, "CUmodule", int)(1)
    if hasattr(cuda, "LAUNCH_ENTRY"):
        cuda.LAUNCH_ENTRY = entry
    fusec.jit.resolve_backend = lambda backend: "cuda"
    guard.replan, guard.observe = (lambda compiled, observed, again: compiled), (lambda compiled, attributes: ())
    return driver


def per_call(fn, window_us=2000, windows=60):
    """µs per call: the least over many windows of about 2 ms (one another process
    interrupted is dropped)."""
    start = time.perf_counter()
    for _ in range(300):
        fn()
    n = max(20, int(window_us * 300 / ((time.perf_counter() - start) * 1e6)))
    best = float("inf")
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) * 1e6 / n)
    return best


def check(entry: str) -> int:
    """--check: each launch of replayed calls (new scalars, the stream changed, the result
    dropped or held), as NVIDIA's bindings hand it to the stub driver, read back through the
    kernelParams it got, against the checked path's launch of the same call."""
    if standins(entry) is None or STUB_LIBRARY is None:
        print("--check needs cuda.bindings and a C compiler")
        return 2
    import fusec
    failures = 0
    for fuse in ("auto", "none"):
        f = fusec.jit("examples/scale_bias_relu.fz", backend="cuda", fuse=fuse)
        x, held = ndarray(4096), []
        f(x, 1.0, 0.0)
        runner = f._runner
        layouts = {int(function): arguments.layout for function, _, arguments in runner.backend.functions.values()}

        def launched(call):
            result = call()
            function = ctypes.c_uint64.in_dll(STUB_LIBRARY, "last_function").value
            *launch, args = last_launch(layouts[function])
            names = {result.data.ptr: "y", x.data.ptr: "x"}  # and any other array: a temporary
            return (*launch, tuple(names.get(a, "t" if a in ndarray.made else a) for a in args)), result
        for handle, s, b, hold in ((0, 1.5, -0.25, False), (1234, 2.0, 1.0, True), (1234, -1.0, 3, False),
                                   (0, 0.5, 0.5, True), (99, 1.0, 0.0, False)):
            STATE.stream = types.SimpleNamespace(ptr=handle)
            for _ in range(3):  # the third call replays
                replayed, result = launched(lambda: f(x, s, b))
            if hold:
                held.append(result)
            calls, seen, last = dict(runner._calls), set(runner._seen), (runner._last_plain[0], runner._last_out[0])
            runner.forget()
            checked, _ = launched(lambda: f(x, s, b))  # nothing recorded: the checked path's launch
            runner.forget()
            runner._calls.update(calls)
            runner._seen.update(seen)
            runner._last_plain[0], runner._last_out[0] = last
            ok = replayed == checked and replayed[4] == handle and "y" in replayed[-1]
            failures += not ok
            print(f"{'ok' if ok else 'FAILED'}: fuse={fuse} stream {handle} s={s} b={b}: {replayed}"
                  + ("" if ok else f" (checked: {checked})"))
    print(f"{failures} failed")
    return 1 if failures else 0


def launch_floor_dry_run() -> int:
    """--launch-floor: benchmarks/launch_floor.py's main over the stand-ins, each row a few
    calls, and what CuPy's calls beyond fusec's return answered by stand-ins, so that its
    control flow and the fusec internals it reads run without a GPU (its figures mean nothing)."""
    if standins("ex") is None or STUB_LIBRARY is None:
        print("--launch-floor needs cuda.bindings and a C compiler")
        return 2
    import importlib.util

    from fusec.runtime.backends import cuda
    cp, ns = cuda.cupy(), types.SimpleNamespace
    memory = ns(malloc=lambda n: MemoryPointer(0))
    cp.__dict__.update(__version__="stand-in", float32=np.float32, dtype=np.dtype, zeros_like=lambda a: ndarray(a.shape),
                       ones=lambda n, dtype: ndarray(n, dtype), get_default_memory_pool=lambda: memory,
                       random=ns(default_rng=lambda seed: ns(standard_normal=lambda n, dtype: ndarray(n, dtype))),
                       RawKernel=lambda source, name, options=(): lambda grid, block, args: None)
    cp.cuda.__dict__.update(alloc=memory.malloc)
    cp.cuda.runtime.__dict__.update(getDeviceProperties=lambda device: {"name": b"stand-in"})
    sys.modules["cupy"] = cp
    spec = importlib.util.spec_from_file_location("launch_floor", os.path.join(os.path.dirname(__file__),
                                                                               "launch_floor.py"))
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    floor.per_call = lambda fn, sync, iters=0, reps=0: (sync(), [fn() for _ in range(3)], 1.0)[-1]
    floor.main()
    return 0


def main():
    entry = sys.argv[sys.argv.index("--entry") + 1] if "--entry" in sys.argv else "ex"
    if "--check" in sys.argv:
        sys.exit(check(entry))
    if "--launch-floor" in sys.argv:
        sys.exit(launch_floor_dry_run())
    driver = standins(entry)
    import fusec
    f = fusec.jit("examples/scale_bias_relu.fz", backend="cuda")
    x = ndarray(4096)
    y = f(x, 1.5, -0.25)
    runner = f._runner
    held = [None, None, None]

    def held_output():  # y = f(x) in a loop keeps the last results: the recorded call allocates
        held.append(f(x, 1.5, -0.25))
        del held[0]

    def new_signature():
        if hasattr(runner, "forget"):
            runner.forget()
        else:  # fusec before Executor.forget
            runner._seen.clear()
            runner._calls.clear()
        f(x, 1.5, -0.25)
    inputs = itertools.cycle([ndarray(4096) for _ in range(512)])  # more than the keys a runner keeps
    calls = {"replay": lambda: f(x, 1.5, -0.25), "held": held_output, "out": lambda: f(x, 1.5, -0.25, out=y),
             "fresh": lambda: f(next(inputs), 1.5, -0.25), "new": new_signature}
    print(f"| call (launch entry: {entry}) | µs (fusec's Python alone) |\n|---|---|")
    for name, what in (("replay", "f(x, s, b), replayed, the result dropped"),
                       ("held", "f(x, s, b), replayed, the last three results held"),
                       ("out", "f(x, s, b, out=y), replayed"),
                       ("fresh", "f(x_k, s, b), another input array each call (512 in turn), the result dropped"),
                       ("new", "f(x, s, b), a new signature: checked in full")):
        print(f"| {what} | {per_call(calls[name]):.2f} |")
    print(f"| the stand-in's ndarray(shape, dtype) alone | {per_call(lambda: ndarray((4096,), np.float32)):.2f} |")
    if hasattr(driver, "CUfunction"):  # the bindings' own share of a launch (the stub returns at once)
        function, params, stream = driver.CUfunction(0x1000), ctypes.addressof(ctypes.c_void_p(0)), driver.CUstream(0)
        config = driver.CUlaunchConfig()
        config.gridDimX = config.gridDimY = config.gridDimZ = config.blockDimY = config.blockDimZ = 1
        config.blockDimX, config.hStream = 256, stream
        print(f"| cuda.bindings cuLaunchKernel, its Python alone | "
              f"{per_call(lambda: driver.cuLaunchKernel(function, 4, 1, 1, 256, 1, 1, 0, 0, params, 0)):.2f} |")
        print(f"| cuda.bindings cuLaunchKernelEx, its Python alone | "
              f"{per_call(lambda: driver.cuLaunchKernelEx(config, function, params, 0)):.2f} |")
    if "--profile" in sys.argv:
        which = calls[sys.argv[sys.argv.index("--profile") + 1]]
        cProfile.runctx("for _ in range(30000): which()", globals(), {"which": which}, "/tmp/host_path.prof")
        pstats.Stats("/tmp/host_path.prof").sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
