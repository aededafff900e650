"""The cuda backend: NVRTC compiles the emitted module and the driver launches
it, both through NVIDIA's CUDA Python bindings (`cuda.bindings`); CuPy stays
the array library (allocation, streams, graphs).

fusec chooses NVRTC's options itself: IEEE defaults, no fast math, denormals
kept, IEEE-rounded division and sqrt (nvcc's default FMA contraction stays
on); CuPy's own compiles add -ftz=true. Launches are the driver's
cuLaunchKernel with each variant's argument buffer packed in place
(`fusec.runtime.packing`). Caches: in memory, one loaded module per (source,
arch, device) in this process; on disk, one cubin per key in fusec's cache
(`fusec cache dir`), shared by every device and process, the key hashing the
source, the options, the arch, fusec's version and NVRTC's version.
"""
from __future__ import annotations

import functools
import json
import math
import operator
import os
import re
import sys
import threading
import weakref
from pathlib import Path
from typing import Callable

import numpy as np

from fusec import __version__, cache
from fusec.errors import ArgumentError
from fusec.interop import torch_arrays
from fusec.ir.launch import KernelParam, LaunchInterface, SignatureParam, block_threads, cluster_blocks
from fusec.runtime.binder import ArrayKind, OwnArrays
from fusec.runtime.packing import ArgumentBuffer
from fusec.target import BLOCK_SIZE

OPTIONS = ("--std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true")
# Fast math (the module's own intrinsics do the functions): f32 denormals flushed
# to zero, approximate division and square root, as nvcc's --use_fast_math.
FAST_OPTIONS = ("--std=c++17", "-ftz=true", "-prec-div=false", "-prec-sqrt=false", "-fmad=true")

_modules: dict[tuple, object] = {}
_lock = threading.Lock()

# The driver's entry point for a launch without clusters: "ex", cuLaunchKernelEx with a
# configuration built once per launch (its stream set where it changed), or "plain",
# cuLaunchKernel (the stream and the dimensions converted every call). Clusters always take
# the extended launch. Read when a launch is prepared; benchmarks/launch_floor.py times both.
LAUNCH_ENTRY = "ex"


def cupy():
    import cupy as cp  # imported here: fusec works without CuPy
    return cp


def driver():
    from cuda.bindings import driver as cuda_driver  # imported here: fusec works without the bindings
    return cuda_driver


def checked(result):
    """A driver call's values, its CUresult checked (the bindings return (error, *values))."""
    return _values(result, lambda error: f"CUDA driver error {_text(driver().cuGetErrorName(error)[1], error)}")


def nvrtc_checked(result):
    """An NVRTC call's values, its nvrtcResult checked (named by NVRTC, not the driver)."""
    from cuda.bindings import nvrtc
    return _values(result, lambda error: f"NVRTC error {_text(nvrtc.nvrtcGetErrorString(error)[1], error)}")


def _values(result, message):
    error, *values = result
    if error:
        raise RuntimeError(message(error))
    return values[0] if len(values) == 1 else values


def _text(name, error) -> str:
    return name.decode() if isinstance(name, bytes) else str(error)


def current_device() -> int:
    return _runtime().getDevice()


@functools.cache
def _runtime():
    return cupy().cuda.runtime


def on_device(device: int):
    """A context in which `device` is current (CuPy's and the driver's launches go there)."""
    return cupy().cuda.Device(device)


def call_device(args: tuple, kwargs: dict) -> int:
    """The device of a call's first GPU array (CuPy, torch, DLPack), else the current one.
    Every other array of the call must be on it (DeviceArrays.adopt says so)."""
    ndarray = cupy().ndarray
    for value in (*args, *kwargs.values()) if kwargs else args:
        if type(value) is ndarray:
            return value.data.device_id
        if torch_arrays.is_tensor(value):
            device = value.get_device()
            if device >= 0:
                return device
        elif hasattr(value, "__dlpack_device__"):
            kind, device = value.__dlpack_device__()
            if kind in (2, 3):  # kDLCUDA, kDLCUDAHost
                return device
    return current_device()


def device_name() -> str:
    """The current device's name (a tuned choice is kept per GPU model)."""
    cp = cupy()
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def device_arch() -> str:
    return "sm_" + cupy().cuda.Device().compute_capability


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Where NVRTC finds cuda_fp16.h: the toolkit CuPy uses, or NVIDIA's pip wheels."""
    candidates = []
    try:
        cuda_path = cupy().cuda.get_cuda_path()
    except ImportError:
        cuda_path = None
    for root in (cuda_path, os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates.append(os.path.join(root, "include"))
    try:
        import nvidia
        for root in getattr(nvidia, "__path__", []):
            candidates += [str(p.parent) for p in Path(root).glob("*/include/cuda_fp16.h")]
    except ImportError:
        pass
    return tuple(d for d in candidates if os.path.exists(os.path.join(d, "cuda_fp16.h")))[:1]


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc
    return ".".join(map(str, nvrtc_checked(nvrtc.nvrtcVersion())))


def nvrtc_compile(source: str, options: tuple[str, ...], native: bool) -> tuple[bytes, str]:
    """NVRTC through NVIDIA's bindings: a cubin (native, with ptxas's report in the
    log) or PTX, and the log; or a RuntimeError with the log.

    NVRTC writes the log, the PTX and the cubin into the buffers it is handed: each a
    bytearray of fusec's own. Never a `bytes` (immutable, and possibly shared): a PTX
    compile's log is empty, one NUL, and `b" " * 1` is CPython's one-byte b" " that the
    whole process shares; written there, every b" " read b"\\0" from then on (3.12's
    tokenizer read f"{a} {b}" as "ab", so importing torch afterwards failed in its own
    schemas, and one-space writes to a text stream printed NULs)."""
    from cuda.bindings import nvrtc
    program = nvrtc_checked(nvrtc.nvrtcCreateProgram(source.encode(), b"fusec_module.cu", 0, [], []))
    try:
        flags = [o.encode() for o in options + (("-Xptxas=-v",) if native else ())] + \
            [f"-I{d}".encode() for d in include_dirs()]
        error, = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        size = nvrtc_checked(nvrtc.nvrtcGetProgramLogSize(program))
        buffer = bytearray(size)
        nvrtc_checked(nvrtc.nvrtcGetProgramLog(program, buffer))
        log = buffer.decode(errors="replace").rstrip("\x00 ")
        if error:
            raise RuntimeError("NVRTC rejected the emitted module (a fusec bug):\n" + log)
        size_of, get = (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if native else \
            (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        code = bytearray(nvrtc_checked(size_of(program)))
        nvrtc_checked(get(program, code))
        return bytes(code), log
    finally:
        nvrtc.nvrtcDestroyProgram(program)


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def ptxas_functions(log: str) -> dict[str, dict[str, int]]:
    """ptxas's verbose report, per function: registers, stack frame and spilled bytes
    (stores and loads). A stack frame alone is not a spill: libdevice's sin and cos
    keep a small array in local memory for their slow argument reduction."""
    out: dict[str, dict[str, int]] = {}
    name = None
    for line in log.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            name = m.group(1)
            out[name] = {"regs": 0, "stack_bytes": 0, "spill_bytes": 0}
        elif name and (m := _PTXAS_FRAME.search(line)):
            out[name].update(stack_bytes=int(m.group(1)), spill_bytes=int(m.group(2)) + int(m.group(3)))
        elif name and (m := _PTXAS_REGS.search(line)):
            out[name]["regs"] = int(m.group(1))
    return out


def _options(arch: str, native: bool, fast_math: bool) -> tuple[str, ...]:
    target = arch if native else "compute_" + arch.removeprefix("sm_")
    return (FAST_OPTIONS if fast_math else OPTIONS) + (f"-arch={target}", f"-DFUSEC_VERSION={__version__.replace('.', '_')}")


def _module_key(source: str, options: tuple[str, ...]) -> str:
    return cache.key(source, *options, __version__, nvrtc_version())


def compile_module(source: str, arch: str, native: bool, fast_math: bool = False) -> bytes:
    """Machine code for `arch` (native: the device's own), else PTX for it that
    the driver compiles at load; from the disk cache, else from NVRTC."""
    return _cached_module(source, _options(arch, native, fast_math), native)[0]


def _cached_module(source: str, options: tuple[str, ...], native: bool) -> tuple[bytes, str]:
    """The module compiled with `options`, and its cache key (a cubin's ptxas
    report is kept under the same key)."""
    key = _module_key(source, options)

    def build() -> bytes:
        code, log = nvrtc_compile(source, options, native)
        if native:  # kept beside the cubin: what ptxas reported of each function
            cache.write("cuda", key, ".ptxas.json", json.dumps(ptxas_functions(log)).encode())
        return code
    # Atomic, digest-checked and built once among concurrent processes (fusec.cache).
    return cache.load_or_build("cuda", key, ".cubin" if native else ".ptx", build), key


def ptxas_report(source: str, arch: str, fast_math: bool = False) -> dict[str, dict[str, int]]:
    """{function: registers, stack and spilled bytes} that ptxas reported when it
    built this module for `arch` (compiled now if it is not in the cache)."""
    options = _options(arch, True, fast_math)
    _, key = _cached_module(source, options, True)
    data = cache.read("cuda", key, ".ptxas.json")
    if data is None:  # the cubin was kept but not its report (a full disk): compile again for it
        return ptxas_functions(nvrtc_compile(source, options, True)[1])
    return json.loads(data)


def ptxas_observations(compiled, arch: str, fast_math: bool = False) -> tuple:
    """The guard's observations of `compiled` (passes.guard.Observation) from
    ptxas's report: its real registers and spills, with no device needed."""
    from fusec.passes import guard
    report = ptxas_report(compiled.cuda, arch, fast_math)

    def attributes(variant: str) -> dict | None:
        reported = report.get(variant)  # a function ptxas's log did not name: nothing observed
        return reported and {"num_regs": reported["regs"], "spill_bytes": reported["spill_bytes"],
                             "local_size_bytes": reported["stack_bytes"]}
    return guard.observe(compiled, attributes)


def load_module(source: str, arch: str, fast_math: bool = False):
    """The loaded module (a CUmodule) for this source on the current device
    (memory, then disk, then NVRTC)."""
    cp = cupy()
    device = cp.cuda.Device()
    key = (source, arch, device.id, fast_math)
    with _lock:
        module = _modules.get(key)
        if module is None:
            image = compile_module(source, arch, native=arch == device_arch(), fast_math=fast_math)
            cp.cuda.runtime.free(0)  # the device's primary context made current, as CuPy's calls use it
            module = _modules[key] = checked(driver().cuModuleLoadData(image))
    return module


def function_attribute(function, attribute: str) -> int:
    d = driver()
    return checked(d.cuFuncGetAttribute(getattr(d.CUfunction_attribute, attribute), function))


class CudaBackend:
    """Loads a module on the current device and launches its functions (the driver, through cuda.bindings)."""

    # Array arguments reach `launcher` as addresses (ints), never as arrays.
    by_address = True

    def __init__(self, cuda_source: str, interface: LaunchInterface, arch: str | None = None):
        cp = self.cp = cupy()
        self.driver = driver()
        self.device = cp.cuda.Device().id
        self.get_device = cp.cuda.runtime.getDevice  # the current device (generated replays check it is this one)
        self.arch = arch or device_arch()
        self.arrays = DeviceArrays(cp, self.device)
        module = load_module(cuda_source, self.arch, interface.fast_math)
        self._source, self._fast_math, self._report = cuda_source, interface.fast_math, None
        self.functions = {}  # variant -> (function, block, argument buffer)
        self._clusters: dict[str, int] = {}  # variant -> blocks a thread-block cluster (1: none)
        self._params: dict[str, tuple] = {}  # variant -> its kernel parameters (argument buffers of its own)
        for launch in interface.kernels:
            for variant in launch.variants:
                function = checked(self.driver.cuModuleGetFunction(module, variant.name.encode()))
                # The block is as large as the function's real register use allows.
                block = min(block_threads(variant, BLOCK_SIZE),
                            function_attribute(function, "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"))
                cluster = cluster_blocks(variant)
                if cluster > 1 and not self._clusters_fit(function, block, cluster):
                    block = 0  # the device cannot run one such cluster: the runtime takes another variant
                self.functions[variant.name] = (function, block, ArgumentBuffer(launch.params))
                self._clusters[variant.name] = cluster
                self._params[variant.name] = launch.params
        self._fill: dict[str, int] = {}  # variant -> blocks that fill the device, once computed
        self._reader_cache: dict[type, tuple | None] = {}
        # Generated keys test for torch's tensors before CuPy's arrays (`signature_lines`): set,
        # once for good, when a call of tensors is recorded (Executor.call_missed).
        self.tensors_first = False

    def _launch_config(self, grid: int, block: int, shared_bytes: int, cluster: int = 1):
        """cuLaunchKernelEx's configuration of a launch (on stream 0 until set), in
        clusters of `cluster` blocks where that is more than 1."""
        d = self.driver
        config = d.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
        config.sharedMemBytes = shared_bytes
        if cluster > 1:
            attribute = d.CUlaunchAttribute()
            attribute.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = cluster, 1, 1
            config.attrs, config.numAttrs = [attribute], 1
        return config

    def _clusters_fit(self, function, block: int, cluster: int) -> bool:
        """Whether the device can run a cluster of `cluster` blocks of `function`
        at once (more than 8 blocks: allowed where the device has them)."""
        d = self.driver
        if cluster > 8:
            error, = d.cuFuncSetAttribute(
                function, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
            if error:
                return False
        return self._active_clusters(function, block, cluster) > 0

    def _active_clusters(self, function, block: int, cluster: int) -> int:
        error, count = self.driver.cuOccupancyMaxActiveClusters(function, self._launch_config(cluster, block, 0, cluster))
        return 0 if error else count

    def attributes(self, variant: str) -> dict:
        """What the compiled function really uses, for the report."""
        function, block, _ = self.functions[variant]
        local = function_attribute(function, "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES")
        reported = self._ptxas().get(variant)
        attributes = {"arch": self.arch, "num_regs": function_attribute(function, "CU_FUNC_ATTRIBUTE_NUM_REGS"),
                      "local_size_bytes": local,
                      # spills as ptxas counted them; without its report, all local memory is taken for spills
                      "spill_bytes": reported["spill_bytes"] if reported else local,
                      "block": block}
        cluster = self._clusters[variant]
        if cluster > 1:  # how many of its clusters the device runs at once (0: none; the runtime skips it)
            attributes["clusters_at_once"] = self._active_clusters(function, block, cluster) if block else 0
        return attributes

    def _ptxas(self) -> dict:
        """ptxas's report of this module's functions ({} when the module was PTX JIT-compiled by the driver)."""
        if self._report is None:
            native = self.arch == device_arch()
            self._report = ptxas_report(self._source, self.arch, self._fast_math) if native else {}
        return self._report

    # ---- launching
    def block(self, variant: str) -> int:
        return self.functions[variant][1]

    def fill_blocks(self, variant: str, block: int) -> int:
        blocks = self._fill.get(variant)
        if blocks is None:
            function, cluster = self.functions[variant][0], self._clusters[variant]
            blocks = self._fill[variant] = max(1, self._active_clusters(function, block, cluster)) if cluster > 1 \
                else self._device_filling_blocks(function, block)
        return blocks

    def _device_filling_blocks(self, function, block: int) -> int:
        """Blocks that fill every SM at the function's occupancy (from its real register use)."""
        per_sm = checked(self.driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, block, 0))
        return max(1, per_sm) * self.cp.cuda.Device().attributes["MultiProcessorCount"]

    def packer(self, param: KernelParam):
        # An array as its address; a scalar as it is: `struct` packs a Python number as the
        # C type (the binder has checked its range and rounded a float as the reference does).
        return _cupy_pointer if param.pack is None else None

    def launcher(self, variant: str, grid: int, block: int, shared_bytes: int = 0):
        """fire(args, stream=None): the driver's launch with the variant's buffer
        packed in place; `stream` anything with the handle as `.ptr` (None: CuPy's current)."""
        function, _, arguments = self.functions[variant]
        current, lock, fill = self.cp.cuda.get_current_stream, arguments.lock, arguments.fill
        cluster = self._clusters[variant]
        if cluster > 1 or LAUNCH_ENTRY == "ex":  # the extended launch (a cluster's dimensions, where it has them)
            config, launch_ex, stream_of = self._launch_config(grid, block, shared_bytes, cluster), \
                self.driver.cuLaunchKernelEx, self.driver.CUstream
            last = [None]  # the handle config.hStream holds

            def fire_ex(args, stream=None):
                handle = (current() if stream is None else stream).ptr
                with lock:  # the buffer and the configuration are the driver's until the launch returns
                    if handle != last[0]:
                        config.hStream, last[0] = stream_of(handle), handle
                    error, = launch_ex(config, function, fill(args), 0)
                if error:
                    checked((error,))
            return fire_ex
        launch = self.driver.cuLaunchKernel

        def fire(args, stream=None):
            handle = (current() if stream is None else stream).ptr
            with lock:  # the buffer is the driver's to read until the launch returns
                error, = launch(function, grid, 1, 1, block, 1, 1, shared_bytes, handle, fill(args), 0)
            if error:
                checked((error,))
        return fire

    def launch_source(self, variant: str, grid: int, block: int, shared_bytes: int, prefix: str) -> tuple[dict, str]:
        """`launcher`'s launch as source text for generated callers (the recorded calls,
        executor._generate): the names it reads (each starting with `prefix`, but for
        the driver's launch, CUstream and `checked`) and its lines, with `{args}` for the
        arguments (Python expressions, packed as `launcher`'s fire packs them) and the
        stream's handle read from `handle`. The launch has argument buffers of its own
        (`_Prepared`), each taken by one call at a time from a list (pop and append are
        atomic; a lock's `with` costs several times more), one more made where another
        thread holds each; the extended launch's configuration is built with each, once,
        its stream set only where the handle differs from its last."""
        function, _, arguments = self.functions[variant]
        p, cluster = prefix, self._clusters[variant]
        ex = cluster > 1 or LAUNCH_ENTRY == "ex"

        def new() -> _Prepared:
            return _Prepared(self._params[variant], self._launch_config(grid, block, shared_bytes, cluster) if ex else None)
        names = {f"{p}function": function, f"{p}pack": arguments.layout.pack_into, f"{p}free": [new()], f"{p}new": new,
                 "checked": checked}
        take = (f"    try:\n        {p}slot = {p}free.pop()\n"
                f"    except IndexError:  # another thread launches it now: one more\n        {p}slot = {p}new()\n"
                f"    {p}pack({p}slot.buffer, 0, {{args}})\n")
        done = f"    {p}free.append({p}slot)\n    if error:\n        checked((error,))\n"
        if ex:
            names.update({"launch_ex": self.driver.cuLaunchKernelEx, "CUstream": self.driver.CUstream})
            return names, (take + f"    if handle != {p}slot.handle:  # the configuration's stream, set where it changed\n"
                           f"        {p}slot.config.hStream, {p}slot.handle = CUstream(handle), handle\n"
                           f"    error, = launch_ex({p}slot.config, {p}function, {p}slot.params, 0)\n" + done)
        names["launch"] = self.driver.cuLaunchKernel
        return names, (take + f"    error, = launch({p}function, {grid}, 1, 1, {block}, 1, 1, {shared_bytes}, handle, "
                       f"{p}slot.params, 0)\n" + done)

    def stream_source(self, kind: ArrayKind) -> tuple[dict, str]:
        """The handle of the stream a call of this kind without stream= runs on, as an
        expression for generated callers (read once a call), and the names it reads."""
        current = self.cp.cuda.get_current_stream
        if kind.native:  # CuPy's arrays: CuPy's current stream (the kind's stream() is None)
            return {"current_stream": current}, "current_stream().ptr"
        handle = getattr(kind, "stream_handle", None)
        if handle is not None:  # torch's current stream, by its handle
            return {"stream_handle": handle}, "stream_handle()"
        return {"current_stream": current, "kind_stream": kind.stream}, \
            "(current_stream() if (stream := kind_stream()) is None else stream).ptr"

    def signature_lines(self, value: str, target: str, on_device: bool, names: dict,
                        address: str | None = None) -> list[str]:
        """`signature` as lines of generated code (a call's key, executor._key_lines): `target`
        set to the signature of the array `value`, or None; with `on_device`, None also
        where the array is not on this backend's device; with `address` (a call that writes
        no parameter), the signature without the array's address, which that name is set
        to, and a CuPy array's C-contiguity for its strides. CuPy's arrays, and torch's
        tensors where torch is imported, are read inline, as `signature` reads them."""
        names.update(ndarray=self.cp.ndarray, DEVICE=self.device, device_of=_device_of)
        v = f"{target}_value"
        arrays = [f"type({v}) is ndarray:", f"        {target}_data = {v}.data"]
        if address is None:
            arrays.append(f"        {target} = ({target}_data.ptr, {v}.shape, {v}.strides, {v}.dtype)")
        else:
            # no parameter written (executor._free): C-contiguity is all the layout the binder checks
            arrays += [f"        {address} = {target}_data.ptr", f"        {target} = ({v}.shape, {v}._c_contiguous, {v}.dtype)"]
        if on_device:
            arrays += [f"        if {target}_data.device_id != DEVICE:", f"            {target} = None"]
        branches = [arrays]
        torch = sys.modules.get("torch")
        readers = None if torch is None else self._readers(torch.Tensor)
        if readers is not None:
            kinds = [torch.Tensor]
            parameter = getattr(getattr(torch, "nn", None), "Parameter", None)
            if parameter is not None and self._readers(parameter) == readers:
                kinds.append(parameter)
            names.update({f"tensor_kind{j}": kind for j, kind in enumerate(kinds)},
                         tensor_data_ptr=readers[0], tensor_is_contiguous=readers[2], grad_enabled=torch.is_grad_enabled)
            rest = f"{v}.shape, tensor_is_contiguous({v}), {v}.dtype, {v}.requires_grad"
            read = [f"            {target} = (tensor_data_ptr({v}), {rest})"] if address is None else \
                [f"            {address} = tensor_data_ptr({v})", f"            {target} = ({rest})"]
            tensors = [f"{' or '.join(f'type({v}) is tensor_kind{j}' for j in range(len(kinds)))}:",
                       "        try:", *read,
                       "        except Exception:  # e.g. a sparse tensor has no address: the full check says why",
                       f"            {target} = None",
                       "        else:",
                       f"            if {target}[-1]:  # requires grad: grad mode in the key too (`signature`)",
                       f"                {target} += (grad_enabled(),)"]
            if on_device:
                tensors += [f"            if {v}.get_device() != DEVICE:", f"                {target} = None"]
            # the kind tested first: tensors, once a call of them was recorded (`tensors_first`)
            branches.insert(0 if self.tensors_first else 1, tensors)
        lines = [f"    {v} = {value}"]
        for j, (test, *body) in enumerate(branches):
            lines += [f"    {'if' if j == 0 else 'elif'} {test}", *body]
        lines += ["    else:", f"        {target} = signature({v})"]
        if on_device:
            lines += [f"        if {target} is not None and device_of({v}) != DEVICE:", f"            {target} = None"]
        if address is not None:
            lines += [f"        if {target} is not None:", f"            {address}, {target} = {target}[0], {target}[1:]"]
        return lines

    # ---- arrays
    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype)

    def pointer(self, array) -> int:
        return array.data.ptr

    def signature(self, value) -> tuple | None:
        if type(value) is self.cp.ndarray:  # the common case, inline (a graph replay's key)
            return value.data.ptr, value.shape, value.strides, value.dtype
        readers = self._readers(type(value))
        try:
            key = None if readers is None else tuple(read(value) for read in readers)
        except Exception:  # e.g. a sparse torch tensor has no address: the full check says why
            return None
        return key + (torch_arrays.grad_enabled(),) if key and key[-1] is True else key

    def signatures(self, arrays: list) -> tuple | None:
        """The signatures of many arrays (foreach's look-up): one list per
        field, each read in a C-level loop where the arrays are of one kind."""
        readers = {self._readers(kind) for kind in set(map(type, arrays))}
        if len(readers) != 1 or None in readers:
            return None
        readers = readers.pop()
        try:
            key = tuple(list(map(read, arrays)) for read in readers)
        except Exception:
            return None
        return key + (torch_arrays.grad_enabled(),) if readers[-1] is _requires_grad and any(key[-1]) else key

    def _readers(self, kind: type) -> tuple | None:
        """Functions reading what the full check of an array depends on, for
        arrays of this type: the address (in CUDA's unified address space, so
        it tells the device too), the shape, the layout and the dtype. CuPy's,
        or torch's read without DLPack (whose import costs ~30 µs an array);
        None for any other type."""
        if kind not in self._reader_cache:
            readers = None
            if kind is self.cp.ndarray:
                readers = (_cupy_pointer, _shape, _strides, _dtype)
            else:  # torch.Tensor and its subclasses: the class that defines the methods
                base = next((c for c in kind.__mro__ if {"data_ptr", "is_contiguous"} <= vars(c).keys()), None)
                if base is not None:  # is_contiguous, not stride(): the same check, without a tuple per call
                    # requires_grad last: a key with it set also holds grad mode (signature,
                    # signatures), so a call recorded under no_grad is not replayed for one
                    # the binder refuses (autograd would miss it)
                    readers = (base.data_ptr, _shape, base.is_contiguous, _dtype, _requires_grad)
            self._reader_cache[kind] = readers
        return self._reader_cache[kind]

    def table(self, array: np.ndarray):
        # Freed after the call returns: CuPy's pool hands its memory to a later
        # allocation on the same stream, whose use is ordered after the kernel.
        return self.cp.asarray(array)

    # ---- streams and graphs
    def stream(self, value):
        cp = self.cp
        if value is None or isinstance(value, cp.cuda.Stream):
            return value
        if hasattr(value, "__cuda_stream__"):  # the CUDA stream protocol: (version, handle)
            if hasattr(cp.cuda.Stream, "from_external"):
                return cp.cuda.Stream.from_external(value)
            return cp.cuda.ExternalStream(int(value.__cuda_stream__()[1]), self.device)
        if hasattr(value, "cuda_stream"):  # torch.cuda.Stream
            return cp.cuda.ExternalStream(int(value.cuda_stream), self.device)
        raise ArgumentError(f"stream= takes a CuPy stream or an object with __cuda_stream__, "
                            f"got {type(value).__name__}")

    def capture(self, launch):
        """The CUDA graph of what launch(stream) enqueues, captured on a stream of its own."""
        stream = self.cp.cuda.Stream(non_blocking=True)
        stream.begin_capture()
        try:
            launch(stream)
        finally:
            graph = stream.end_capture()
        return graph

    def replay(self, graph, stream) -> None:
        graph.launch(stream)  # None: the current stream


class _Prepared:
    """A prepared launch's own argument buffer (the driver's kernelParams) and, for the
    extended launch, its configuration and the stream handle that holds."""

    __slots__ = ("arguments", "buffer", "params", "config", "handle")

    def __init__(self, params, config):
        self.arguments = ArgumentBuffer(params)  # owns the buffer and the pointer array
        self.buffer, self.params, self.config, self.handle = self.arguments.buffer, self.arguments.params, config, None


class CupyArrays(OwnArrays):
    """CuPy arrays as an ArrayKind, allocated as cupy.ndarray(shape, dtype) (what
    cupy.empty(shape, dtype) calls, a frame fewer), from CuPy's current allocator; and
    what a recorded call needs to reuse arrays that nothing references any more
    (executor._generate): `unused`, and the allocator in use, which a reused array
    must have come from."""

    def __init__(self, cp):
        super().__init__("CuPy arrays", cp.ndarray, _cupy_pointer)
        self.allocator_in_use = getattr(cp.cuda, "get_allocator", None)  # None: nothing is reused

    def array_over(self, shape: tuple, dtype) -> tuple[int, Callable]:
        """A new array as a recorded call makes one where it reuses none (executor._generate):
        its bytes, taken from the allocator in use (which the call reads anyway, to check its
        spares), and array(memory), the array over them: what cupy.ndarray(shape, dtype) does
        (cupy.cuda.alloc, that is the current allocator, then the array), less its look-up of
        the allocator (a thread-local read) and a frame."""
        return math.prod(shape) * np.dtype(dtype).itemsize, functools.partial(self.empty, tuple(shape), dtype)

    @staticmethod
    def unused(item: str, array: str, pointer: str, shape: str, names: dict) -> str:
        """A condition of generated code: the array `item` (read into `array`, its `.data`
        into `pointer`), held by a tuple of the code's alone, is referenced by nothing else
        (no view, no weak reference, no holder of its MemoryPointer or of that pointer's
        memory), and has the shape named, C-contiguous (its strides those of the shape: CuPy
        keeps the flag with them, and reads it faster than a strides tuple). The array's own
        count first: what fails where the caller still holds it."""
        names.update(getrefcount=sys.getrefcount, getweakrefcount=weakref.getweakrefcount)
        refs_array, refs_pointer, refs_memory = _ALONE
        return (f"getrefcount({array} := {item}) == {refs_array} and "
                f"getrefcount({pointer} := {array}.data) == {refs_pointer} and "
                f"getrefcount({pointer}.mem) == {refs_memory} and not getweakrefcount({array}) and "
                f"{array}.shape == {shape} and {array}._c_contiguous")


def _alone() -> tuple[int, int, int]:
    """What sys.getrefcount reads, in code of the form `CupyArrays.unused` is used in, of an
    array held by a tuple alone, of its MemoryPointer and of that pointer's memory: counted
    on stand-ins by code of the same form (a count differs between Python versions, whose
    interpreters borrow some references on the stack)."""
    class Probe:
        __slots__ = ("data", "mem")
    array = Probe()
    array.data = Probe()
    array.data.mem = Probe()
    spare = (None, None, array)
    del array
    names = {"getrefcount": sys.getrefcount}
    exec("def probe(spare):\n    return getrefcount(v0 := spare[2]), getrefcount(d0 := v0.data), "
         "getrefcount(d0.mem)\n", names)
    return names["probe"](spare)


_ALONE = _alone()


class DeviceArrays:
    """The cuda backend's arrays for the binder: CuPy arrays on this device, torch
    CUDA tensors (a call of them returns torch tensors and runs on torch's
    current stream), or any other GPU array with DLPack or
    __cuda_array_interface__ (used in place; a call of them returns CuPy arrays)."""

    def __init__(self, cp, device: int):
        self.cp, self.device = cp, device
        self.own = CupyArrays(cp)
        self._torch: ArrayKind | None = None

    def kind(self, value) -> ArrayKind:
        if type(value) is self.cp.ndarray or not torch_arrays.is_tensor(value):
            return self.own
        if self._torch is None:
            import torch
            self._torch = torch_arrays.TorchTensors(torch.device("cuda", self.device), self._torch_view)
        return self._torch

    def adopt(self, value):
        cp = self.cp
        if isinstance(value, np.ndarray):
            raise ArgumentError("a NumPy array is in host memory; the cuda backend takes CuPy arrays "
                                "(cupy.asarray(x)) or GPU arrays with DLPack or __cuda_array_interface__")
        if torch_arrays.is_tensor(value):
            return self._adopt_tensor(value)
        if not isinstance(value, cp.ndarray):
            value = self._import(value)
        if value.data.device_id != self.device:
            device = value.data.device_id
            raise ArgumentError(f"the array is on device {device}, but the call's first array is on device "
                                f"{self.device}: a call's arrays must all be on one device")
        return value

    def _adopt_tensor(self, tensor):
        device = tensor.get_device()  # -1 on the CPU
        if device < 0:
            raise ArgumentError(f"the tensor is on the {tensor.device.type}; the cuda backend takes CUDA tensors "
                                "(x.cuda())")
        if device != self.device:
            raise ArgumentError(f"the tensor is on cuda:{device}, but the call's first array is on device "
                                f"{self.device}: a call's arrays must all be on one device")
        return self._torch_view(tensor)

    def _torch_view(self, tensor):
        return torch_arrays.device_view(self.cp, tensor, self.device)

    def _import(self, value):
        """A GPU array from another library, without a copy (DLPack first: it carries bf16)."""
        cp = self.cp
        try:
            if hasattr(value, "__dlpack__"):
                return cp.from_dlpack(value)
            if hasattr(value, "__cuda_array_interface__"):
                return cp.asarray(value)
        except (TypeError, ValueError, BufferError, RuntimeError) as exc:
            raise ArgumentError(f"cannot use this array on the GPU ({exc})") from None
        raise ArgumentError(f"expected a GPU array, got {type(value).__name__}")

    def contiguous(self, array) -> bool:
        return array.flags.c_contiguous

    def broadcast(self, array) -> bool:
        return 0 in array.strides and array.size > 1

    def writeable(self, array) -> bool:
        return True

    def span(self, array) -> tuple[int, int]:
        start = array.data.ptr
        return start, start + array.nbytes

    def fast(self, param: SignatureParam, dtype):
        """A contiguous CuPy array of the right dtype on this device, in a few attribute reads."""
        ndarray, device, written = self.cp.ndarray, self.device, param.written

        def check(value):
            if type(value) is ndarray and value.dtype == dtype and value.data.device_id == device \
                    and value._c_contiguous and not (written and 0 in value._strides):
                return value
            return None
        return check


_cupy_pointer = operator.attrgetter("data.ptr")
_shape, _strides, _dtype, _requires_grad = (operator.attrgetter(name)
                                             for name in ("shape", "strides", "dtype", "requires_grad"))


def _device_of(value) -> int | None:
    """The device of an array that `CudaBackend.signature` keys (a torch tensor), else None."""
    get_device = getattr(value, "get_device", None)
    return None if get_device is None else get_device()


@functools.cache
def available() -> bool:
    """A CUDA device, CuPy and NVIDIA's bindings are all here."""
    try:
        driver()
        return bool(cupy().cuda.is_available())
    except Exception:
        return False
