"""The builtin functions and constants of .fz, with their typing rules.

One table, read by the type checker, the NumPy reference and the CUDA
emitter, so that the three agree on what exists.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


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

# Row reductions over the last axis (pipelines only): name -> (IR op, arity).
# Their result has the operand's shape with a trailing 1 and is computed in the
# accumulation type (f32 for f16/bf16/f32, f64 for f64). row_length(x) is the
# row's length (its count of elements, read from the shape: x is not computed),
# of any type's array: what "divide by the row's length" is written with (a
# mean's gradient), free in a row kernel.
ROW_REDUCTIONS: dict[str, tuple[str, int]] = {
    "row_sum": ("sum", 1), "row_mean": ("mean", 1), "row_max": ("max", 1), "row_min": ("min", 1),
    "row_var": ("var", 1), "row_logsumexp": ("logsumexp", 1), "row_pick": ("pick", 2),
    "row_length": ("length", 1),
}

# Each element's place along the last axis of its argument (an array; 0 to the
# axis's length - 1, as i64), in pipelines only: `row_position(x) == label` picks
# the element row_pick(x, label) picks (its gradient's one-hot).
POSITIONS = ("row_position",)

# Column reductions over the first axis (pipelines only): the result has the
# operand's shape without its first dim, in the accumulation type. Summed in the
# fixed order of ir.program.COLUMN_CHUNKS.
COLUMN_REDUCTIONS = ("col_sum",)

# Weak float constants (pi and e to more digits than f64 holds, so that a literal
# of any type rounds them once: see literals), and the two bools.
FLOAT_CONSTANTS = {
    "pi": Fraction("3.14159265358979323846264338327950288419716939937510582097494459"),
    "e": Fraction("2.71828182845904523536028747135266249775724709369995957496696763"),
    "inf": math.inf,
    "nan": math.nan,
}
BOOL_CONSTANTS = {"true": True, "false": False}

# Operators: source spelling -> IR op name.
ARITH_OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "**": "pow"}
COMPARE_OPS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
LOGIC_OPS = {"&&": "and", "||": "or"}

# ---- what to say about a function that does not exist
# Reductions: statements are elementwise, so a call of one is a reduction the language lacks.
REDUCTIONS = frozenset("prod product argmax argmin norm std cumsum cumprod softmax log_softmax "
                       "any all dot matmul reduce count nansum nanmean median".split())
# Names users try for a row reduction .fz has: the spelling to write.
ROW_ALIASES = {"sum": "row_sum", "mean": "row_mean", "amax": "row_max", "amin": "row_min", "var": "row_var",
               "logsumexp": "row_logsumexp", "gather": "row_pick", "take": "row_pick"}
RANDOM = frozenset("rand randn randint random uniform normal bernoulli dropout seed rng philox".split())
CONTROL = frozenset("if else elif for while do switch loop".split())
# NumPy and C names of builtins, and functions written with builtins.
ALIASES = {
    "maximum": "max", "minimum": "min", "fmax": "max", "fmin": "min", "clip": "clamp", "power": "pow",
    "fabs": "abs", "absolute": "abs", "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arctan2": "atan2",
    "ln": "log", "rint": "round", "select": "where", "ifelse": "where",
    "relu": "max(x, 0.0)", "square": "x * x", "sign": "x > 0.0 ? 1.0 : x < 0.0 ? -1.0 : 0.0",
    "reciprocal": "1.0 / x", "neg": "-x", "isfinite": "!isnan(x) && !isinf(x)",
}


def unknown_function(name: str, known: list[str]) -> str:
    """The message for a call of `name`, which is neither a builtin, a cast nor a stage
    (`known`: the stages and types that may be called)."""
    if name in ROW_ALIASES:
        return (f"unknown function '{name}'; a reduction over each row (the last axis) is "
                f"{ROW_ALIASES[name]}(x), with shape [..., 1]")
    if name in REDUCTIONS:
        return (f"'{name}' is a reduction .fz does not have: the row reductions over the last axis are "
                f"{', '.join(ROW_REDUCTIONS)}, and col_sum sums over the first; compute it outside fusec "
                "and pass it in")
    if name in RANDOM:
        return (f"'{name}': .fz has no random number generation; draw the random values outside fusec "
                "(e.g. cupy.random) and pass them in as an array")
    if name in CONTROL:
        return (f"'{name}' is not in .fz: there is no control flow; choose with `c ? a : b` or "
                "`where(c, a, b)`, and repeat statements with `repeat N { ... }` in a pipeline")
    if ALIASES.get(name):
        return f"unknown function '{name}'; write {_quote(ALIASES[name])}"
    close = closest(name, sorted(BUILTINS) + sorted(ROW_REDUCTIONS) + list(COLUMN_REDUCTIONS) + known)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown function '{name}'{hint}"


def _quote(text: str) -> str:
    return f"'{text}'" if text.isidentifier() else f"`{text}`"


def closest(name: str, candidates: list[str]) -> list[str]:
    """The candidates within a small edit distance of `name` (typos), nearest first, at most 3."""
    limit = 1 if len(name) <= 4 else 2
    scored = sorted((d, c) for c in set(candidates) if (d := edit_distance(name.lower(), c.lower())) <= limit)
    return [c for _, c in scored[:3]]


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and
    adjacent transpositions (`tahn` is one edit from `tanh`)."""
    if abs(len(a) - len(b)) > 2:
        return 3  # farther than any limit used
    prev2, prev = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if prev2 is not None and i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]
