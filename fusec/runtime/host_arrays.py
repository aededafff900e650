"""Host arrays as the binder sees them: the sim and numpy backends' arrays.

NumPy arrays are used as they are (bf16 as ml_dtypes.bfloat16); any other
array in host memory that speaks DLPack is imported without a copy: CPU torch
tensors (a call of them returns torch tensors), or another library's arrays
(a call of them returns NumPy arrays).
"""
from __future__ import annotations

import numpy as np

from fusec.errors import ArgumentError
from fusec.interop import torch_arrays
from fusec.ir.launch import SignatureParam
from fusec.runtime.binder import ArrayKind, OwnArrays


class HostArrays:
    """Arrays in host memory: NumPy arrays, and CPU arrays of other libraries through DLPack."""

    def __init__(self, backend: str):
        self.backend = backend  # for messages: "the sim backend"
        self.own = OwnArrays("NumPy arrays", np.empty, host_pointer)
        self._torch: ArrayKind | None = None

    def kind(self, value) -> ArrayKind:
        if type(value) is np.ndarray or not torch_arrays.is_tensor(value):
            return self.own
        if self._torch is None:
            import torch
            self._torch = torch_arrays.TorchTensors(torch.device("cpu"), torch_arrays.host_view)
        return self._torch

    def adopt(self, value):
        if isinstance(value, np.ndarray):
            return value
        device, _ = torch_arrays.device_kind(value)
        if device == torch_arrays.DLPACK_CPU:
            if torch_arrays.is_tensor(value):
                return torch_arrays.host_view(value)
            try:
                return np.from_dlpack(value)
            except (BufferError, RuntimeError, TypeError, ValueError) as exc:
                raise ArgumentError(f"cannot read this array ({exc})") from None
        if device != 0 or hasattr(value, "__cuda_array_interface__"):
            hint = " (x.cpu())" if torch_arrays.is_tensor(value) else ""
            raise ArgumentError(f"{self.backend} takes arrays in host memory, got a GPU array{hint}")
        raise ArgumentError(f"{self.backend} takes NumPy arrays or CPU tensors, got {type(value).__name__}")

    def contiguous(self, array) -> bool:
        return array.flags.c_contiguous

    def broadcast(self, array) -> bool:
        return 0 in array.strides and array.size > 1

    def writeable(self, array) -> bool:
        return array.flags.writeable

    def span(self, array) -> tuple[int, int]:
        start = host_pointer(array)
        return start, start + array.nbytes

    def fast(self, param: SignatureParam, dtype):
        return None


def host_pointer(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]
