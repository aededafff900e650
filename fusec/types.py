"""Scalar types and the promotion rules of .fz (written down in the README).

Strong types come from declarations; literals are *weak* and take the type of
the other operand. f16 and bf16 are storage types: arithmetic on them is done
in f32 and rounded when stored.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ScalarType:
    """A .fz scalar type and its names in every language fusec talks to (the one table)."""

    name: str
    kind: str  # "bool" | "int" | "uint" | "float"
    bits: int
    c: str       # the C/CUDA type a value is stored as
    numpy: str   # NumPy's dtype name (bf16: ml_dtypes' bfloat16)
    ctypes: str  # the ctypes type of a host scalar of this type
    torch: str   # the torch dtype's name

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def is_half(self) -> bool:
        """f16 or bf16: stored in 16 bits, computed in f32."""
        return self.name in ("f16", "bf16")

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def compute(self) -> "ScalarType":
        """The type arithmetic is done in (f16 and bf16 compute in f32)."""
        return F32 if self.is_half else self

    @property
    def regs(self) -> int:
        """32-bit registers a value of this type occupies while computed."""
        return 2 if self.compute.bits == 64 else 1

    @property
    def numpy_dtype(self) -> np.dtype:
        return _numpy_dtype(self.numpy)

    def __str__(self) -> str:
        return self.name


@functools.cache
def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _int(kind: str, bits: int) -> ScalarType:
    signed = kind == "int"
    c = {8: "signed char" if signed else "unsigned char", 16: "short", 32: "int", 64: "long long"}[bits]
    if not signed and bits > 8:
        c = "unsigned " + c
    numpy = f"{'int' if signed else 'uint'}{bits}"
    return ScalarType(f"{'i' if signed else 'u'}{bits}", kind, bits, c, numpy, f"c_{numpy}", numpy)


BOOL = ScalarType("bool", "bool", 8, "bool", "bool", "c_bool", "bool")
I8, I16, I32, I64 = (_int("int", b) for b in (8, 16, 32, 64))
U8, U16, U32, U64 = (_int("uint", b) for b in (8, 16, 32, 64))
F16 = ScalarType("f16", "float", 16, "__half", "float16", "c_float", "float16")  # a host scalar is passed as float
BF16 = ScalarType("bf16", "float", 16, "__nv_bfloat16", "bfloat16", "c_float", "bfloat16")
F32 = ScalarType("f32", "float", 32, "float", "float32", "c_float", "float32")
F64 = ScalarType("f64", "float", 64, "double", "float64", "c_double", "float64")

ALL = (BOOL, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64)
BY_NAME = {t.name: t for t in ALL}

# Defaults for a value that is weak all the way through (`t = 2.0;`).
DEFAULT_INT = I32
DEFAULT_FLOAT = F32

INT_RANGE = {t: ((-(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1) if t.kind == "int" else (0, (1 << t.bits) - 1))
             for t in ALL if t.is_int}


def promote(a: ScalarType, b: ScalarType) -> ScalarType | None:
    """The common type of two strong operands, or None where there is none."""
    if a == b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float and b.is_float:
        if {a.name, b.name} == {"f16", "bf16"}:
            return F32
        return a if a.bits > b.bits else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    if a.kind == b.kind:
        return a if a.bits > b.bits else b
    signed, unsigned = (a, b) if a.kind == "int" else (b, a)
    if signed.bits > unsigned.bits:
        return signed
    if unsigned.bits < 64:
        return BY_NAME[f"i{unsigned.bits * 2}"]
    return None


def can_convert(src: ScalarType, dst: ScalarType) -> bool:
    """Implicit conversion on assignment and on passing a stage argument.

    NumPy's "same_kind" casting: bool -> int -> float, and narrowing within a
    kind (f32 -> f16 rounds, i64 -> i32 wraps). Float to int or anything to
    bool needs an explicit cast.
    """
    order = {"bool": 0, "uint": 1, "int": 1, "float": 2}
    if dst.is_bool:
        return src.is_bool
    return order[src.kind] <= order[dst.kind]


_BY_DTYPE_NAME = {t.numpy: t for t in ALL} | {t.torch: t for t in ALL}


def from_dtype(dtype) -> ScalarType | None:
    """The .fz type of a NumPy, CuPy, ml_dtypes or torch dtype (None: none matches)."""
    return _BY_DTYPE_NAME.get(str(dtype).removeprefix("torch."))
