"""The builtin functions and constants of .fz, with their typing rules.

One table, read by the type checker, the NumPy reference and the CUDA
emitter, so that the three agree on what exists.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Builtin:
    arity: int
    # How operand and result types are formed:
    #   "float":  operands promoted together, ints -> f32; result that float type
    #   "num":    operands promoted together (numeric); result that type
    #   "round":  like "num", the identity on integers
    #   "class":  one numeric operand; result bool
    #   "select": (bool, T, T) -> T
    rule: str


_FLOAT1 = ("sqrt rsqrt cbrt exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan "
           "sinh cosh tanh sigmoid erf").split()

BUILTINS: dict[str, Builtin] = {
    **{name: Builtin(1, "float") for name in _FLOAT1},
    **{name: Builtin(1, "round") for name in ("floor", "ceil", "round", "trunc")},
    "abs": Builtin(1, "num"),
    "min": Builtin(2, "num"),
    "max": Builtin(2, "num"),
    "clamp": Builtin(3, "num"),
    "atan2": Builtin(2, "float"),
    "pow": Builtin(2, "float"),
    "fma": Builtin(3, "float"),
    "where": Builtin(3, "select"),
    "isnan": Builtin(1, "class"),
    "isinf": Builtin(1, "class"),
}

# Weak float constants, and the two bools.
FLOAT_CONSTANTS = {"pi": math.pi, "e": math.e, "inf": math.inf, "nan": math.nan}
BOOL_CONSTANTS = {"true": True, "false": False}

# Operators: source spelling -> IR op name.
ARITH_OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "**": "pow"}
COMPARE_OPS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
LOGIC_OPS = {"&&": "and", "||": "or"}
