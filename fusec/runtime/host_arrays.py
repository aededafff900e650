"""NumPy arrays as the binder sees them: the sim and numpy backends' arrays."""
from __future__ import annotations

import numpy as np

from fusec.errors import ArgumentError
from fusec.ir.launch import SignatureParam


class HostArrays:
    """Arrays in host memory: NumPy arrays (bf16 as ml_dtypes.bfloat16)."""

    def __init__(self, backend: str):
        self.backend = backend  # for messages: "the sim backend"

    def adopt(self, value):
        if isinstance(value, np.ndarray):
            return value
        kind = "a GPU array" if hasattr(value, "__cuda_array_interface__") else type(value).__name__
        raise ArgumentError(f"{self.backend} takes NumPy arrays, got {kind}")

    def contiguous(self, array) -> bool:
        return array.flags.c_contiguous

    def broadcast(self, array) -> bool:
        return 0 in array.strides and array.size > 1

    def writeable(self, array) -> bool:
        return array.flags.writeable

    def span(self, array) -> tuple[int, int]:
        start = array.__array_interface__["data"][0]
        return start, start + array.nbytes

    def fast(self, param: SignatureParam, dtype):
        return None
