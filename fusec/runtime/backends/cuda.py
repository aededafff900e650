"""The cuda backend: NVRTC compiles the emitted module, CuPy launches it.

fusec calls NVRTC itself (through CuPy's bindings) rather than CuPy's
RawModule, because CuPy adds -ftz=true to every compile, flushing f32
denormals to zero. fusec compiles with NVRTC's IEEE defaults: no fast math,
denormals kept, IEEE-rounded division and sqrt (nvcc's default FMA
contraction stays on). Caches: in memory, one loaded module per (source, arch,
device) in this process; on disk, one cubin per key under FUSEC_CACHE_DIR
(default ~/.cache/fusec/cuda), the key hashing the source, the options, the
arch, fusec's version and NVRTC's version.
"""
from __future__ import annotations

import functools
import hashlib
import operator
import os
import sys
import threading
from pathlib import Path

import numpy as np

from fusec import __version__
from fusec.cache import cache_dir
from fusec.compiler import Compiled
from fusec.errors import ArgumentError
from fusec.ir.kernels import Kernel, kernel_params, variant_names
from fusec.ir.program import Slot
from fusec.runtime.binder import numpy_dtype
from fusec.runtime.executor import BLOCK_SIZE

OPTIONS = ("--std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true")

# cuFuncGetAttribute's attribute numbers (CUfunction_attribute).
_MAX_THREADS_PER_BLOCK, _LOCAL_SIZE_BYTES, _NUM_REGS = 0, 3, 4

_modules: dict[tuple, object] = {}
_lock = threading.Lock()


def cupy():
    import cupy as cp  # imported here: fusec works without CuPy
    return cp


def device_arch() -> str:
    return "sm_" + cupy().cuda.Device().compute_capability


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Where NVRTC finds cuda_fp16.h: the toolkit CuPy uses, or NVIDIA's pip wheels."""
    candidates = []
    cuda_path = cupy().cuda.get_cuda_path()
    if cuda_path:
        candidates.append(os.path.join(cuda_path, "include"))
    try:
        import nvidia
        for root in getattr(nvidia, "__path__", []):
            candidates += [str(p.parent) for p in Path(root).glob("*/include/cuda_fp16.h")]
    except ImportError:
        pass
    return tuple(d for d in candidates if os.path.exists(os.path.join(d, "cuda_fp16.h")))[:1]


def compile_module(source: str, arch: str, native: bool) -> bytes:
    """Machine code for `arch` (native: the device's own), else PTX for it that
    the driver compiles at load; from the disk cache, else from NVRTC."""
    from cupy_backends.cuda.libs import nvrtc
    target = arch if native else "compute_" + arch.removeprefix("sm_")
    options = OPTIONS + (f"-arch={target}", f"-DFUSEC_VERSION={__version__.replace('.', '_')}")
    version = ".".join(map(str, nvrtc.getVersion()))
    key = hashlib.sha256("\0".join((source, *options, __version__, version)).encode()).hexdigest()
    path = cache_dir("cuda") / f"{key[:32]}.{'cubin' if native else 'ptx'}"
    if path.exists():
        return path.read_bytes()
    program = nvrtc.createProgram(source, "fusec_module.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, list(options) + [f"-I{d}" for d in include_dirs()])
        except nvrtc.NVRTCError:
            raise RuntimeError("NVRTC rejected the emitted module (a fusec bug):\n"
                               + nvrtc.getProgramLog(program)) from None
        cubin = nvrtc.getCUBIN(program) if native else nvrtc.getPTX(program)
        cubin = cubin.encode() if isinstance(cubin, str) else cubin
    finally:
        nvrtc.destroyProgram(program)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_bytes(cubin)
    partial.replace(path)  # atomic: a concurrent process never reads half a file
    return cubin


def load_module(source: str, arch: str):
    """The loaded module for this source on the current device (memory, then disk, then NVRTC)."""
    cp = cupy()
    key = (source, arch, cp.cuda.Device().id)
    with _lock:
        module = _modules.get(key)
        if module is None:
            module = cp.cuda.function.Module()
            module.load(compile_module(source, arch, native=arch == device_arch()))
            _modules[key] = module
    return module


def function_attribute(function, attribute: int) -> int:
    return cupy().cuda.driver.funcGetAttribute(attribute, function.ptr)


_SCALAR_TYPES = {"bool": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
                 "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "f16": np.float32,
                 "bf16": np.float32, "f32": np.float32, "f64": np.float64}


class CudaBackend:
    def __init__(self, compiled: Compiled, arch: str | None = None):
        cp = cupy()
        self.cp = cp
        self.device = cp.cuda.Device().id
        self.compiled = compiled
        self.arch = arch or device_arch()
        module = load_module(compiled.cuda, self.arch)
        self.kernels = {}   # variant name -> (function, block)
        self.persistent_grids: dict[str, int] = {}  # a persistent kernel's blocks, once computed
        self.launchers = {}  # kernel name -> (converters, (scalar variant, vector variant))
        self._reader_cache: dict[type, tuple | None] = {}
        for kernel in compiled.plan.kernels:
            for name in dict.fromkeys(variant_names(kernel)):
                function = module.get_function(name)
                # The block is as large as the kernel's real register use allows.
                block = min(BLOCK_SIZE, function_attribute(function, _MAX_THREADS_PER_BLOCK))
                self.kernels[name] = (function, block)
            converters = [_converter(p) for p in kernel_params(kernel)]
            self.launchers[kernel.name] = (converters, tuple(self.kernels[n] for n in variant_names(kernel)))

    def attributes(self, kernel_name: str) -> dict:
        """What the compiled kernel really uses, for the report."""
        out = {"arch": self.arch}
        for variant, suffix in zip(variant_names(self._plan_kernel(kernel_name)), ("", "_vector")):
            function, block = self.kernels[variant]
            out |= {f"num_regs{suffix}": function_attribute(function, _NUM_REGS),
                    f"local_size_bytes{suffix}": function_attribute(function, _LOCAL_SIZE_BYTES),
                    f"block{suffix}": block}
        return out

    def _plan_kernel(self, name: str) -> Kernel:
        return next(k for k in self.compiled.plan.kernels if k.name == name)

    # ---- the Backend protocol
    def array_checker(self, param: Slot):
        """The common case (a contiguous CuPy array of the right dtype on this
        device) in a few attribute reads; anything else the full check."""
        ndarray, expected, device = self.cp.ndarray, numpy_dtype(param.type), self.device
        written = param.role in ("inout", "out")

        def check(value):
            if type(value) is ndarray and value.dtype == expected and value.data.device_id == device \
                    and value._c_contiguous and not (written and 0 in value._strides):
                return value
            return self.check_array(param, value)
        return check

    def check_array(self, param: Slot, value):
        cp = self.cp
        if isinstance(value, np.ndarray):
            raise ArgumentError(f"parameter '{param.name}': a NumPy array is in host memory; the cuda backend "
                                "takes CuPy arrays (cupy.asarray(x)) or GPU arrays with DLPack or "
                                "__cuda_array_interface__")
        if not isinstance(value, cp.ndarray):
            value = self._import_array(param, value)
        if value.device.id != self.device:
            raise ArgumentError(f"parameter '{param.name}': the array is on device {value.device.id}, but this "
                                f"pipeline runs on device {self.device} (use `with cupy.cuda.Device({value.device.id}):`)")
        expected = numpy_dtype(param.type)
        if value.dtype != expected:
            raise ArgumentError(f"parameter '{param.name}': expected dtype {param.type} ({expected}), got {value.dtype}")
        if param.role in ("inout", "out") and 0 in value.strides and value.size > 1:
            raise ArgumentError(f"parameter '{param.name}' is written, but the array is a broadcast view")
        if not value.flags.c_contiguous:
            raise ArgumentError(f"parameter '{param.name}': the array is not C-contiguous (strides {value.strides}); "
                                "pass cupy.ascontiguousarray(...)")
        return value

    def _import_array(self, param: Slot, value):
        """A GPU array from another library, without a copy (DLPack first: it carries bf16)."""
        cp = self.cp
        try:
            if hasattr(value, "__dlpack__"):
                return cp.from_dlpack(value)
            if hasattr(value, "__cuda_array_interface__"):
                return cp.asarray(value)
        except (TypeError, ValueError, BufferError, RuntimeError) as exc:
            raise ArgumentError(f"parameter '{param.name}': cannot use this array on the GPU ({exc})") from None
        raise ArgumentError(f"parameter '{param.name}': expected a GPU array, got {type(value).__name__}")

    def span(self, array) -> tuple[int, int]:
        start = array.data.ptr
        return start, start + array.nbytes

    def pointer(self, array) -> int:
        return array.data.ptr

    def signature(self, value) -> tuple | None:
        if type(value) is self.cp.ndarray:  # the common case, inline (a graph replay's key)
            return value.data.ptr, value.shape, value.strides, value.dtype
        readers = self._readers(type(value))
        try:
            return None if readers is None else tuple(read(value) for read in readers)
        except Exception:  # e.g. a sparse torch tensor has no address: the full check says why
            return None

    def signatures(self, arrays: list) -> tuple | None:
        """The signatures of many arrays (foreach's look-up): one list per
        field, each read in a C-level loop where the arrays are of one kind."""
        readers = {self._readers(kind) for kind in set(map(type, arrays))}
        if len(readers) != 1 or None in readers:
            return None
        try:
            return tuple(list(map(read, arrays)) for read in readers.pop())
        except Exception:
            return None

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
                    readers = (base.data_ptr, _shape, base.is_contiguous, _dtype)
            self._reader_cache[kind] = readers
        return self._reader_cache[kind]

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype)

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

    def table(self, array: np.ndarray):
        # Freed after the call returns: CuPy's pool hands its memory to a later
        # allocation on the same stream, whose use is ordered after the kernel.
        return self.cp.asarray(array)

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

    def launch(self, kernel: Kernel, n: int, args: list, stream, vector: bool) -> None:
        converters, fire = self.prepare_launch(kernel, n, vector)
        converted = [a if convert is None else convert(a) for convert, a in zip(converters, args)]
        if stream is None:
            fire(converted)
        else:
            fire(converted, stream=stream)

    def prepare_launch(self, kernel: Kernel, n: int, vector: bool) -> tuple[list, object]:
        converters, variants = self.launchers[kernel.name]
        function, block = variants[vector]
        blocks = self._blocks(kernel, function, block, n, vector)
        return converters, functools.partial(function, (blocks,), (block,))

    def foreign(self, value) -> bool:
        return type(value) is not self.cp.ndarray

    def hand_off(self) -> None:
        """The stream order a DLPack import of a torch tensor gives (the call
        path that reads torch tensors directly skips the import): CuPy's current
        stream waits for torch's current stream where the two differ."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return
        # torch's raw stream handle, as Triton reads it; a torch.cuda.Stream costs ~5 µs to make
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        producer = raw(self.device) if raw is not None else torch.cuda.current_stream(self.device).cuda_stream
        consumer = self.cp.cuda.get_current_stream()
        if producer == consumer.ptr:
            return
        event = self.cp.cuda.Event(disable_timing=True)
        event.record(self.stream(_StreamHandle(producer)))
        consumer.wait_event(event)

    def address(self, pointer: int):
        return np.uint64(pointer)  # a pointer parameter's 8 bytes, as CuPy packs an array's

    def _blocks(self, kernel: Kernel, function, block: int, n: int, vector: bool) -> int:
        threads = -(-n // kernel.vector) if vector and not kernel.persistent else n
        blocks = -(-threads // block)
        if kernel.persistent:  # a grid that just fills the device, each thread striding
            grid = self.persistent_grids.get(kernel.name)
            if grid is None:
                grid = self.persistent_grids[kernel.name] = self._persistent_blocks(function, block)
            blocks = min(blocks, grid)
        return blocks

    def _persistent_blocks(self, function, block: int) -> int:
        """Blocks that fill every SM at the kernel's occupancy (from its real register use)."""
        device = self.cp.cuda.Device()
        try:
            per_sm = self.cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, block, 0)
        except AttributeError:  # an older CuPy: the thread limit alone
            per_sm = device.attributes["MaxThreadsPerMultiProcessor"] // block
        return max(1, per_sm) * device.attributes["MultiProcessorCount"]


class _StreamHandle:
    """A raw stream handle as the CUDA stream protocol presents one."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return 0, self.handle


_cupy_pointer = operator.attrgetter("data.ptr")
_shape, _strides, _dtype = (operator.attrgetter(name) for name in ("shape", "strides", "dtype"))


def _converter(param):
    """How a launch argument becomes a kernel parameter (None: as it is, an array)."""
    if param.kind in ("array", "pointers", "table"):
        return None
    if param.kind == "scalar":
        return _SCALAR_TYPES[param.type.name]
    return np.int64


@functools.cache
def available() -> bool:
    try:
        return bool(cupy().cuda.is_available())
    except Exception:
        return False
