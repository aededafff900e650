"""CUDA C for types, constants and operators: one table, op -> format.

Values are computed in their compute type (f16/bf16 in float). Integer types
narrower than 32 bits are wrapped back to their width after each operation,
since C promotes them to int. The helpers named fz_* are defined by the
module's prelude (templates/prelude.cu.j2) with the README's semantics.
"""
from __future__ import annotations

import math

import numpy as np

from fusec.types import INT_RANGE, ScalarType

C_TYPES = {
    "bool": "bool", "i8": "signed char", "i16": "short", "i32": "int", "i64": "long long",
    "u8": "unsigned char", "u16": "unsigned short", "u32": "unsigned int", "u64": "unsigned long long",
    "f16": "__half", "bf16": "__nv_bfloat16", "f32": "float", "f64": "double",
}
_INT_SUFFIX = {"i32": "", "i64": "LL", "u32": "u", "u64": "ull"}


def storage_type(t: ScalarType) -> str:
    return C_TYPES[t.name]


def compute_type(t: ScalarType) -> str:
    return C_TYPES[t.compute.name]


def scalar_param_type(t: ScalarType) -> str:
    """Scalars are passed in their compute type (an f16 scalar as a float)."""
    return compute_type(t)


def const(value, t: ScalarType) -> str:
    """A literal of type t; a negative one parenthesized, so `-x` of it cannot read as `--`."""
    text = _const(value, t)
    return f"({text})" if text.startswith("-") else text


def _const(value, t: ScalarType) -> str:
    if t.is_bool:
        return "true" if value else "false"
    if t.is_int:
        value = int(value)
        if t.name in _INT_SUFFIX:
            lo, _ = INT_RANGE[t]
            if value == lo:  # -2147483648 is not a literal in C: write MIN as -MAX - 1
                return f"({value + 1}{_INT_SUFFIX[t.name]} - 1)"
            return f"{value}{_INT_SUFFIX[t.name]}"
        return f"({C_TYPES[t.name]}){value}"
    return float_const(float(value), t.compute.bits == 64)


def float_const(v: float, double: bool) -> str:
    if math.isnan(v):
        return "__longlong_as_double(0x7ff8000000000000LL)" if double else "__int_as_float(0x7fffffff)"
    if math.isinf(v):
        if double:
            return f"__longlong_as_double({'0xfff0000000000000LL' if v < 0 else '0x7ff0000000000000LL'})"
        return f"__int_as_float({'0xff800000' if v < 0 else '0x7f800000'})"
    # The shortest text that reads back exactly; Python and NumPy always write a '.' or an exponent.
    text = repr(v) if double else str(np.float32(v))
    return text if double else text + "f"


# Float math: (f32 form, f64 form); "{0}" etc. are the operands.
_FLOAT_FUNCS = {
    name: (f"{name}f({{0}})", f"{name}({{0}})")
    for name in "sqrt rsqrt cbrt exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh "
                "erf floor ceil trunc".split()
}
_FLOAT_FUNCS.update({
    "round": ("rintf({0})", "rint({0})"),          # half to even
    "sigmoid": ("1.0f / (1.0f + expf(-{0}))", "1.0 / (1.0 + exp(-{0}))"),
    "abs": ("fabsf({0})", "fabs({0})"),
    "min": ("fminf({0}, {1})", "fmin({0}, {1})"),  # a NaN operand yields the other
    "max": ("fmaxf({0}, {1})", "fmax({0}, {1})"),
    "clamp": ("fminf(fmaxf({0}, {1}), {2})", "fmin(fmax({0}, {1}), {2})"),
    "atan2": ("atan2f({0}, {1})", "atan2({0}, {1})"),
    "pow": ("powf({0}, {1})", "pow({0}, {1})"),
    "fma": ("fmaf({0}, {1}, {2})", "fma({0}, {1}, {2})"),
    "mod": ("fmodf({0}, {1})", "fmod({0}, {1})"),
    "div": ("{0} / {1}", "{0} / {1}"),
    "isnan": ("isnan({0})", "isnan({0})"),
    "isinf": ("isinf({0})", "isinf({0})"),
})
_INT_FUNCS = {
    "div": "fz_div({0}, {1})", "mod": "fz_mod({0}, {1})", "pow": "fz_ipow({0}, {1})", "abs": "fz_abs({0})",
    "min": "fz_min({0}, {1})", "max": "fz_max({0}, {1})", "clamp": "fz_min(fz_max({0}, {1}), {2})",
}
_OPERATORS = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "neg": "-{0}",
    "lt": "{0} < {1}", "le": "{0} <= {1}", "gt": "{0} > {1}", "ge": "{0} >= {1}", "eq": "{0} == {1}",
    "ne": "{0} != {1}", "and": "{0} && {1}", "or": "{0} || {1}", "not": "!{0}", "select": "{0} ? {1} : {2}",
}
# Fast math (`fast_math=True`): the f32 functions CUDA has a hardware
# approximation of, as its intrinsic (CUDA Programming Guide, "Intrinsic
# Functions"), tanh as PTX's tanh.approx.f32 (sm_75 and later) and erf as
# fusec's own (the prelude's fz_erf_fast); each one's error is in the README.
# log1p, atan2 and the rest have none and stay accurate. Division is
# __fdividef; sigmoid uses __expf.
_FAST_F32 = {
    "tanh": "fz_tanh_fast({0})", "erf": "fz_erf_fast({0})",
    "exp": "__expf({0})", "log": "__logf({0})", "log2": "__log2f({0})", "log10": "__log10f({0})",
    "sin": "__sinf({0})", "cos": "__cosf({0})", "tan": "__tanf({0})", "pow": "__powf({0}, {1})",
    "div": "__fdividef({0}, {1})", "sigmoid": "__fdividef(1.0f, 1.0f + __expf(-{0}))",
}
FAST_FUNCTIONS = tuple(_FAST_F32)

# Helpers in the prelude that each op needs.
HELPERS = {"fz_div": "div", "fz_mod": "mod", "fz_ipow": "pow", "fz_abs": "abs", "fz_min": "min",
           "fz_max": "max", "fz_f2i": "f2i", "fz_tanh_fast": "tanh_fast",
           "fz_erf_fast": "erf_fast"}


def op_expr(op: str, t: ScalarType, operand_type: ScalarType, args: list[str], fast: bool = False) -> str:
    """C expression for `op` producing type `t` from operands of `operand_type`
    (with `fast`, an f32 function's hardware approximation where CUDA has one)."""
    if op in _OPERATORS:
        text = _OPERATORS[op].format(*args)
    elif fast and operand_type.is_float and operand_type.compute.bits == 32 and op in _FAST_F32:
        text = _FAST_F32[op].format(*args)
    elif operand_type.is_float:
        f32, f64 = _FLOAT_FUNCS[op]
        text = (f64 if operand_type.compute.bits == 64 else f32).format(*args)
    else:
        text = _INT_FUNCS[op].format(*args)
    if t.is_int and t.bits < 32 and op not in ("min", "max", "clamp", "select"):
        text = f"({C_TYPES[t.name]})({text})"  # wrap to the narrow width, as the README says
    return text


def cast_expr(src: ScalarType, dst: ScalarType, arg: str) -> str:
    if dst.is_bool:
        return f"{arg} != 0" if not src.is_bool else arg
    if dst.is_int and src.is_float:
        lo, hi = INT_RANGE[dst]
        return f"fz_f2i<{C_TYPES[dst.name]}>({arg}, {const(lo, dst)}, {const(hi, dst)})"
    if dst.is_half:
        return load_expr(dst, rounded(src, dst, arg))
    return f"({compute_type(dst)}){arg}"


def rounded(src: ScalarType, dst: ScalarType, arg: str) -> str:
    """A value of type `src` rounded once to f16 or bf16 `dst`, in its storage type:
    what a cast computes, and what a store of the cast's value stores (rounding
    the rounded value again changes nothing: one conversion, not two)."""
    if dst.name == "f16":
        # An integer beyond f32's 24 bits is beyond f16's range (65520 rounds to inf), so
        # through float (or double) it rounds once; __double2half is correctly rounded.
        return f"__double2half({arg})" if src.compute.bits == 64 else f"__float2half_rn({_as_float(src, arg)})"
    return _to_bf16(src, arg)


# Conversions to bf16 that round once from a source wider than f32's 24 bits
# (through float, i32 -> f32 -> bf16 would round twice). CUDA's own, correctly
# rounded on the device and, with round-to-odd, on the host (the sim).
_BF16_FROM = {"f64": "__double2bfloat16", "i32": "__int2bfloat16_rn", "u32": "__uint2bfloat16_rn",
              "i64": "__ll2bfloat16_rn", "u64": "__ull2bfloat16_rn"}


def _to_bf16(src: ScalarType, arg: str) -> str:
    if src.name in _BF16_FROM:
        return f"{_BF16_FROM[src.name]}({arg})"
    return f"__float2bfloat16_rn({_as_float(src, arg)})"  # exact in f32 first: rounds once


def _as_float(src: ScalarType, arg: str) -> str:
    return arg if src.compute.name == "f32" else f"(float){arg}"


def load_expr(t: ScalarType, ref: str) -> str:
    """A value read from memory, in its compute type."""
    if t.name == "f16":
        return f"__half2float({ref})"
    if t.name == "bf16":
        return f"__bfloat162float({ref})"
    return ref


def store_expr(t: ScalarType, value: str) -> str:
    """A computed value (exact in `t` already) converted to storage."""
    if t.name == "f16":
        return f"__float2half_rn({value})"
    if t.name == "bf16":
        return f"__float2bfloat16_rn({value})"
    return value
