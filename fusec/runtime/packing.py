"""A kernel's arguments packed as the CUDA driver takes them: one buffer holding
every parameter at its C alignment, and an array of `void*`, one per
parameter, pointing into it (cuLaunchKernel's `kernelParams`).

Both runtimes launch through it: the cuda backend hands the pointer array to
the driver, the sim backend to its launcher, which reads each parameter back
as the kernel declares it (`*(T*)params[j]`), so every sim test checks the
packing against the kernel's parameter list. The buffer is laid out once per
variant; a launch rewrites it in one `struct.pack_into` (addresses, sizes and
scalars) and passes the same pointer array.
"""
from __future__ import annotations

import ctypes
import struct
import threading

from fusec.ir.launch import KernelParam


def param_format(param: KernelParam) -> str:
    """The `struct` code of one parameter: an address, or its scalar type."""
    return "P" if param.pack is None else param.pack.numpy_dtype.char


class ArgumentBuffer:
    """One function's packed arguments, reused launch after launch.

    `fill(values)` writes them (addresses as ints, scalars as Python or NumPy
    numbers) and returns the address of the pointer array. Callers that
    launch from several threads hold `lock` from fill to launch."""

    __slots__ = ("layout", "buffer", "pointers", "params", "lock", "offsets")

    def __init__(self, params: tuple[KernelParam, ...] | list[KernelParam]):
        formats = [param_format(p) for p in params]
        self.layout = struct.Struct("@" + "".join(formats))
        self.buffer = ctypes.create_string_buffer(max(self.layout.size, 1))
        base = ctypes.addressof(self.buffer)
        self.offsets = _offsets(formats)
        self.pointers = (ctypes.c_void_p * max(len(formats), 1))(*[base + o for o in self.offsets])
        self.params = ctypes.addressof(self.pointers)
        self.lock = threading.Lock()

    def fill(self, values) -> int:
        self.layout.pack_into(self.buffer, 0, *values)
        return self.params


def _offsets(formats: list[str]) -> list[int]:
    """Each parameter's offset in the buffer: where `struct`'s native mode puts it."""
    return [struct.calcsize("@" + "".join(formats[:j + 1])) - struct.calcsize("@" + fmt)
            for j, fmt in enumerate(formats)]
