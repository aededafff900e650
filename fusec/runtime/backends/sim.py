"""The sim backend: emitted CUDA C compiled unchanged by the host C++ compiler
against `fusec_sim.h`, loaded with ctypes, every thread of the grid run in turn.

How CI checks the meaning of generated code without a GPU (as Numba's CUDA
simulator and Triton's interpreter do). Builds are cached on disk, keyed on
the module text, the shim and the compiler command.
"""
from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import numpy as np

from fusec.codegen.sim_launcher import emit_sim_launcher
from fusec.errors import ArgumentError
from fusec.ir.launch import KernelParam, LaunchInterface, block_threads
from fusec.runtime.host_arrays import HostArrays
from fusec.runtime.host_compiler import compile_shared_library
from fusec.runtime.packing import ArgumentBuffer
from fusec.target import BLOCK_SIZE

SHIM = Path(__file__).with_name("fusec_sim.h")
# The sim's "persistent" grid: small, so that every thread strides over several elements
# (a streaming cluster kernel: this many clusters, each taking several rows).
PERSISTENT_SIM_BLOCKS = 2
# -fwrapv: signed overflow wraps, as on the GPU; -ffp-contract=off: no FMA
# contraction, so f32 arithmetic rounds after each operation, as NumPy does.
# -fno-builtin: math functions of constants are computed at run time, by the C
# library, as those of loaded values are (g++ would fold tanh(-0.79) correctly
# rounded at compile time, glibc is 1 ulp off: a fused and an unfused form differed).
CXXFLAGS = ["-std=c++17", "-O1", "-fwrapv", "-ffp-contract=off", "-fno-builtin", "-w", "-pthread"]


def cuda_include_dir() -> str | None:
    """Where cuda_fp16.h lives (the CUDA toolkit's headers compile on the host)."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    candidates.append("/usr/local/cuda")
    for root in filter(None, candidates):
        if (Path(root) / "include" / "cuda_fp16.h").exists():
            return str(Path(root) / "include")
    return None


class SimBackend:
    """Builds the module for the host and runs each launch's whole grid, thread by thread."""

    # Arrays reach `launcher` as themselves: each launch copies them between guard zones.
    by_address = False

    def __init__(self, cuda_source: str, interface: LaunchInterface):
        self.arrays = HostArrays("the sim backend")
        self.lib = ctypes.CDLL(str(self._build(cuda_source, interface)))
        self.launched: list[str] = []  # variant names, in order (tests read which variant ran)
        self.functions = {}  # variant -> (launcher, its argument buffer)
        self.blocks: dict[str, int] = {}  # variant -> threads a block
        for launch in interface.kernels:
            for variant in launch.variants:
                fn = getattr(self.lib, f"fz_launch_{variant.name}")
                # returns what the sim found wrong (a barrier not every thread reaches ...), or NULL
                fn.argtypes, fn.restype = [ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p], ctypes.c_char_p
                self.functions[variant.name] = (fn, ArgumentBuffer(launch.params))
                self.blocks[variant.name] = block_threads(variant, BLOCK_SIZE)

    def _build(self, cuda_source: str, interface: LaunchInterface) -> Path:
        launcher = emit_sim_launcher(interface, "module.cu")
        include = cuda_include_dir()
        flags = [*CXXFLAGS, "-include", str(SHIM)] + ([f"-I{include}"] if include else [])
        return compile_shared_library({"module.cu": cuda_source, "launch.cpp": launcher},
                                      key_parts=[SHIM.read_text()], flags=flags)

    # ---- launching
    def block(self, variant: str) -> int:
        return self.blocks[variant]

    def fill_blocks(self, variant: str, block: int) -> int:
        return PERSISTENT_SIM_BLOCKS

    def packer(self, param: KernelParam):
        return None  # fire() packs scalars and guarded arrays' addresses itself

    def launcher(self, variant: str, grid: int, block: int, shared_bytes: int = 0):
        """`shared_bytes` is the launcher's to compute (sim_launcher: from the row's length)."""
        (function, arguments), launched = self.functions[variant], self.launched

        def fire(args, stream=None):
            launched.append(variant)
            guarded = [_Guarded(a) if isinstance(a, np.ndarray) else None for a in args]
            with arguments.lock:  # ctypes lets other threads run during the launch
                params = arguments.fill([a if g is None else g.address for g, a in zip(guarded, args)])
                error = function(grid, block, params)
            if error is not None:
                raise RuntimeError(f"the sim's {variant}: {error.decode()} (a fusec bug)")
            for g in guarded:
                if g is not None:
                    g.finish(variant)
        return fire

    # ---- arrays
    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def pointer(self, array: np.ndarray) -> int:
        return array.__array_interface__["data"][0]

    def signature(self, value) -> tuple | None:
        if type(value) is not np.ndarray:
            return None
        return self.pointer(value), value.shape, value.strides, value.dtype, value.flags.writeable

    def signatures(self, arrays: list) -> tuple | None:
        signatures = tuple(map(self.signature, arrays))
        return None if None in signatures else signatures

    def table(self, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(array)

    def stream(self, value):
        if value is not None:
            raise ArgumentError("stream= is for the cuda backend; the sim backend runs on the CPU")
        return None



# Bounds checking: each array a kernel gets is a copy between two guard zones of
# a known pattern; after the launch a changed zone is a stray write (a fusec
# bug), reported as such rather than left to corrupt memory or crash the process.
GUARD_BYTES = 256
GUARD_FILL = 0xA5


class _Guarded:
    """An array argument copied into the middle of a guarded buffer for one launch."""

    __slots__ = ("array", "buffer", "view")

    def __init__(self, array: np.ndarray):
        self.array = array
        size = array.nbytes
        self.buffer = np.full(size + 2 * GUARD_BYTES, GUARD_FILL, np.uint8)
        self.view = self.buffer[GUARD_BYTES:GUARD_BYTES + size]
        # Bytes through a view, not the buffer protocol: ml_dtypes' bfloat16 does not export one.
        self.view[...] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)

    @property
    def address(self) -> int:
        return self.view.__array_interface__["data"][0]

    def finish(self, variant: str) -> None:
        """Checks the guard zones, then gives the kernel's writes to the array."""
        if (self.buffer[:GUARD_BYTES] != GUARD_FILL).any() or (self.buffer[GUARD_BYTES + self.view.size:]
                                                              != GUARD_FILL).any():
            raise RuntimeError(f"the sim's {variant} wrote outside an array it was given (a fusec bug)")
        if not self.view.size:
            return
        flat = self.array.reshape(-1).view(np.uint8)
        if self.array.flags.writeable:
            flat[...] = self.view
        elif (flat != self.view).any():
            raise RuntimeError(f"the sim's {variant} wrote into a read-only array (a fusec bug)")
