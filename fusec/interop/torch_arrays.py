"""torch tensors as fusec's backends see them: adopted without a copy, outputs allocated by torch.

A tensor is recognised through `sys.modules`, so fusec never imports torch
itself and works without it; a call with no tensor pays one dict look-up.
A call of torch tensors returns torch tensors (`TorchTensors`, an
`ArrayKind`): its outputs and temporaries come from `torch.empty`, so torch's
caching allocator and CUDA-graph capture see them, and on a GPU it runs on
torch's current stream, where the tensors it reads were produced and where the
tensors it returns will be used.
"""
from __future__ import annotations

import functools
import sys

import numpy as np

from fusec.errors import ArgumentError
from fusec.types import ALL, BF16

# DLPack's device types (dlpack.h, DLDeviceType)
DLPACK_CPU, DLPACK_CUDA = 1, 2


def is_tensor(value) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def grad_enabled() -> bool:
    return sys.modules["torch"].is_grad_enabled()


def readable(tensor):
    """The tensor, for fusec to read and write in place; ArgumentError where that would bypass autograd."""
    if tensor.requires_grad:
        if sys.modules["torch"].is_grad_enabled():
            raise ArgumentError("the tensor requires grad, and a fusec call is not recorded by autograd: call it "
                                "under torch.no_grad(), or pass x.detach()")
        tensor = tensor.detach()
    return tensor


def host_view(tensor) -> np.ndarray:
    """A CPU tensor as a NumPy array over the same memory, through DLPack. NumPy's
    DLPack import has no bfloat16: a bf16 tensor goes through an int16 view and
    comes out as ml_dtypes.bfloat16, still without a copy."""
    torch = sys.modules["torch"]
    tensor = readable(tensor)
    try:
        if tensor.dtype == torch.bfloat16:
            return np.from_dlpack(tensor.view(torch.int16)).view(BF16.numpy_dtype)
        return np.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        raise ArgumentError(f"cannot read this tensor ({exc})") from None


def device_view(cp, tensor, device: int):
    """A CUDA tensor as a CuPy array over the same memory, read from the tensor's
    address and layout: no DLPack import, which would cost ~30 us and order
    CuPy's current stream after torch's (an event wait that a CUDA-graph capture
    on torch's stream cannot take). Calls of torch tensors run on torch's stream."""
    tensor = readable(tensor)
    dtype = numpy_dtypes().get(tensor.dtype)
    if dtype is None:
        raise ArgumentError(f"dtype {tensor.dtype} is not a fusec type")
    try:
        address = tensor.data_ptr()
    except RuntimeError as exc:  # sparse, or a tensor without storage
        raise ArgumentError(f"cannot read this tensor ({exc})") from None
    strides = tuple(s * dtype.itemsize for s in tensor.stride())
    extent = 0 if tensor.numel() == 0 else \
        dtype.itemsize * (1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())))
    memory = cp.cuda.UnownedMemory(address, extent, tensor, device)  # holds the tensor alive
    return cp.ndarray(tuple(tensor.shape), dtype, cp.cuda.MemoryPointer(memory, 0), strides)


def device_kind(value) -> tuple[int, int]:
    """(DLPack device type, index) of an array that speaks DLPack, else (0, 0)."""
    try:
        kind, index = value.__dlpack_device__()
        return int(kind), int(index)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return 0, 0


class RawStream:
    """A CUDA stream by its handle, as CuPy's launches read one (`.ptr`)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr


class TorchTensors:
    """torch tensors on one device, as an ArrayKind (see `fusec.runtime.binder`).

    device: the torch device outputs are allocated on; view: a tensor as the
    backend's array (`host_view` or `device_view`).
    """

    name = "torch tensors"
    native = False

    def __init__(self, device, view):
        torch = sys.modules["torch"]
        self.device, self.view = device, view
        self._empty, self.pointer = torch.empty, torch.Tensor.data_ptr
        self._dtypes = {t.numpy_dtype: getattr(torch, t.torch) for t in ALL}
        self._templates: dict = {}  # NumPy dtype -> an empty tensor of it on the device (`allocator`)
        # stream_handle(): the handle of torch's current stream on the device (None: on the CPU)
        self.stream_handle = None
        if device.type == "cuda":
            # torch's raw stream handle, as Triton reads it (a torch.cuda.Stream costs ~5 us to make)
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            index = device.index
            self.stream_handle = functools.partial(raw, index) if raw is not None else \
                (lambda: torch.cuda.current_stream(index).cuda_stream)

    def empty(self, shape, dtype):
        return self._empty(shape, dtype=self._dtypes[dtype], device=self.device)

    def allocator(self, shape, dtype):
        """empty(shape, dtype) as a call of no arguments, with no frame of fusec's (the recorded
        calls'): the new_empty_strided method of an empty tensor of the dtype on the device (no
        memory; the new tensor takes its dtype and device), with the strides torch.empty gives.
        torch parses a method's shape and strides faster than torch.empty_strided's (whose
        dtype= and device= it parses too: 0.67 against 0.73 µs a call on the CPU), and those
        faster than torch.empty's shape tuple (1.2 µs: its slower overload)."""
        strides, step = [], 1
        for n in reversed(shape):
            strides.append(step)
            step *= max(n, 1)
        template = self._templates.get(dtype)
        if template is None:
            template = self._templates[dtype] = self._empty(0, dtype=self._dtypes[dtype], device=self.device)
        return functools.partial(template.new_empty_strided, tuple(shape), tuple(reversed(strides)))

    def stream(self):
        return None if self.stream_handle is None else RawStream(self.stream_handle())


@functools.cache
def numpy_dtypes() -> dict:
    """torch dtype -> the NumPy dtype of the same fusec type (read once torch is imported)."""
    torch = sys.modules["torch"]
    return {getattr(torch, t.torch): t.numpy_dtype for t in ALL}
