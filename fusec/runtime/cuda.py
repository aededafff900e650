"""The cuda backend: CuPy compiles the emitted module with NVRTC and launches it.

Caches: in memory, one compiled module per (source, options, arch, device) in
this process; on disk, CuPy's kernel cache (CUPY_CACHE_DIR, by default
~/.cupy/kernel_cache), whose key holds the source, the options, the arch and
the NVRTC and CuPy versions; fusec's version is in the options, so a new
fusec never reuses an old binary. Compilation uses NVRTC's defaults: no fast
math, so denormals are kept and division and sqrt are IEEE-rounded (CuPy's
own kernels may ask for -ftz=true; fusec does not).
"""
from __future__ import annotations

import functools
import threading

import numpy as np

from .. import __version__
from ..bind import numpy_dtype
from ..compiler import Compiled
from ..errors import ArgumentError
from ..ir import Slot
from ..plan import Kernel, kernel_params
from .executor import BLOCK_SIZE

OPTIONS = ("--std=c++17", f"-DFUSEC_VERSION={__version__.replace('.', '_')}")

_modules: dict[tuple, object] = {}
_lock = threading.Lock()


def cupy():
    import cupy as cp  # imported here: fusec works without CuPy
    return cp


def device_arch() -> str:
    return "sm_" + cupy().cuda.Device().compute_capability


def load_module(source: str, arch: str):
    """The compiled module for this source on the current device (memory, then disk, then NVRTC)."""
    cp = cupy()
    key = (source, OPTIONS, arch, cp.cuda.Device().id)
    with _lock:
        module = _modules.get(key)
        if module is None:
            module = cp.cuda.compiler.compile_with_cache(source, options=OPTIONS, arch=arch.removeprefix("sm_"),
                                                         prepend_cupy_headers=False)
            _modules[key] = module
    return module


_SCALAR_TYPES = {"bool": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
                 "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "f16": np.float32,
                 "bf16": np.float32, "f32": np.float32, "f64": np.float64}


class CudaBackend:
    def __init__(self, compiled: Compiled, arch: str | None = None):
        cp = cupy()
        self.cp = cp
        self.device = cp.cuda.Device().id
        self.arch = arch or device_arch()
        module = load_module(compiled.cuda, self.arch)
        self.kernels = {}
        for kernel in compiled.plan.kernels:
            function = module.get_function(kernel.name)
            converters = [_converter(p) for p in kernel_params(kernel)]
            # The block is as large as the kernel's real register use allows.
            block = min(BLOCK_SIZE, function.max_threads_per_block)
            self.kernels[kernel.name] = (function, converters, block)

    def attributes(self, kernel_name: str) -> dict:
        """What the compiled kernel really uses, for the report."""
        function = self.kernels[kernel_name][0]
        return {"num_regs": function.num_regs, "local_size_bytes": function.local_size_bytes,
                "block": self.kernels[kernel_name][2], "arch": self.arch}

    # ---- the Backend protocol
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

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype)

    def stream(self, value):
        cp = self.cp
        if value is None or isinstance(value, cp.cuda.Stream):
            return value
        if hasattr(value, "__cuda_stream__"):  # the CUDA stream protocol: (version, handle)
            return cp.cuda.ExternalStream(int(value.__cuda_stream__()[1]), self.device)
        if hasattr(value, "cuda_stream"):  # torch.cuda.Stream
            return cp.cuda.ExternalStream(int(value.cuda_stream), self.device)
        raise ArgumentError(f"stream= takes a CuPy stream or an object with __cuda_stream__, "
                            f"got {type(value).__name__}")

    def launch(self, kernel: Kernel, n: int, args: list, stream) -> None:
        function, converters, block = self.kernels[kernel.name]
        converted = tuple(convert(a) for convert, a in zip(converters, args))
        grid = -(-n // block)
        if stream is None:
            function((grid,), (block,), converted)
        else:
            function((grid,), (block,), converted, stream=stream)


def _converter(param):
    if param.kind == "array":
        return _identity
    if param.kind == "scalar":
        return _SCALAR_TYPES[param.type.name]
    return np.int64


def _identity(x):
    return x


@functools.cache
def available() -> bool:
    try:
        return bool(cupy().cuda.is_available())
    except Exception:
        return False
