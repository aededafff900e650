"""The sim backend: emitted CUDA C compiled unchanged by the host C++ compiler
against `fusec_sim.h`, loaded with ctypes, every thread of the grid run in turn.

How CI checks the meaning of generated code without a GPU (as Numba's CUDA
simulator and Triton's interpreter do). Builds are cached on disk, keyed on
the module text, the shim and the compiler command.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from fusec.cache import cache_dir
from fusec.codegen.cexpr import scalar_param_type, storage_type
from fusec.codegen.emit import environment
from fusec.compiler import Compiled
from fusec.errors import ArgumentError
from fusec.ir.kernels import Kernel, kernel_params, variant_names
from fusec.ir.program import Slot
from fusec.runtime.binder import numpy_dtype
from fusec.runtime.executor import BLOCK_SIZE

SHIM = Path(__file__).with_name("fusec_sim.h")
# The sim's "persistent" grid: small, so that every thread strides over several elements.
PERSISTENT_SIM_BLOCKS = 2
# -fwrapv: signed overflow wraps, as on the GPU; -ffp-contract=off: no FMA
# contraction, so f32 arithmetic rounds after each operation, as NumPy does.
CXXFLAGS = ["-std=c++17", "-O1", "-fwrapv", "-ffp-contract=off", "-shared", "-fPIC", "-w"]

_CTYPES = {"bool": ctypes.c_bool, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
           "i64": ctypes.c_int64, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
           "u64": ctypes.c_uint64, "f16": ctypes.c_float, "bf16": ctypes.c_float, "f32": ctypes.c_float,
           "f64": ctypes.c_double}


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
    def __init__(self, compiled: Compiled):
        self.lib = ctypes.CDLL(str(self._build(compiled)))
        self.launched: list[str] = []  # variant names, in order (tests read which variant ran)
        self.functions = {}
        for kernel in compiled.plan.kernels:
            for name in dict.fromkeys(variant_names(kernel)):
                fn = getattr(self.lib, f"fz_launch_{name}")
                fn.argtypes = [ctypes.c_uint, ctypes.c_uint] + [_ctype(p) for p in kernel_params(kernel)]
                fn.restype = None
                self.functions[name] = fn

    def _build(self, compiled: Compiled) -> Path:
        launchers = []
        for kernel in compiled.plan.kernels:
            params, args = [], []
            for j, p in enumerate(kernel_params(kernel)):
                if p.kind == "array":
                    params.append(f"void* a{j}")
                    args.append(f"({storage_type(p.type)}*)a{j}")
                elif p.kind == "pointers":
                    params.append(f"void* a{j}")
                    args.append(f"({'' if p.written else 'const '}{storage_type(p.type)}* const*)a{j}")
                elif p.kind == "table":
                    params.append(f"void* a{j}")
                    args.append(f"(const long long*)a{j}")
                elif p.kind == "scalar":
                    params.append(f"{scalar_param_type(p.type)} a{j}")
                    args.append(f"a{j}")
                else:
                    params.append(f"long long a{j}")
                    args.append(f"a{j}")
            launchers += [{"name": name, "params": params, "args": args}
                          for name in dict.fromkeys(variant_names(kernel))]
        launcher = environment().get_template("sim_launcher.cpp.j2").render(module="module.cu", kernels=launchers)
        include = cuda_include_dir()
        command = ["g++", *CXXFLAGS, "-include", str(SHIM)] + ([f"-I{include}"] if include else [])
        key = hashlib.sha256("\0".join([compiled.cuda, launcher, SHIM.read_text(), *command]).encode()).hexdigest()
        folder = cache_dir("sim") / key[:24]
        library = folder / "module.so"
        if library.exists():
            return library
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "module.cu").write_text(compiled.cuda)
        (folder / "launch.cpp").write_text(launcher)
        partial = folder / f"module.{os.getpid()}.so"
        proc = subprocess.run(command + ["launch.cpp", "-o", partial.name], cwd=folder, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the host compiler rejected the emitted module (a fusec bug):\n{proc.stderr[-4000:]}")
        partial.replace(library)  # atomic: a concurrent build never sees half a file
        return library

    # ---- the Backend protocol
    def check_array(self, param: Slot, value):
        if not isinstance(value, np.ndarray):
            kind = "a GPU array" if hasattr(value, "__cuda_array_interface__") else type(value).__name__
            raise ArgumentError(f"parameter '{param.name}': the sim backend takes NumPy arrays, got {kind}")
        return check_host_array(param, value)

    def array_checker(self, param: Slot):
        return lambda value: self.check_array(param, value)

    def span(self, array: np.ndarray) -> tuple[int, int]:
        return host_span(array)

    def pointer(self, array: np.ndarray) -> int:
        return array.__array_interface__["data"][0]

    def signature(self, value) -> tuple | None:
        if type(value) is not np.ndarray:
            return None
        return self.pointer(value), value.shape, value.strides, value.dtype, value.flags.writeable

    def signatures(self, arrays: list) -> tuple | None:
        signatures = tuple(map(self.signature, arrays))
        return None if None in signatures else signatures

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def table(self, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(array)

    def stream(self, value):
        if value is not None:
            raise ArgumentError("stream= is for the cuda backend; the sim backend runs on the CPU")
        return None

    def launch(self, kernel: Kernel, n: int, args: list, stream, vector: bool) -> None:
        self.prepare_launch(kernel, n, vector)[1](args)

    def prepare_launch(self, kernel: Kernel, n: int, vector: bool) -> tuple[list, object]:
        name = variant_names(kernel)[vector]
        threads = -(-n // kernel.vector) if vector and not kernel.persistent else n
        blocks = -(-threads // BLOCK_SIZE)
        if kernel.persistent:  # a persistent grid: few blocks, so the grid-stride loop is exercised
            blocks = min(blocks, PERSISTENT_SIM_BLOCKS)
        function = self.functions[name]

        def fire(args):
            self.launched.append(name)
            function(blocks, BLOCK_SIZE, *[a.ctypes.data if isinstance(a, np.ndarray) else a for a in args])
        return [None] * len(kernel_params(kernel)), fire

    def address(self, pointer: int) -> int:
        return pointer

    def foreign(self, value) -> bool:
        return False

    def hand_off(self) -> None:
        pass


def check_host_array(param: Slot, value: np.ndarray) -> np.ndarray:
    """dtype, layout and writeability of a NumPy array for an array parameter."""
    expected = numpy_dtype(param.type)
    if value.dtype != expected:
        raise ArgumentError(f"parameter '{param.name}': expected dtype {param.type} ({expected}), got {value.dtype}")
    if param.role == "inout" and not value.flags.writeable:
        raise ArgumentError(f"parameter '{param.name}' is inout, but the array is read-only "
                            "(a broadcast view or a read-only buffer)")
    if not value.flags.c_contiguous:
        raise ArgumentError(f"parameter '{param.name}': the array is not C-contiguous (strides {value.strides}); "
                            "pass np.ascontiguousarray(...)")
    return value


def host_span(array: np.ndarray) -> tuple[int, int]:
    start = array.__array_interface__["data"][0]
    return start, start + array.nbytes


def _ctype(p):
    if p.kind in ("array", "pointers", "table"):
        return ctypes.c_void_p
    if p.kind == "scalar":
        return _CTYPES[p.type.name]
    return ctypes.c_longlong
