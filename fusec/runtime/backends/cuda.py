"""The cuda backend: NVRTC compiles the emitted module, CuPy launches it.

fusec calls NVRTC itself (through CuPy's bindings) rather than CuPy's
RawModule, because CuPy adds -ftz=true to every compile, flushing f32
denormals to zero. fusec compiles with NVRTC's IEEE defaults: no fast math,
denormals kept, IEEE-rounded division and sqrt (nvcc's default FMA
contraction stays on). Caches: in memory, one loaded module per (source, arch,
device) in this process; on disk, one cubin per key in fusec's cache
(`fusec cache dir`), the key hashing the source, the options, the arch,
fusec's version and NVRTC's version.
"""
from __future__ import annotations

import functools
import operator
import os
import threading
from pathlib import Path

import numpy as np

from fusec import __version__, cache
from fusec.errors import ArgumentError
from fusec.interop import torch_arrays
from fusec.ir.launch import KernelParam, LaunchInterface, SignatureParam
from fusec.runtime.binder import ArrayKind, OwnArrays
from fusec.target import BLOCK_SIZE

OPTIONS = ("--std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true")
# Fast math (the module's own intrinsics do the functions): f32 denormals flushed
# to zero, approximate division and square root, as nvcc's --use_fast_math.
FAST_OPTIONS = ("--std=c++17", "-ftz=true", "-prec-div=false", "-prec-sqrt=false", "-fmad=true")

# cuFuncGetAttribute's attribute numbers (CUfunction_attribute).
_MAX_THREADS_PER_BLOCK, _LOCAL_SIZE_BYTES, _NUM_REGS = 0, 3, 4

_modules: dict[tuple, object] = {}
_lock = threading.Lock()


def cupy():
    import cupy as cp  # imported here: fusec works without CuPy
    return cp


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


def compile_module(source: str, arch: str, native: bool, fast_math: bool = False) -> bytes:
    """Machine code for `arch` (native: the device's own), else PTX for it that
    the driver compiles at load; from the disk cache, else from NVRTC."""
    from cupy_backends.cuda.libs import nvrtc
    target = arch if native else "compute_" + arch.removeprefix("sm_")
    options = (FAST_OPTIONS if fast_math else OPTIONS) + (f"-arch={target}",
                                                          f"-DFUSEC_VERSION={__version__.replace('.', '_')}")
    version = ".".join(map(str, nvrtc.getVersion()))

    def build() -> bytes:
        program = nvrtc.createProgram(source, "fusec_module.cu", [], [])
        try:
            try:
                nvrtc.compileProgram(program, list(options) + [f"-I{d}" for d in include_dirs()])
            except nvrtc.NVRTCError:
                raise RuntimeError("NVRTC rejected the emitted module (a fusec bug):\n"
                                   + nvrtc.getProgramLog(program)) from None
            code = nvrtc.getCUBIN(program) if native else nvrtc.getPTX(program)
        finally:
            nvrtc.destroyProgram(program)
        return code.encode() if isinstance(code, str) else code
    # Atomic, digest-checked and built once among concurrent processes (fusec.cache).
    key = cache.key(source, *options, __version__, version)
    return cache.load_or_build("cuda", key, ".cubin" if native else ".ptx", build)


def load_module(source: str, arch: str, fast_math: bool = False):
    """The loaded module for this source on the current device (memory, then disk, then NVRTC)."""
    cp = cupy()
    key = (source, arch, cp.cuda.Device().id, fast_math)
    with _lock:
        module = _modules.get(key)
        if module is None:
            module = cp.cuda.function.Module()
            module.load(compile_module(source, arch, native=arch == device_arch(), fast_math=fast_math))
            _modules[key] = module
    return module


def function_attribute(function, attribute: int) -> int:
    return cupy().cuda.driver.funcGetAttribute(attribute, function.ptr)


class CudaBackend:
    """Loads a module on the current device and launches its functions (CuPy)."""

    def __init__(self, cuda_source: str, interface: LaunchInterface, arch: str | None = None):
        cp = self.cp = cupy()
        self.device = cp.cuda.Device().id
        self.arch = arch or device_arch()
        self.arrays = DeviceArrays(cp, self.device)
        module = load_module(cuda_source, self.arch, interface.fast_math)
        self.functions = {}  # variant -> (function, block)
        for launch in interface.kernels:
            for variant in launch.variants:
                function = module.get_function(variant.name)
                # The block is as large as the function's real register use allows.
                block = min(BLOCK_SIZE, function_attribute(function, _MAX_THREADS_PER_BLOCK))
                self.functions[variant.name] = (function, block)
        self._fill: dict[str, int] = {}  # variant -> blocks that fill the device, once computed
        self._reader_cache: dict[type, tuple | None] = {}

    def attributes(self, variant: str) -> dict:
        """What the compiled function really uses, for the report."""
        function, block = self.functions[variant]
        return {"arch": self.arch, "num_regs": function_attribute(function, _NUM_REGS),
                "local_size_bytes": function_attribute(function, _LOCAL_SIZE_BYTES), "block": block}

    # ---- launching
    def block(self, variant: str) -> int:
        return self.functions[variant][1]

    def fill_blocks(self, variant: str, block: int) -> int:
        blocks = self._fill.get(variant)
        if blocks is None:
            blocks = self._fill[variant] = self._device_filling_blocks(self.functions[variant][0], block)
        return blocks

    def _device_filling_blocks(self, function, block: int) -> int:
        """Blocks that fill every SM at the function's occupancy (from its real register use)."""
        device = self.cp.cuda.Device()
        try:
            per_sm = self.cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, block, 0)
        except AttributeError:  # an older CuPy: the thread limit alone
            per_sm = device.attributes["MaxThreadsPerMultiProcessor"] // block
        return max(1, per_sm) * device.attributes["MultiProcessorCount"]

    def packer(self, param: KernelParam):
        # CuPy packs a NumPy scalar by its dtype and a CuPy array as its address.
        return None if param.pack is None else param.pack.numpy_dtype.type

    def launcher(self, variant: str, grid: int, block: int, shared_bytes: int = 0):
        function = self.functions[variant][0]
        if shared_bytes:  # dynamic shared memory (within the 48 KiB a block gets without opting in)
            return functools.partial(function, (grid,), (block,), shared_mem=shared_bytes)
        return functools.partial(function, (grid,), (block,))

    # ---- arrays
    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype)

    def pointer(self, array) -> int:
        return array.data.ptr

    def address(self, pointer: int):
        return np.uint64(pointer)  # a pointer parameter's 8 bytes, as CuPy packs an array's

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


class DeviceArrays:
    """The cuda backend's arrays for the binder: CuPy arrays on this device, torch
    CUDA tensors (a call of them returns torch tensors and runs on torch's
    current stream), or any other GPU array with DLPack or
    __cuda_array_interface__ (used in place; a call of them returns CuPy arrays)."""

    def __init__(self, cp, device: int):
        self.cp, self.device = cp, device
        self.own = OwnArrays("CuPy arrays", cp.empty, _cupy_pointer)
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
            raise ArgumentError(f"the array is on device {device}, but this pipeline runs on device "
                                f"{self.device} (use `with cupy.cuda.Device({device}):`)")
        return value

    def _adopt_tensor(self, tensor):
        device = tensor.get_device()  # -1 on the CPU
        if device < 0:
            raise ArgumentError(f"the tensor is on the {tensor.device.type}; the cuda backend takes CUDA tensors "
                                "(x.cuda())")
        if device != self.device:
            raise ArgumentError(f"the tensor is on cuda:{device}, but this pipeline runs on device {self.device} "
                                f"(use `with cupy.cuda.Device({device}):`)")
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


@functools.cache
def available() -> bool:
    try:
        return bool(cupy().cuda.is_available())
    except Exception:
        return False
