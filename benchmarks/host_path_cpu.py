"""The cuda backend's host path without a GPU: fusec's own Python per call (binder,
executor, recorded calls, the launch as written out), with CuPy replaced by a stand-in
and the CUDA driver by a stub library whose functions return at once, under NVIDIA's
real bindings (cuda.bindings, so their argument conversions are counted); where no C
compiler or no cuda.bindings is found, by a Python stand-in. With torch installed, the
torch-tensor call too: CPU tensors stand in for CUDA ones (torch allocates on the CPU).

    PYTHONPATH=. python3 benchmarks/host_path_cpu.py [--entry ex|plain] [--parts] [--quick]
        [--profile replay|held|out|fresh|new|torch|torch_held|torch_out] [--check] [--launch-floor]

--parts: where the µs of the allocating calls go (CuPy's with its results held, a torch
tensor's), each part timed alone in the generated code's namespace; --quick: every row
run, but a few windows each (what it measures means little: the tests run it);
--check: the replayed launches as the bindings hand them to the stub, against the checked
path's; --launch-floor: benchmarks/launch_floor.py run through over the stand-ins (these
three are run by tests/test_launch_bindings_sim.py).

Figures are for comparing two versions of fusec on one machine; the device's own costs
(a launch in the driver, an allocation from CuPy's pool or torch's) are what
benchmarks/launch_floor.py measures. The stand-ins are written as CuPy writes its own
(cupy.ndarray(shape, dtype) asks cupy.cuda.get_allocator, which reads a threading.local,
for the allocator in use; a pool's malloc), in Python, so slower than CuPy's: each has
its own row, as has torch's allocation on the CPU.
"""
import collections
import cProfile
import ctypes
import hashlib
import itertools
import os
import pstats
import re
import subprocess
import sys
import tempfile
import threading
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


def malloc(nbytes):
    """The stand-in memory pool's malloc (CuPy's current allocator): a new address each call."""
    ndarray._next += 1 << 16
    if ndarray.made is not None:
        ndarray.made.add(ndarray._next)
    return MemoryPointer(ndarray._next)


_thread_local = threading.local()


def get_allocator():
    """cupy.cuda.get_allocator as CuPy writes it: the thread's own allocator where it set one
    (a threading.local read in a function of its own), else the process's current one."""
    try:
        allocator = _thread_local.allocator
    except AttributeError:
        allocator = _thread_local.allocator = None
    return STATE.allocator if allocator is None else allocator


class ndarray:  # what the cuda backend reads of a CuPy array
    __slots__ = ("shape", "dtype", "strides", "size", "nbytes", "data", "_c_contiguous", "_strides", "flags",
                 "__weakref__")
    _next, made = 1 << 20, None  # the addresses handed out, where --check keeps them (a set)

    def __init__(self, shape, dtype=np.float32, memptr=None, strides=None):
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        self.dtype = np.dtype(dtype)
        self.strides = (self.dtype.itemsize,) if strides is None else tuple(strides)
        self.size = self.shape[0] if len(self.shape) == 1 else int(np.prod(self.shape))
        self.nbytes = self.size * self.dtype.itemsize
        # CuPy's ndarray(shape, dtype) calls the current allocator (cupy.cuda.alloc); given memory, it takes it
        self.data = get_allocator()(self.nbytes) if memptr is None else memptr
        self._c_contiguous, self._strides = True, self.strides
        self.flags = types.SimpleNamespace(c_contiguous=True)

    def __setitem__(self, index, value):  # what launch_floor.py does to an array, done to nothing
        pass

    def __eq__(self, other):
        return types.SimpleNamespace(all=lambda: True)

    __hash__ = object.__hash__


class Device:
    compute_capability, attributes = "90", {"MultiProcessorCount": 132}

    @property
    def id(self):
        return STATE.device

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# CuPy's current stream, allocator and device (-1 for the torch rows: a CPU tensor's get_device())
STATE = types.SimpleNamespace(stream=types.SimpleNamespace(ptr=0), allocator=malloc, device=0)


def standins(entry: str):
    """fusec's cuda backend over the stand-ins; the driver module it launches through."""
    import fusec.jit
    import fusec.passes.guard as guard
    from fusec.runtime.backends import cuda
    cp = types.SimpleNamespace(
        ndarray=ndarray, empty=ndarray, asarray=lambda a: a,
        cuda=types.SimpleNamespace(get_current_stream=lambda: STATE.stream, Device=lambda *a: Device(),
                                   runtime=types.SimpleNamespace(getDevice=lambda: STATE.device),
                                   get_allocator=get_allocator, MemoryPointer=lambda memory, offset:
                                   MemoryPointer(memory.ptr + offset),
                                   UnownedMemory=lambda ptr, size, owner, device: types.SimpleNamespace(ptr=ptr)))
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


QUICK = "--quick" in sys.argv  # a few windows a row: that every row runs, not what it measures (the tests')


def per_call(fn, window_us=2000, windows=60):
    """µs per call: the least over many windows of about 2 ms (one another process
    interrupted is dropped)."""
    windows = 2 if QUICK else windows
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
    ndarray.made = set()
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


def torch_rows() -> dict:
    """The torch-tensor call's rows: CPU tensors stand in for CUDA ones (the stand-in device is
    -1 from here on, as a CPU tensor's get_device() says; the checked path's refusal of a CPU
    tensor skipped), outputs allocated by torch on the CPU (its own row: the CUDA caching
    allocator's cost is launch_floor.py's), torch's current stream a C-level function of no
    cost to speak of. The key, the tensor reads, the allocation call and the launch are fusec's
    as on a GPU. The calls by name (--profile), and "_parts": the pipeline and its arguments
    (--parts); {} where torch is missing."""
    try:
        import torch
    except ImportError:
        print("| (torch is not installed: no torch rows) | |")
        return {}
    import fusec
    from fusec.interop import torch_arrays
    from fusec.runtime.backends import cuda
    STATE.device = -1
    kind = cuda.DeviceArrays.kind

    def cpu_tensors(self, value):  # torch's kind as DeviceArrays.kind makes it, allocating on the CPU
        if self._torch is None and torch_arrays.is_tensor(value):
            self._torch = torch_arrays.TorchTensors(torch.device("cpu"), self._torch_view)
            self._torch.stream_handle = itertools.repeat(0x7000).__next__  # a stream handle, read in C
        return kind(self, value)
    cuda.DeviceArrays.kind = cpu_tensors
    cuda.DeviceArrays._adopt_tensor = lambda self, tensor: self._torch_view(tensor)
    f = fusec.jit("examples/scale_bias_relu.fz", backend="cuda")
    t = torch.randn(4096)
    u = f(t, 1.5, -0.25)
    for _ in range(3):
        f(t, 1.5, -0.25), f(t, 1.5, -0.25, out=u)
    held = [None, None, None]

    def held_output():
        held.append(f(t, 1.5, -0.25))
        del held[0]
    torch_calls = {"torch": lambda: f(t, 1.5, -0.25), "torch_held": held_output,
                   "torch_out": lambda: f(t, 1.5, -0.25, out=u)}
    for name, what in (("torch", "f(t, s, b), torch tensors, replayed, the result dropped"),
                       ("torch_held", "f(t, s, b), torch tensors, replayed, the last three results held"),
                       ("torch_out", "f(t, s, b, out=u), torch tensors, replayed")):
        print(f"| {what} | {per_call(torch_calls[name]):.2f} |")
    shape, strides, dtype, device = (4096,), (1,), torch.float32, torch.device("cpu")
    template = torch.empty(0, dtype=dtype, device=device)
    for what, fn in (("torch.empty(shape, dtype=, device=)", lambda: torch.empty(shape, dtype=dtype, device=device)),
                     ("torch.empty_strided(shape, strides, dtype=, device=)",
                      lambda: torch.empty_strided(shape, strides, dtype=dtype, device=device)),
                     ("an empty tensor's new_empty_strided(shape, strides)",
                      lambda: template.new_empty_strided(shape, strides))):
        print(f"| allocation on the CPU (a stand-in for CUDA's): {what} alone | {per_call(fn):.2f} |")
    torch_calls["_parts"] = (f, (t, 1.5, -0.25))
    return torch_calls


def parts(what: str, f, args: tuple, pieces: list[tuple[str, str, str]], hold: bool = False) -> None:
    """--parts: where the µs of a replayed call f(*args) go (the call recorded last), each part
    timed alone over at least 100,000 calls (timeit: the least of windows of ~2 ms) in the namespace of the
    generated code it is a part of: the whole call, its frames' differences, the recorded
    call's allocation in place (the call less the same code with a fixed array for each new
    one), and `pieces` (label, statement, setup) of the recorded call's own code, those of the
    allocation shown alone beside it; "the rest" is what they leave of the recorded call.
    `hold`: each result kept, the last three (a C-level deque's append, its own cost taken off
    each row), so that the recorded call allocates where it would reuse a dropped one, and
    each piece's result kept alike (objects that live on cost more to make than one freed at once)."""
    import timeit
    runner = f._replaying
    key, run = runner._last_plain[0]
    q = runner._addresses(args) if runner._calls[key].free else []
    names = {**runner.replay.__globals__, **run.__globals__, "f": f, "args": args, "run": run, "q": q,
             "replay": runner.replay, "key_of": runner._plain_key, "x": args[0],
             "hold": collections.deque(maxlen=3).append if hold else id}

    def t(stmt: str, setup: str = "pass", held: bool = True) -> float:  # as per_call: the least of ~2 ms windows
        if hold and held:  # the result kept as the call's are (objects that live on cost more), the keeping not counted
            return t(f"hold({stmt})", setup, False) - t("hold(None)", "pass", False)
        timer = timeit.Timer(stmt, setup, globals=names)
        n = max(100, int(2e-3 / (timer.timeit(1000) / 1000)))
        return min(timer.timeit(n) / n for _ in range(2 if QUICK else max(60, -(-100000 // n)))) * 1e6
    # The recorded call with each new array a fixed one (made once): what allocating costs in place
    # (objects that live on, the harness freeing them), where a piece alone may cost less.
    source, fixed = runner._calls[key].source, {}
    for k, bytes_ in re.findall(r"^\s+d(\d+) = alloc\((\d+)\)$", source, re.M):
        fixed[f"FIXED_D{k}"] = run.__globals__["allocator_in_use"]()(int(bytes_))
        fixed[f"FIXED_V{k}"] = run.__globals__[f"array{k}"](fixed[f"FIXED_D{k}"])
        source = source.replace(f"d{k} = alloc({bytes_})", f"d{k} = FIXED_D{k}").replace(
            f"v{k} = array{k}(d{k})", f"v{k} = FIXED_V{k}")
    for k in re.findall(r"^\s+v(\d+) = new\d+\(\)$", source, re.M):
        fixed[f"FIXED_V{k}"] = run.__globals__[f"new{k}"]()
        source = source.replace(f"v{k} = new{k}()", f"v{k} = FIXED_V{k}")
    unallocated = {**run.__globals__, **fixed}
    exec(source, unallocated)
    names["run_fixed"] = unallocated["run"]
    whole, replayed, recorded = t("f(*args)"), t("replay(args)"), t("run(args, None, *q)")
    allocating = recorded - t("run_fixed(args, None, *q)") if fixed else None
    print(f"\n| where the µs of {what} go (each part alone, 100k calls) | µs |\n|---|---:|")
    print(f"| the whole call, f(*args){' (its result held)' if hold else ''} | {whole:.3f} |")
    print(f"| JitPipeline.__call__: f(*args) less its runner's replay(args) | {whole - replayed:.3f} |")
    print(f"| the replay: replay(args) less the recorded call's run (device check, key, look-up, frame) | "
          f"{replayed - recorded:.3f} |")
    print(f"|   of which the key alone, as its generated function reads it | {t('key_of(args)'):.3f} |")
    for label, stmt, setup in pieces:
        if label.startswith("the key's"):  # a part of the key
            print(f"|     {label} | {t(stmt, setup, False):.3f} |")
    print(f"| the recorded call, run(args, None, *addresses) | {recorded:.3f} |")
    if allocating is not None:
        print(f"|   its allocation in place: run less the same run with a fixed array for each new one | "
              f"{allocating:.3f} |")
    rest = recorded - (allocating or 0)
    for label, stmt, setup in pieces:
        if label.startswith("the key's"):  # a part of the key, above
            continue
        part = t(stmt, setup)
        if label.startswith("the allocation") and allocating is not None:  # in the row in place above
            label = f"  (alone) {label}"
        else:
            rest -= part
        print(f"|   {label} | {part:.3f} |")
    print(f"|   the rest of run (its frame, the scalars' checks, the spare sets' checks, the argument "
          f"buffer's list) | {rest:.3f} |")


def launch_pieces(names: dict) -> list[tuple[str, str, str]]:
    """The first launch's packing and the driver's launch (the stub's) as `parts` pieces."""
    setup = "slot = l0_free[0]\nvalues = slot.arguments.layout.unpack_from(slot.buffer)"
    launch = "launch_ex(slot.config, l0_function, slot.params, 0)" if "launch_ex" in names else \
        "launch(l0_function, 1, 1, 1, 256, 1, 1, 0, 0, slot.params, 0)"
    return [("packing the arguments (struct pack_into)", "l0_pack(slot.buffer, 0, *values)", setup),
            ("the driver's launch through cuda.bindings (the stub's)", launch, setup)]


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
    print(f"| the stand-in's ndarray(shape, dtype) alone (its pool's malloc included) | "
          f"{per_call(lambda: ndarray((4096,), np.float32)):.2f} |")
    print(f"| the stand-in pool's malloc alone | {per_call(lambda: malloc(16384)):.2f} |")
    print(f"| the stand-in's cupy.cuda.get_allocator() alone | {per_call(get_allocator):.2f} |")
    print(f"| the harness: a call of a lambda that does nothing | {per_call(lambda: None):.2f} |")
    torch_calls = torch_rows()
    if hasattr(driver, "CUfunction"):  # the bindings' own share of a launch (the stub returns at once)
        function, params, stream = driver.CUfunction(0x1000), ctypes.addressof(ctypes.c_void_p(0)), driver.CUstream(0)
        config = driver.CUlaunchConfig()
        config.gridDimX = config.gridDimY = config.gridDimZ = config.blockDimY = config.blockDimZ = 1
        config.blockDimX, config.hStream = 256, stream
        print(f"| cuda.bindings cuLaunchKernel, its Python alone | "
              f"{per_call(lambda: driver.cuLaunchKernel(function, 4, 1, 1, 256, 1, 1, 0, 0, params, 0)):.2f} |")
        print(f"| cuda.bindings cuLaunchKernelEx, its Python alone | "
              f"{per_call(lambda: driver.cuLaunchKernelEx(config, function, params, 0)):.2f} |")
    if "--parts" in sys.argv:
        STATE.device = 0
        for _ in range(3):  # the held call recorded last is the one whose parts are timed
            held_output()
        run = runner._last_plain[0][1]
        nbytes = 4096 * 4
        parts("f(x, s, b) replayed, the last three results held (CuPy, allocates)", f, (x, 1.5, -0.25), [
            ("CuPy's current stream .ptr (the stand-in's)", "current_stream().ptr", "pass"),
            ("cupy.cuda.get_allocator() (the stand-in's)", "allocator_in_use()", "pass"),
            ("the allocation: the pool's malloc (the stand-in's)", f"alloc({nbytes})", "alloc = allocator_in_use()"),
            ("the allocation: the array over it, array0(memory) (the stand-in's ndarray)", "array0(d0)",
             f"d0 = allocator_in_use()({nbytes})"),
            *launch_pieces(run.__globals__)], hold=True)
        if torch_calls:
            STATE.device = -1
            tf, targs = torch_calls["_parts"]
            for _ in range(3):
                tf(*targs)
            run = tf._replaying._last_plain[0][1]
            reads = [(f"the key's read of {r}", r, "") for r in
                     ("tensor_data_ptr(x)", "x.shape", "tensor_is_contiguous(x)", "x.dtype", "x.requires_grad",
                      "x.get_device()")]
            parts("f(t, s, b), torch tensors, replayed (allocates)", tf, targs, [
                *reads, ("torch's current stream (the stand-in's, a C function)", "stream_handle()", "pass"),
                ("the allocation: new0() (torch on the CPU)", "new0()", "pass"),
                ("the new tensor's address, pointer(v0)", "pointer(v0)", "v0 = new0()"),
                *launch_pieces(run.__globals__)])
    if "--profile" in sys.argv:
        name = sys.argv[sys.argv.index("--profile") + 1]
        which = {**calls, **torch_calls}[name]
        STATE.device = -1 if name.startswith("torch") else 0  # the device of the call's arrays
        cProfile.runctx("for _ in range(30000): which()", globals(), {"which": which}, "/tmp/host_path.prof")
        pstats.Stats("/tmp/host_path.prof").sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
