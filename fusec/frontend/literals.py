"""Values of literals: exact folding of literal expressions, and rounding to a type.

An expression of literals alone (`200 - 100`, `1.0 / 3.0`, `-pi`) is folded
when it is checked, so that only its value meets a strong type:

- integers exactly (arbitrary precision), with C's `/` and `%` (truncation,
  `x / 0 == 0`) and the README's integer `**`;
- floats as exact rationals (`Fraction`), with IEEE's signed zeros,
  infinities and NaN kept as Python floats, so that rounding the value to a
  float type rounds once. `**` with a non-integer or huge exponent is the one
  inexact operation: it is computed in f64.

Rounding is to nearest, ties to even, into the binary formats of f16, bf16,
f32 and f64 (subnormals included); a value beyond the largest finite number
by half an ulp or more rounds to infinity.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np

from fusec.frontend.syntax import abbreviate

# Precision (bits, with the implicit one), smallest and largest normal exponent.
FORMATS = {"f16": (11, -14, 15), "bf16": (8, -126, 127), "f32": (24, -126, 127), "f64": (53, -1022, 1023)}

# A float literal whose decimal exponent is beyond this is out of range for
# every type (f64 reaches 1.8e308 and, in subnormals, 4.9e-324); the bound
# keeps exact arithmetic on such texts cheap.
MAX_DECIMAL_EXPONENT = 400
# Significant digits kept exactly; the rest only as "nonzero" (sticky), which
# is enough to round to f64 once (an f64 tie has at most 767 digits).
MAX_DIGITS = 800
# Bits of a `**` result: beyond this an integer power is an error (no type holds
# it) and a float power is computed in f64 rather than exactly.
MAX_POWER_BITS = 4096

_FLOAT_TEXT = re.compile(r"(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?")


class LiteralError(ValueError):
    """A literal or literal expression whose value cannot be formed (the message says why)."""


def parse_float(text: str) -> Fraction | float:
    """The exact value of a float literal's text (`1.5e-3`, `.5`, `2.`)."""
    whole, frac, exp = _FLOAT_TEXT.fullmatch(text).groups()
    frac = frac or ""
    digits = (whole + frac).lstrip("0")
    if not digits:
        return 0.0
    exponent = int(exp or 0) - len(frac)
    if abs(exponent + len(digits) - 1) > MAX_DECIMAL_EXPONENT:
        raise LiteralError(f"float literal {abbreviate(text)} is out of range for every float type")
    if len(digits) > MAX_DIGITS:
        sticky = "1" if digits[MAX_DIGITS:].strip("0") else "0"
        exponent += len(digits) - MAX_DIGITS - 1
        digits = digits[:MAX_DIGITS] + sticky
    return Fraction(int(digits)) * Fraction(10) ** exponent


def as_float(value) -> Fraction | float:
    """An integer value where a float is wanted (`1 / 2 * 3.0`: the 0 becomes 0.0)."""
    if isinstance(value, int):
        return Fraction(value) if value else 0.0
    return value


def negate(value):
    if isinstance(value, int):
        return -value
    return -value if isinstance(value, Fraction) else -float(value)


def fold(op: str, a, b):
    """`a op b` for two values of one kind ("add", "sub", "mul", "div", "mod", "pow")."""
    if isinstance(a, int) and isinstance(b, int):
        return _fold_int(op, a, b)
    return _fold_float(op, as_float(a), as_float(b))


# ---- integers
def _fold_int(op: str, a: int, b: int) -> int:
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return 0 if b == 0 else _trunc_div(a, b)
    if op == "mod":
        return 0 if b == 0 else a - b * _trunc_div(a, b)
    assert op == "pow"
    if b < 0:
        return 1 if a == 1 else (-1 if b % 2 else 1) if a == -1 else 0
    if abs(a) >= 2 and b * (abs(a).bit_length() - 1) > MAX_POWER_BITS:
        raise LiteralError(f"{a} ** {b} is too large for any integer type")
    return a ** b


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


# ---- floats
def _fold_float(op: str, a, b):
    if op == "pow":
        return _pow(a, b)
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if op == "add":
            return _exact(a + b)
        if op == "sub":
            return _exact(a - b)
        if op == "mul":
            return a * b
        if op == "div":
            return a / b
        r = a - b * math.trunc(a / b)  # fmod: the sign of the dividend
        return r if r else _sign(a) * 0.0
    # A zero, an infinity or a NaN takes part: IEEE arithmetic. A finite non-zero
    # operand acts only through its sign there, except where it is the result.
    if op in ("add", "sub") and _is_zero(b) and isinstance(a, Fraction):
        return a
    if op == "add" and _is_zero(a) and isinstance(b, Fraction):
        return b
    if op == "sub" and _is_zero(a) and isinstance(b, Fraction):
        return -b
    if op == "mod" and isinstance(a, Fraction) and isinstance(b, float) and math.isinf(b):
        return a
    x, y = _stand_in(a), _stand_in(b)
    with np.errstate(all="ignore"):
        r = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "mod": np.fmod}[op](x, y)
    return from_float(float(r))


def _pow(a, b):
    if isinstance(a, Fraction) and isinstance(b, Fraction) and b.denominator == 1:
        size = max(a.numerator.bit_length(), a.denominator.bit_length())
        if abs(b.numerator) * size <= MAX_POWER_BITS:
            return a ** b.numerator
    with np.errstate(all="ignore"):
        return from_float(float(np.power(to_f64(a), to_f64(b))))


def _exact(r: Fraction):
    return r if r else 0.0  # x - x is +0 when rounding to nearest


def _sign(v: Fraction) -> float:
    """±1.0 (math.copysign would convert a huge Fraction to float, which overflows)."""
    return -1.0 if v < 0 else 1.0


def _is_zero(v) -> bool:
    return isinstance(v, float) and v == 0.0


def _stand_in(v) -> np.float64:
    return np.float64(_sign(v) if isinstance(v, Fraction) else v)


def from_float(x: float):
    """A Python float (an f64 result, a constant's attribute) as a value."""
    return Fraction(x) if math.isfinite(x) and x != 0.0 else x


def saturate(value, lo: int, hi: int) -> int:
    """A float value cast to an integer type: truncated, saturated, NaN -> 0 (the README's casts)."""
    if isinstance(value, float) and math.isnan(value):
        return 0
    if isinstance(value, float) and math.isinf(value):
        return hi if value > 0 else lo
    return min(max(math.trunc(value), lo), hi)


def to_f64(value) -> float:
    """The nearest f64 (what `**` on inexact values uses)."""
    return round_to(as_float(value), "f64")


# ---- rounding
def round_to(value, fmt: str) -> float:
    """A float value rounded to nearest even in one of FORMATS, as a Python float (exact)."""
    if not isinstance(value, Fraction):
        return float(value)  # ±0.0, ±inf, NaN
    bits, emin, emax = FORMATS[fmt]
    x = abs(value)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if x < Fraction(2) ** e:
        e -= 1  # now 2**e <= x < 2**(e + 1)
    if e > emax:
        return _sign(value) * math.inf
    quantum = Fraction(2) ** (max(e, emin) - bits + 1)
    rounded = round(x / quantum) * quantum  # round() of a Fraction is half to even
    if rounded >= Fraction(2) ** (emax + 1):
        return _sign(value) * math.inf
    return _sign(value) * float(rounded)


def largest(fmt: str) -> float:
    bits, _, emax = FORMATS[fmt]
    return float((2 - Fraction(1, 2 ** (bits - 1))) * Fraction(2) ** emax)


def show(value) -> str:
    """A value for a message: exactly for ints, to 9 significant digits for floats."""
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, Fraction):
        return repr(float(value))
    try:
        return f"{float(value):.9g}"
    except OverflowError:
        digits = len(str(abs(value.numerator))) - len(str(value.denominator))
        return f"about 1e{digits}"
