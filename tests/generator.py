"""Random .fz programs for the differential tests: what users write.

`generate(seed)` returns a `Program`, the same one for the same seed: stages
(one result or several, `let` locals, stages calling stages) and a pipeline
(arrays of rank 1-3 with named and literal dims, `1` for broadcasting, scalars
of every type, `inout` arrays, outputs; inline statements, stage calls and
multi-target assignments; dead, overwritten and scalar-only statements,
outputs read after they are assigned, `repeat` blocks with counts at the
edges), with every literal form, cast, operator, builtin and type.

Most programs are valid by construction: the generator types every expression
with the README's rules, written here independently of the checker, so that
the checker is tested against them. A fraction carry one deliberate mistake
and name the line its error belongs on (`Program.mistake`).

For the numeric comparison the generator tracks which values are *exact*: the
same bits on every backend (IEEE + - * / sqrt, casts, integer and bool
arithmetic, all in the same order). A math-library function (`exp`, `pow`,
`erf`...) is not: NumPy and the C library differ in the last bits. Operations
that are discontinuous (comparisons, float -> int or bool casts, floor/ceil/
round/trunc, float `%`, isnan/isinf) only ever take exact operands, so every
integer and bool is exact. Each math call, and each rounding of an inexact
value to a narrower float type, is a *site*; `Program.tolerance` bounds each
output's distance from the reference in ulps by summing its sites' error
budgets, and `Program.shadow(site)` renders the program with one site
perturbed by its budget, so that a test can tell an ill-conditioned element
(one the budget's perturbation moves by more than the tolerance) from a
wrong one.

Only the standard library and NumPy (for arguments); deterministic per seed.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

# ---------------------------------------------------------------------------
# Types and the README's rules ("Promotion", "Weak literals", "Assignment")


@dataclass(frozen=True)
class TypeInfo:
    name: str
    kind: str  # bool | int | uint | float
    bits: int
    mant: int = 0  # a float type: explicit mantissa bits, exponent range
    emin: int = 0
    emax: int = 0


TYPES = {t.name: t for t in (
    TypeInfo("bool", "bool", 8),
    *(TypeInfo(f"i{b}", "int", b) for b in (8, 16, 32, 64)),
    *(TypeInfo(f"u{b}", "uint", b) for b in (8, 16, 32, 64)),
    TypeInfo("f16", "float", 16, 10, -14, 15),
    TypeInfo("bf16", "float", 16, 7, -126, 127),
    TypeInfo("f32", "float", 32, 23, -126, 127),
    TypeInfo("f64", "float", 64, 52, -1022, 1023),
)}
FLOATS = ("f16", "bf16", "f32", "f64")
INTS = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
NUMERIC = INTS + FLOATS
ALL_TYPES = ("bool",) + NUMERIC


def is_float(t: str) -> bool:
    return TYPES[t].kind == "float"


def is_int(t: str) -> bool:
    return TYPES[t].kind in ("int", "uint")


def compute(t: str) -> str:
    """f16 and bf16 compute in f32."""
    return "f32" if t in ("f16", "bf16") else t


def int_range(t: str) -> tuple[int, int]:
    bits = TYPES[t].bits
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if TYPES[t].kind == "int" else (0, (1 << bits) - 1)


def promote(a: str, b: str) -> str | None:
    """The common type of two strong operands (README "Promotion"), None if there is none."""
    ta, tb = TYPES[a], TYPES[b]
    if a == b or tb.kind == "bool":
        return a
    if ta.kind == "bool":
        return b
    if ta.kind == "float" and tb.kind == "float":
        return "f32" if {a, b} == {"f16", "bf16"} else (a if ta.bits > tb.bits else b)
    if ta.kind == "float" or tb.kind == "float":
        return a if ta.kind == "float" else b
    if ta.kind == tb.kind:
        return a if ta.bits > tb.bits else b
    signed, unsigned = (ta, tb) if ta.kind == "int" else (tb, ta)
    if signed.bits > unsigned.bits:
        return signed.name
    return f"i{unsigned.bits * 2}" if unsigned.bits < 64 else None


def can_convert(src: str, dst: str) -> bool:
    """Implicit conversion on a store or a stage argument: bool -> int -> float, narrowing within a kind."""
    order = {"bool": 0, "int": 1, "uint": 1, "float": 2}
    if dst == "bool":
        return src == "bool"
    return order[TYPES[src].kind] <= order[TYPES[dst].kind]


def default_type(kind: str) -> str:
    """The type of a value made of literals alone."""
    return "f32" if kind == "float" else "i32"


def round_to(value, t: str) -> float:
    """`value` (an int or float, taken exactly) rounded to nearest even in float type `t`."""
    if isinstance(value, float) and not math.isfinite(value):
        return value
    info = TYPES[t]
    x = Fraction(value)
    if x == 0:
        return math.copysign(0.0, value) if isinstance(value, float) else 0.0
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    scale = Fraction(2) ** (max(e, info.emin) - info.mant)  # the ulp at x (subnormals: at emin)
    rounded = round(x / scale) * scale  # Fraction rounds half to even
    if rounded > (2 - Fraction(2) ** -info.mant) * Fraction(2) ** info.emax:
        return sign * math.inf
    return sign * float(rounded)


def cast_value(value, src: str, dst: str):
    """A value of type `src` converted to `dst` (README "Casts"), as a Python number."""
    if dst == "bool":
        return bool(value != 0)
    value = int(value) if src == "bool" else value
    if is_int(dst):
        lo, hi = int_range(dst)
        if is_float(src):
            if math.isnan(value):
                return 0
            if math.isinf(value):
                return hi if value > 0 else lo
            return min(max(math.trunc(value), lo), hi)
        return (value - lo) % (hi - lo + 1) + lo
    return round_to(value, dst)


# ---------------------------------------------------------------------------
# Expressions: typed nodes, rendered with the grammar's precedence

LIBM_1 = ("sqrt rsqrt cbrt exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh "
          "sigmoid erf").split()
ROUNDING = ("floor", "ceil", "round", "trunc")
# Functions whose f32/f64 results are the same bits on every backend here
# (correctly rounded in IEEE, or the same formula in the sim and the reference).
EXACT_FUNCS = {"sqrt", "rsqrt", "abs", "min", "max", "clamp", *ROUNDING}
BUILTIN_NAMES = set(LIBM_1) | set(ROUNDING) | {"abs", "min", "max", "clamp", "atan2", "pow", "fma", "where",
                                                "isnan", "isinf"}
CONSTANTS = ("pi", "e", "inf", "nan", "true", "false")

# A math-library call's relative error budget, in units of its compute type's
# 2^-mant: NumPy's SIMD functions (SVML on AVX-512) are documented within
# 4 ulp and glibc's within 2 for these functions; two results within a and b
# ulp of the exact value are within a + b of each other, and a relative error
# of k * 2^-mant is at most 2k ulps. 6 * 2^-mant covers NumPy against glibc;
# over 100,000 inputs a function we measured at most 3 ulps apart.
LIBM_BUDGET = 6
# Rounding an inexact value to a narrower float type can land one ulp of that
# type away on another backend (the value before rounding differs slightly).
ROUND_BUDGET = 1

_PREC = {"?": 0, "||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4, "+": 5, "-": 5,
         "*": 6, "/": 6, "%": 6, "**": 8}
ARITH = ("+", "-", "*", "/", "%", "**")
COMPARE = ("<", "<=", ">", ">=", "==", "!=")


@dataclass(frozen=True, eq=False)
class Node:
    """One expression. `type` is None for a weak (literal-only) value, whose kind is `weak`."""

    kind: str  # lit const name un bin tern call cast stage round
    text: str  # literal text, name, operator, function, cast type, stage name
    args: tuple["Node", ...] = ()
    type: str | None = None
    weak: str | None = None
    shape: tuple = ()  # the space's dims it spans, right-aligned: True a dim, False a literal 1
    exact: bool = True
    site: bool = False  # a math call, or a rounding of an inexact value
    value: object = None  # a literal's value; a weak `let`'s bound node; a stage call's (stage, result)
    paren: bool = False

    @property
    def typed(self) -> str:
        return self.type or default_type(self.weak)


def broadcast(*shapes: tuple) -> tuple:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for pos in range(rank):
        dims = [s[pos - rank + len(s)] for s in shapes if pos - rank + len(s) >= 0]
        out.append(any(dims))
    return tuple(out)


def fits(shape: tuple, cap: tuple | None) -> bool:
    """A value of `shape` can be stored into (or computed within) `cap` by broadcasting."""
    if cap is None:
        return True
    if len(shape) > len(cap):
        return False
    return all(cap[len(cap) - len(shape) + i] or not d for i, d in enumerate(shape))


def weak_fits(node: Node, t: str) -> bool:
    """A weak value materialized in type `t`: its folded value must fit (README "Weak literals":
    only the value of a literal expression meets the type, `i8 + (200 - 100)` is fine)."""
    value = weak_value(node)
    if value is None:  # a named constant takes part (pi, e, inf, nan fit every float type), or x / 0.0
        return True
    return _literal_fits(value, t)  # integer literal arithmetic stays integer, then converts


def weak_value(node: Node):
    """The exact value of a weak (literal-only) expression, folded as the README says: integers in
    arbitrary precision with C's `/` and `%` (`x / 0 == 0`), floats as exact rationals, `**` with a
    non-integer exponent in f64. None where a named constant takes part or the value is not finite."""
    if node.kind == "name":
        return weak_value(node.value)
    if node.kind == "lit":
        return node.value if isinstance(node.value, int) else Fraction(node.value)
    if node.kind == "un":
        v = weak_value(node.args[0])
        return None if v is None else (-v if node.text == "-" else v)
    if node.kind != "bin":
        return None
    a, b = (weak_value(x) for x in node.args)
    if a is None or b is None:
        return None
    integer = isinstance(a, int) and isinstance(b, int)
    op = node.text
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            return 0 if integer else None
        if integer:  # C's truncation, in integers (a float quotient loses digits beyond 2^53)
            return abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
        return Fraction(a) / b
    if op == "%":
        if b == 0:
            return 0 if integer else None
        r = abs(a) % abs(b) if integer else Fraction(a) - b * int(Fraction(a) / b)
        return (r if a >= 0 else -r) if integer else r
    if op == "**":
        if integer:
            if b < 0:
                return 1 if a == 1 else (-1 if b % 2 else 1) if a == -1 else 0
            return a ** min(b, 1100) if abs(a) > 1 else a ** b  # 2 ** 1100 is beyond every type already
        if b == int(b) and abs(b) <= 1100 and (a != 0 or b >= 0):  # an integer exponent: exact
            return Fraction(a) ** int(b)
        try:
            v = math.pow(float(a), float(b))
        except (OverflowError, ValueError):
            return None
        return Fraction(v) if math.isfinite(v) else None
    return None


def _literal_fits(value, t: str) -> bool:
    """A literal value as an operand of type t (f16/bf16 compute in f32): an integer within t's range,
    a float that does not round to infinity (README "Literal range": f64 too, `1e308 * 10.0`)."""
    if t == "bool":
        return True
    if is_int(t):
        lo, hi = int_range(t)
        return isinstance(value, int) and lo <= value <= hi
    return math.isfinite(round_to(value, compute(t)))


class Typer:
    """The README's typing rules over Nodes; each maker returns None where the checker must reject."""

    def join(self, a: Node, b: Node) -> str | None:
        if a.type is None and b.type is None:
            return default_type("float" if "float" in (a.weak, b.weak) else "int")
        if a.type is None:
            a, b = b, a
        if b.type is None:
            if b.weak == "float" and not is_float(a.type):
                return "f32"
            return "i32" if a.type == "bool" else a.type
        return promote(a.type, b.type)

    def operand(self, v: Node, t: str) -> bool:
        """v converted to t as an operand (weak: materialized)."""
        if v.type is None:  # a number -> bool needs a cast, a literal one too (README "Assignment")
            return t != "bool" and not (v.weak == "float" and not is_float(t)) and weak_fits(v, t)
        return can_convert(v.type, t)

    def store(self, v: Node, t: str) -> Node | None:
        """v stored into type t (a statement's target, a stage argument or result); None if invalid.
        Rounding an inexact value to a narrower float is a site."""
        if not self.operand(v, t):
            return None
        if v.type is None and t in ("f16", "bf16"):  # a literal stored as f16/bf16 must not round to inf
            value = weak_value(v)
            if value is not None and not math.isfinite(round_to(value, t)):
                return None
        if v.type is not None and narrows(v, t):
            return Node("round", t, (v,), t, None, v.shape, False, True)
        return v

    def binary(self, op: str, a: Node, b: Node) -> Node | None:
        shape = broadcast(a.shape, b.shape)
        if op in ("&&", "||"):
            if a.type != "bool" or b.type != "bool":
                return None
            return Node("bin", op, (a, b), "bool", None, shape, a.exact and b.exact)
        if op in ARITH and a.type is None and b.type is None:
            weak = "float" if "float" in (a.weak, b.weak) else "int"
            node = Node("bin", op, (a, b), None, weak, shape)
            if op == "**" and weak == "int" and abs(weak_value(node) or 0).bit_length() > 64:
                return None  # a power no integer type holds: how far folding goes then is not the README's
            return node
        common = self.join(a, b)
        if common is None or (op in ARITH and common == "bool"):
            return None
        if not (self.operand(a, common) and self.operand(b, common)):
            return None
        if op in COMPARE:
            return Node("bin", op, (a, b), "bool", None, shape, a.exact and b.exact)
        libm = op == "**" and is_float(common)
        return Node("bin", op, (a, b), common, None, shape, a.exact and b.exact and not libm, libm)

    def unary(self, op: str, a: Node) -> Node | None:
        if a.type is None:
            return None if op == "!" else Node("un", op, (a,), None, a.weak, a.shape)
        if (op == "!") != (a.type == "bool"):
            return None
        return Node("un", op, (a,), a.type, None, a.shape, a.exact)

    def select(self, how: str, c: Node, a: Node, b: Node) -> Node | None:
        """`c ? a : b` (how "?") or `where(c, a, b)`."""
        if c.type != "bool":
            return None
        common = self.join(a, b)
        if common is None or not (self.operand(a, common) and self.operand(b, common)):
            return None
        kind, text = ("tern", "?") if how == "?" else ("call", "where")
        return Node(kind, text, (c, a, b), common, None, broadcast(c.shape, a.shape, b.shape),
                    a.exact and b.exact and c.exact)

    def builtin(self, name: str, args: tuple[Node, ...]) -> Node | None:
        """A literal argument takes the type of the others, wherever it stands (`max(0.0, h)` is f16)."""
        strong = [a for a in args if a.type is not None]
        common = strong[0].type if strong else default_type("float" if any(a.weak == "float" for a in args) else "int")
        for other in args:
            common = self.join(Node("lit", "", type=common), other)
            if common is None:
                return None
        float_rule = name in LIBM_1 or name in ("atan2", "pow", "fma")
        if float_rule and not is_float(common):
            common = "f32"
        elif common == "bool":
            return None
        if not all(self.operand(a, common) for a in args):
            return None
        shape = broadcast(*(a.shape for a in args))
        exact = all(a.exact for a in args)
        if name in ROUNDING and is_int(common):
            return Node("call", name, args, common, None, shape, exact)
        if name in ("isnan", "isinf"):
            return Node("call", name, args, "bool", None, shape, exact)
        libm = is_float(common) and name not in EXACT_FUNCS
        return Node("call", name, args, common, None, shape, exact and not libm, libm)

    def cast(self, t: str, a: Node) -> Node | None:
        if a.type is None:  # README "Literal range": a cast converts the exact value (`f16(70000.0)` is inf,
            # `i32(1e10)` saturates); only an integer literal must fit an integer type
            if a.weak == "int" and is_int(t) and not weak_fits(a, t):
                return None
            return Node("cast", t, (a,), t, None, a.shape, True)
        return Node("cast", t, (a,), t, None, a.shape, a.exact, narrows(a, t))

    def call(self, stage: "StageSpec", args: tuple[Node, ...], result: int) -> Node | None:
        stored = []
        for arg, (_, ptype, _) in zip(args, stage.params):
            value = self.store(arg, ptype)
            if value is None:
                return None
            stored.append(value)
        rtype = stage.results[result][1]
        return Node("stage", stage.name, tuple(stored), rtype, None, broadcast(*(a.shape for a in args)),
                    stage.result_exact[result], value=(stage, result))


def narrows(v: Node, t: str) -> bool:
    """Storing or casting inexact `v` to float type t rounds it (a site): t is narrower than v's
    compute type, and v is not already a value of t (a load, a parameter, a cast, a stage result)."""
    if v.exact or not is_float(t) or TYPES[t].mant >= TYPES[compute(v.type)].mant:
        return False
    return not _already(v, t)


def _already(v: Node, t: str) -> bool:
    if v.type != t:
        return False
    if v.kind == "name":  # a load or a parameter; a `let` holds its value unrounded
        return v.value is None or _already(v.value, t)
    return v.kind in ("cast", "stage", "round")


def render(node: Node, mode=None) -> str:
    return _render(node, mode)[0]


def _render(node: Node, mode) -> tuple[str, int]:
    """(text, precedence): 9 an atom, 8 `**`, 7 a unary, then the binary levels, 0 `? :`."""
    perturbed = mode is not None and mode.get(id(node)) is not None
    text, prec = _render_plain(node, mode, perturbed)
    if node.paren:
        return f"({text})", 9
    return text, prec


def _render_plain(node: Node, mode, perturbed: bool) -> tuple[str, int]:
    k = node.kind
    if k in ("lit", "const", "name"):
        return node.text, 9
    if k == "round":  # an implicit conversion: no text, unless perturbed
        inner = render(node.args[0], mode)
        return (_perturb(inner, node.args[0].type, mode[id(node)]), 9) if perturbed else _render(node.args[0], mode)
    if k == "un":
        operand, prec = _render(node.args[0], mode)
        return f"{node.text}{_wrap(operand, prec < 7)}", 7
    if k == "bin":
        level = _PREC[node.text]
        (left, lp), (right, rp) = _render(node.args[0], mode), _render(node.args[1], mode)
        if node.text == "**":  # atom ** unary, right-associative
            text = f"{_wrap(left, lp < 9)} ** {_wrap(right, rp < 7)}"
        else:
            text = f"{_wrap(left, lp < level)} {node.text} {_wrap(right, rp <= level)}"
        return (_perturb(f"({text})", node.type, mode[id(node)]), 9) if perturbed else (text, level)
    if k == "tern":
        (c, cp), then, other = _render(node.args[0], mode), render(node.args[1], mode), render(node.args[2], mode)
        return f"{_wrap(c, cp < 1)} ? {then} : {other}", 0
    args = ", ".join(render(a, mode) for a in node.args)
    if k == "cast" and perturbed:  # perturb the value before it is rounded to the cast's type
        return f"{node.text}({_perturb(render(node.args[0], mode), node.args[0].type, mode[id(node)])})", 9
    text = f"{node.text}({args})"
    return (_perturb(text, node.type, mode[id(node)]), 9) if perturbed else (text, 9)


def _perturb(text: str, t: str, factor: str) -> str:
    """`text` (of float type t) times `factor`, in t's compute precision (f16/bf16 lifted to f32)."""
    inner = text if compute(t) == t else f"f32({text})"
    return f"({inner} * {factor})"


def _wrap(text: str, needed: bool) -> str:
    return f"({text})" if needed else text


def walk(node: Node):
    yield node
    for a in node.args:
        yield from walk(a)


# ---------------------------------------------------------------------------
# Literals: every form, for a given type


def int_literal(rng: random.Random, t: str, value: int | None = None) -> Node:
    """A weak integer literal fitting t: decimal, hex, leading zeros, an edge of the range, negative."""
    lo, hi = int_range(t) if is_int(t) else (-(1 << 31), (1 << 31) - 1)
    if value is None:
        roll = rng.random()
        if roll < 0.55:
            value = rng.randint(max(lo, -9), min(hi, 9))
        elif roll < 0.75:
            value = rng.choice([lo, hi, lo + 1, hi - 1, 0, 1])
        else:
            value = rng.randint(max(lo, -1000), min(hi, 1000))
    magnitude = abs(value)
    form = rng.random()
    if form < 0.15:
        digits = f"0x{magnitude:x}" if rng.random() < 0.5 else f"0X{magnitude:X}"
    elif form < 0.25:
        digits = "0" * rng.randint(1, 2) + str(magnitude)
    else:
        digits = str(magnitude)
    lit = Node("lit", digits, type=None, weak="int", value=magnitude)
    return Node("un", "-", (lit,), None, "int") if value < 0 else lit


_FLOAT_TEXTS = ["0.5", ".5", "5.", "1.5", "2.0", "0.25", "3.0", "10.0", "1e3", "1E-3", "2.5e+2", "1.0e-7",
                "0.1", "0.7978845608", "0.044715", "1e-5", "100.0", "0.0"]
_FLOAT_EDGES = {"f16": ["65504.0", "6.1035156e-05", "5.9604645e-08", "0.00006", "70000.0"],
                "bf16": ["3.3895314e38", "1e-38", "9.2e-41"],
                "f32": ["3.4028234e38", "1.1754944e-38", "1e-45", "16777217.0", "3.4028235e38"],
                "f64": ["1.7976931348623157e308", "2.2250738585072014e-308", "5e-324", "1e300",
                        "9007199254740993.0"]}


def exact_value(text: str) -> Fraction | float:
    """A float literal's exact value, as the README folds it (`9007199254740993.0` is not the f64
    nearest it); a zero stays a float so that `-0.0` keeps its sign."""
    value = Fraction(text)
    return value if value else 0.0


def float_literal_of(value: float) -> Node:
    text = repr(abs(value))
    lit = Node("lit", text, type=None, weak="float", value=exact_value(text))
    return Node("un", "-", (lit,), None, "float") if value < 0 else lit


def float_literal(rng: random.Random, t: str) -> Node:
    """A weak float literal for type t: the common forms, exponents, the edges of t's range."""
    if rng.random() < 0.12:
        text = rng.choice(_FLOAT_EDGES.get(t, _FLOAT_EDGES["f32"]))
        if not _literal_fits(exact_value(text), t):
            text = "1.5"
    else:
        text = rng.choice(_FLOAT_TEXTS)
    lit = Node("lit", text, type=None, weak="float", value=exact_value(text))
    return Node("un", "-", (lit,), None, "float") if rng.random() < 0.2 else lit


# ---------------------------------------------------------------------------
# Scopes and the expression generator


@dataclass
class Var:
    name: str
    type: str | None  # None: a `let` bound to a weak value
    shape: tuple = ()
    exact: bool = True
    role: str = "temp"  # in inout out out_unassigned temp scalar count param let result
    weak: Node | None = None  # a `let` of a literal-only value: that value (it stays weak)
    bound: Node | None = None  # a `let`'s value (it is not rounded when bound)

    def node(self) -> Node:
        if self.weak is not None:
            return Node("name", self.name, type=None, weak=self.weak.weak, value=self.weak)
        return Node("name", self.name, type=self.type, shape=self.shape, exact=self.exact, value=self.bound)


@dataclass
class StageSpec:
    name: str
    params: list  # (name, type, must be exact)
    results: list  # (name, type)
    named: bool
    result_exact: list = field(default_factory=list)
    body: list = field(default_factory=list)  # ("let"|"set"|"return"|"multi", names, Node)


class ExprGen:
    """Random valid expressions over a scope, typed with `Typer`."""

    def __init__(self, rng: random.Random, scope: dict[str, Var], stages: list[StageSpec], banned: set[str],
                 cap: tuple | None, hidden: set[str] = frozenset()):
        """`hidden`: names declared but not readable yet (an output before it is assigned); they still
        shadow the constants of the same name."""
        self.rng, self.scope, self.stages, self.cap = rng, scope, stages, cap
        self.typer = Typer()
        taken = set(scope) | {s.name for s in stages} | banned | hidden
        self.funcs = [f for f in sorted(BUILTIN_NAMES) if f not in taken]
        self.consts = [c for c in CONSTANTS if c not in scope and c not in hidden]

    # ---- leaves
    def variables(self, exact: bool, pred=lambda v: True) -> list[Var]:
        return [v for v in self.scope.values()
                if v.role not in ("out_unassigned",) and fits(v.shape, self.cap) and (v.exact or not exact) and pred(v)]

    def leaf(self, hint: str, exact: bool) -> Node:
        """A variable (an array, mostly: what pipelines compute on), or a literal."""
        rng = self.rng
        arrays = self.variables(exact, lambda v: bool(v.shape))
        same = [v for v in arrays if v.type == hint] or self.variables(exact, lambda v: v.type == hint)
        others = self.variables(exact)
        roll = rng.random()
        if same and roll < 0.5:
            return rng.choice(same).node()
        if arrays and roll < 0.7:
            return rng.choice(arrays).node()
        if others and roll < 0.84:
            return rng.choice(others).node()
        return self.literal(hint)

    def literal(self, hint: str) -> Node:
        rng = self.rng
        if hint == "bool":
            if "true" in self.consts and "false" in self.consts:
                return Node("const", rng.choice(["true", "false"]), type="bool")
            return Node("cast", "bool", (int_literal(rng, "i32", rng.randint(0, 2)),), "bool")
        if is_float(hint):
            named = [c for c in self.consts if c in ("pi", "e", "inf", "nan")]
            if named and rng.random() < 0.08:
                return Node("const", rng.choice(named), type=None, weak="float", value=0.0)
            return float_literal(rng, hint) if rng.random() < 0.8 else int_literal(rng, "i8")
        return int_literal(rng, hint)

    # ---- compound expressions
    def gen(self, hint: str, depth: int, exact: bool = False) -> Node:
        for _ in range(10):
            node = self._attempt(hint, depth, exact)
            if node is not None and fits(node.shape, self.cap) and (node.exact or not exact):
                if self.rng.random() < 0.05:
                    node = replace(node, paren=True)
                return node
        return self.leaf(hint, exact)

    def _attempt(self, hint: str, depth: int, exact: bool) -> Node | None:
        if depth <= 0:
            return self.leaf(hint, exact)
        kind = TYPES[hint].kind
        options = {"leaf": 2, "arith": 4, "unary": 1, "select": 1, "cast": 1.2, "minmax": 1, "stage": 1}
        if kind == "float":
            options.update(libm=0 if exact else 3, libm2=0 if exact else 1, rounding=0.6, mixed=1.2)
        elif kind == "bool":
            options = {"leaf": 1.5, "compare": 4, "logic": 2, "unary": 1, "select": 0.6, "cast": 1,
                       "classify": 0.7, "stage": 0.7}
        else:
            options.update(rounding=0.3, mixed=1)
        choice = self.rng.choices(list(options), weights=list(options.values()))[0]
        return getattr(self, "_" + choice)(hint, depth - 1, exact)

    def _leaf(self, hint, depth, exact):
        return self.leaf(hint, exact)

    def _arith(self, hint, depth, exact):
        op = self.rng.choice(ARITH if hint != "bool" else ("+",))
        if op == "**" and self.rng.random() < 0.5:  # small integer exponents, as users write them
            exponent = int_literal(self.rng, "i8", self.rng.randint(0, 3))
            return self.typer.binary(op, self.gen(hint, depth, exact), exponent)
        if op == "%":
            exact = True  # a float % is discontinuous in its operands
        left, right = self.gen(hint, depth, exact), self.gen(hint, depth, exact)
        if op == "**":
            left = self.in_domain("pow", left, right)
        return self.typer.binary(op, left, right)

    def _mixed(self, hint, depth, exact):
        """An operand of another type, so that promotion is exercised."""
        other = self.rng.choice(ALL_TYPES)
        op = self.rng.choice(("+", "-", "*", "/"))
        pair = [self.gen(hint, depth, exact), self.gen(other, depth, exact)]
        self.rng.shuffle(pair)
        return self.typer.binary(op, *pair)

    def _unary(self, hint, depth, exact):
        op = "!" if hint == "bool" else self.rng.choice(("-", "-", "+"))
        return self.typer.unary(op, self.gen(hint, depth, exact))

    def _select(self, hint, depth, exact):
        cond = self.gen("bool", depth, True)
        a, b = self.gen(hint, depth, exact), self.gen(hint, depth, exact)
        if "where" in self.funcs and self.rng.random() < 0.5:
            return self.typer.select("where", cond, a, b)
        return self.typer.select("?", cond, a, b)

    def _cast(self, hint, depth, exact):
        source = self.rng.choice(ALL_TYPES)
        discontinuous = hint == "bool" or (is_int(hint) and is_float(source))
        return self.typer.cast(hint, self.gen(source, depth, exact or discontinuous))

    def _minmax(self, hint, depth, exact):
        names = [f for f in ("min", "max", "clamp", "abs") if f in self.funcs]
        if not names or hint == "bool":
            return None
        name = self.rng.choice(names)
        arity = {"min": 2, "max": 2, "clamp": 3, "abs": 1}[name]
        return self.typer.builtin(name, tuple(self.gen(hint, depth, exact) for _ in range(arity)))

    def _libm(self, hint, depth, exact):
        names = [f for f in LIBM_1 if f in self.funcs]
        if not names:
            return None
        name = self.rng.choice(names)
        return self.typer.builtin(name, (self.in_domain(name, self.gen(hint, depth, exact)),))

    def _libm2(self, hint, depth, exact):
        names = [f for f in ("atan2", "pow", "fma") if f in self.funcs]
        if not names:
            return None
        name = self.rng.choice(names)
        args = [self.gen(hint, depth, exact) for _ in range(3 if name == "fma" else 2)]
        if name == "pow":
            args[0] = self.in_domain("pow", args[0], args[1])
        return self.typer.builtin(name, tuple(args))

    def in_domain(self, func: str, arg: Node | None, exponent: Node | None = None) -> Node | None:
        """`arg` kept where `func` is defined and finite, as users do (`sqrt(abs(x))`, `acos(clamp(c,
        -1.0, 1.0))`, `exp(tanh(x) * 4.0)`): a NaN or inf would hide the rest of the arithmetic. Always
        where the edge of the domain is a discontinuity that an inexact value could cross on one backend
        and not on the other (a negative base's power is defined at integer exponents only); else most
        of the time."""
        if arg is None:
            return arg
        crossing = not arg.exact if exponent is None else exponent is not None and not exponent.exact
        if not crossing and self.rng.random() < 0.25:
            return arg
        guarded = None
        if func in ("sqrt", "rsqrt", "log", "log2", "log10", "log1p", "pow", "cbrt") and "abs" in self.funcs:
            guarded = self.typer.builtin("abs", (arg,))
        elif func in ("asin", "acos") and "clamp" in self.funcs:
            guarded = self.typer.builtin("clamp", (arg, float_literal_of(-1.0), float_literal_of(1.0)))
        elif func in ("exp", "exp2", "expm1", "sinh", "cosh", "tan") and "tanh" in self.funcs:
            scaled = self.typer.builtin("tanh", (arg,))
            guarded = scaled and self.typer.binary("*", scaled, float_literal_of(4.0))
        return guarded or arg

    def _rounding(self, hint, depth, exact):
        names = [f for f in ROUNDING if f in self.funcs]
        if not names:
            return None
        return self.typer.builtin(self.rng.choice(names), (self.gen(hint, depth, True),))

    def _compare(self, hint, depth, exact):
        left = self.rng.choice(NUMERIC + ("bool",))
        right = left if self.rng.random() < 0.6 else self.rng.choice(NUMERIC)
        return self.typer.binary(self.rng.choice(COMPARE), self.gen(left, depth, True), self.gen(right, depth, True))

    def _logic(self, hint, depth, exact):
        return self.typer.binary(self.rng.choice(("&&", "||")), self.gen("bool", depth, True),
                                 self.gen("bool", depth, True))

    def _classify(self, hint, depth, exact):
        names = [f for f in ("isnan", "isinf") if f in self.funcs]
        if not names:
            return None
        return self.typer.builtin(self.rng.choice(names), (self.gen(self.rng.choice(NUMERIC), depth, True),))

    def _stage(self, hint, depth, exact):
        singles = [s for s in self.stages if len(s.results) == 1 and (s.result_exact[0] or not exact)]
        if not singles:
            return None
        preferred = [s for s in singles if s.results[0][1] == hint]
        stage = self.rng.choice(preferred if preferred and self.rng.random() < 0.7 else singles)
        return self.typer.call(stage, self.stage_args(stage, depth), 0)

    def stage_args(self, stage: StageSpec, depth: int) -> tuple[Node, ...]:
        return tuple(self.gen(ptype, depth, must_exact) for _, ptype, must_exact in stage.params)

    def coerce(self, value: Node, t: str, depth: int) -> Node:
        """`value` made storable into t: an explicit cast where no implicit conversion exists."""
        stored = self.typer.store(value, t)
        if stored is not None:
            return stored
        discontinuous = t == "bool" or (is_int(t) and (value.weak == "float" or (value.type and is_float(value.type))))
        if discontinuous and not value.exact:
            value = self.gen(t, depth, True)
            return self.coerce(value, t, depth) if value.exact else self.literal(t)
        cast = self.typer.cast(t, value)
        return self.typer.store(cast, t) if cast is not None else self.literal(t)


# ---------------------------------------------------------------------------
# Names: short ones, and the awkward ones users may pick (C and CUDA words,
# the builtins' names, the type names)

PLAIN_NAMES = "a b c d g h k p q r s t u v w x y z acc tmp val out2 grad m1 m2 beta lr eps scale bias".split()
AWKWARD_NAMES = ("int float double char long short unsigned signed void auto register static const volatile "
                 "struct union switch case default do while for goto sizeof new delete class this template "
                 "threadIdx blockIdx blockDim gridDim i n half __half float4 fz_div expf sqrtf fminf NULL main "
                 "std inf2 exp2f isnan sigmoid exp min f32 u8 pi e").split()
DIM_NAMES = "n m rows cols k batch len width int i n2 threadIdx".split()


class Names:
    """Fresh identifiers, unique within one program (the namespaces are kept apart by construction)."""

    def __init__(self, rng: random.Random, awkward: float):
        self.rng, self.awkward, self.used = rng, awkward, set()

    def fresh(self, stem: str | None = None) -> str:
        for _ in range(50):
            if stem is not None:
                name = f"{stem}{self.rng.randint(0, 99)}"
            elif self.rng.random() < self.awkward:
                name = self.rng.choice(AWKWARD_NAMES)
            else:
                name = self.rng.choice(PLAIN_NAMES) + (str(self.rng.randint(0, 9)) if self.rng.random() < 0.5 else "")
            if name not in self.used:
                self.used.add(name)
                return name
        return self.fresh(stem="v")


def random_type(rng: random.Random, floats: float = 0.5) -> str:
    """Every type; floats (what most pipelines hold) more often."""
    return rng.choice(FLOATS) if rng.random() < floats else rng.choice(ALL_TYPES)


# ---------------------------------------------------------------------------
# Stages


def build_stage(rng: random.Random, names: Names, name: str, earlier: list[StageSpec], banned: set[str]) -> StageSpec:
    params = [(names.fresh(), random_type(rng), rng.random() < 0.5) for _ in range(rng.randint(1, 4))]
    named = rng.random() < 0.45
    results = [(names.fresh(), random_type(rng)) for _ in range(rng.randint(1, 3) if named else 1)]
    stage = StageSpec(name, params, results, named)
    scope = {p: Var(p, t, (), exact, "param") for p, t, exact in params}
    gen = ExprGen(rng, scope, earlier, banned | {r for r, _ in results}, cap=None)
    for _ in range(rng.choices((0, 1, 2, 3), (3, 4, 2, 1))[0]):
        value = gen.gen(random_type(rng), rng.randint(1, 3))
        let = names.fresh()
        scope[let] = Var(let, value.type, (), value.exact, "let", weak=value if value.type is None else None,
                         bound=value)
        stage.body.append(("let", [let], value))
    pending = [r for r in results]
    rng.shuffle(pending)
    exact = {}
    while pending:
        multi = [s for s in earlier if 1 < len(s.results) <= len(pending)]
        if named and multi and rng.random() < 0.25:
            callee = rng.choice(multi)
            call = gen.typer.call(callee, gen.stage_args(callee, 2), 0)
            targets = pending[:len(callee.results)]
            stored = [] if call is None else [
                gen.typer.store(replace(call, type=rt, exact=callee.result_exact[k], value=(callee, k)), t)
                for k, ((_, rt), (_, t)) in enumerate(zip(callee.results, targets))]
            if call is not None and all(v is not None and v.kind != "round" for v in stored):
                stage.body.append(("multi", [r for r, _ in targets], call))
                for k, ((r, t), (_, rt)) in enumerate(zip(targets, callee.results)):
                    exact[r] = callee.result_exact[k]
                    scope[r] = Var(r, rt, (), exact[r], "result")
                pending = pending[len(targets):]
                continue
        r, t = pending.pop()
        value = gen.coerce(gen.gen(t, rng.randint(1, 3)), t, 2)
        exact[r] = value.exact
        stage.body.append(("set" if named else "return", [r], value))
        if named:  # a result is readable once assigned: its value, before it is converted
            raw = value.args[0] if value.kind == "round" else value
            scope[r] = Var(r, raw.type, (), raw.exact, "result", weak=raw if raw.type is None else None, bound=raw)
    stage.result_exact = [exact[r] for r, _ in results]
    return stage


def stage_lines(stage: StageSpec, mode=None) -> list[str]:
    def decl(items):
        return ", ".join(f"{n}: {t}" for n, t, *_ in items)
    result = f"({decl(stage.results)})" if stage.named else stage.results[0][1]
    body = []
    for what, targets, value in stage.body:
        if what == "raw":  # a line of text (a deliberate mistake)
            body.append(value)
            continue
        text = render(value, mode)
        body.append(f"let {targets[0]} = {text};" if what == "let" else f"return {text};" if what == "return"
                    else f"{', '.join(targets)} = {text};")
    head = f"stage {stage.name}({decl(stage.params)}) -> {result} {{"
    if len(body) == 1 and len(head) + len(body[0]) < 100:
        return [f"{head} {body[0]} }}"]
    return [head] + ["    " + line for line in body] + ["}"]


# ---------------------------------------------------------------------------
# Pipelines


@dataclass
class Dim:
    text: str  # as written: a name, or a literal in some form ("10", "010", "0xa")
    size: int | None  # a literal's value


@dataclass
class Stmt:
    targets: list[str]
    value: Node  # the stored value (single target) or the stage call (several)
    temp_type: str | None = None  # a single new or overwritten temp of f16/bf16: its type
    multi: StageSpec | None = None


@dataclass
class Block:
    count_text: str
    count: int | str  # a literal, or a count parameter's name
    body: list


@dataclass
class ParamDecl:
    name: str
    type: str
    dims: list[Dim] | None
    role: str  # in inout scalar count out
    shape: tuple = ()


class PipelineBuilder:
    """One random pipeline: its signature, then its statements, typed as they are made."""

    def __init__(self, rng: random.Random, names: Names, stages: list[StageSpec], banned: set[str], nested: bool):
        self.rng, self.names, self.stages, self.banned, self.nested = rng, names, stages, banned, nested
        self.scope: dict[str, Var] = {}
        self.features: set[str] = set()
        self.constants: dict[str, object] = {}
        self.constant_outputs: list[ParamDecl] = []
        self.aliases: dict[str, str] = {}  # a dim name -> the name of the dim it stands for
        self.last_carried: list[str] = []  # what the last top-level loop carried
        self.unassigned_reads: list = []
        self.assigned_outside: set[str] = set()
        # Outputs assigned only inside a loop so far, with its count: reading one after the loop reads
        # nothing when the count is 0. The checker accepts it; issue 10 asks for a located error or an
        # ArgumentError at call time instead, which the tests expect (`Program.reads_unassigned`).
        self.repeat_only: dict[str, int | str] = {}
        # Outputs assigned so far only inside loops that may run 0 times (a count of 0 or a parameter),
        # or inside a loop within one. The README names the loop a read after it needs; where a later
        # loop assigned such an output too, which one that is would be the checker's choice, not the
        # README's: so no later loop assigns or reads it, until a statement outside loops assigns it.
        self.loop_only: set[str] = set()
        self.skipping: list[bool] = []  # for each enclosing loop: whether it may run 0 times
        self.allow_unassigned_read = rng.random() < 0.04

    # ---- the signature
    def signature(self) -> None:
        rng = self.rng
        rank = rng.choice((1, 1, 2, 2, 3))
        self.space = []
        for _ in range(rank):
            if rng.random() < 0.25:
                size = rng.choice((2, 3, 4, 5, 8, 10, 16, 17))
                self.space.append(Dim(str(size), size))
            else:
                self.space.append(Dim(self.names.fresh() if rng.random() < 0.1 else rng.choice(
                    [d for d in DIM_NAMES if d not in {x.text for x in self.space}]), None))
        self.params: list[ParamDecl] = []
        for _ in range(rng.randint(1, 4)):
            self.params.append(self._array(rng.choice(("in", "in", "in", "inout"))))
        if not any(len(p.shape) == rank and all(p.shape) for p in self.params) and rng.random() < 0.8:
            self.params.insert(rng.randint(0, len(self.params)), self._array("in", full=True))
        for _ in range(rng.choices((0, 1, 2, 3), (2, 3, 2, 1))[0]):
            self.params.insert(rng.randint(0, len(self.params)), ParamDecl(self.names.fresh(), random_type(rng, 0.3),
                                                                           None, "scalar"))
        if rng.random() < 0.35:
            self.params.insert(rng.randint(0, len(self.params)),
                               ParamDecl(self.names.fresh(), rng.choice(INTS), None, "count"))
        bound = {d.text for p in self.params if p.dims for d in p.dims if d.size is None}
        self.outputs: list[ParamDecl] = []
        inouts = any(p.role == "inout" for p in self.params)
        for _ in range(rng.choices((0, 1, 2, 3), (1 if inouts else 0, 4, 3, 1))[0]):
            for _ in range(10):
                out = self._array("out")
                if all(d.size is not None or d.text in bound for d in out.dims):
                    self.outputs.append(out)
                    break
        for p in self.params:
            self.scope[p.name] = Var(p.name, p.type, p.shape, True, p.role)
        for o in self.outputs:
            self.scope[o.name] = Var(o.name, o.type, o.shape, True, "out_unassigned")
        if any(p.role == "inout" for p in self.params):
            self.features.add("inout")

    def _array(self, role: str, full: bool = False) -> ParamDecl:
        rng = self.rng
        rank = len(self.space) if full else rng.randint(1, len(self.space))
        dims, shape = [], []
        for dim in self.space[len(self.space) - rank:]:
            if not full and rng.random() < 0.2:
                dims.append(Dim(rng.choice(("1", "1", "01", "0x1")), 1))
                shape.append(False)
            else:
                text = dim.text
                if dim.size is not None and rng.random() < 0.4:
                    text = rng.choice((f"0{dim.size}", f"0x{dim.size:x}", f"0X{dim.size:X}"))
                elif dim.size is None and role != "out" and rng.random() < 0.06:
                    # another name for the same dim: the checker must equate them where they meet,
                    # the call must give them one size
                    text = next(f"{dim.text}_{k}" for k in range(9) if f"{dim.text}_{k}" not in self.aliases)
                    self.aliases[text] = dim.text
                dims.append(Dim(text, dim.size))
                shape.append(True)
        return ParamDecl(self.names.fresh(), random_type(rng), dims, role, tuple(shape))

    # ---- statements
    def body(self) -> list:
        rng = self.rng
        stmts = self._block(rng.randint(2, 7), depth=0, carried=None)
        for out in self.outputs:
            if out.name not in self.assigned_outside:
                stmts.append(self._assign_declared(out))
                self._note_reads(stmts[-1])
        for out in self.constant_outputs:
            self.outputs.insert(rng.randint(0, len(self.outputs)), out)
        return stmts

    def _gen(self, cap) -> ExprGen:
        return ExprGen(self.rng, self.readable(), self.stages, self.banned, cap, hidden=set(self.scope))

    def readable(self) -> dict[str, Var]:
        hidden = set(self.repeat_only) | self.loop_only if self.in_loop else set()
        return {n: v for n, v in self.scope.items() if v.role != "out_unassigned" and n not in hidden}

    in_loop = False

    def _block(self, count: int, depth: int, carried: set[str] | None) -> list:
        rng = self.rng
        stmts = []
        self.in_loop = carried is not None
        nested = 3 if self.nested and depth == 1 else 0
        kinds = {"temp": 3, "overwrite": 1.5, "scalar": 0.8, "output": 2.5, "inout": 1.5, "stage": 2.5,
                 "multi": 1.2, "repeat": 1.2 if depth == 0 else nested, "literal": 0.5 if depth == 0 else 0,
                 "comment": 0.3}
        for _ in range(count):
            kind = rng.choices(list(kinds), list(kinds.values()))[0]
            made = getattr(self, "_s_" + kind)(depth, carried)
            self.in_loop = carried is not None
            if made is not None:
                stmts.append(made)
                if isinstance(made, Stmt) and carried is None:
                    self._note_reads(made)
        return stmts

    def _note_reads(self, stmt: Stmt) -> None:
        """A read of an output that only a loop has assigned (see `repeat_only`)."""
        read = {n.text for n in walk(stmt.value) if n.kind == "name"} & set(self.repeat_only)
        self.unassigned_reads += [self.repeat_only[name] for name in sorted(read)]
        for name in stmt.targets:
            self.repeat_only.pop(name, None)
            self.loop_only.discard(name)

    def _s_comment(self, depth, carried):
        return f"{self.rng.choice(('#', '//'))} {self.rng.choice(('note', 'TODO: tune', 'dead code below?', ''))}"

    def _writable(self, name: str, carried: set[str] | None) -> bool:
        return carried is None or name in carried

    def _bind_temp(self, name: str, value: Node) -> Stmt:
        t = value.typed
        if name in self.scope:
            self.features.add("overwrite")
        self.scope[name] = Var(name, t, value.shape, value.exact, "temp")
        return Stmt([name], value, temp_type=t if t in ("f16", "bf16") else None)

    def _s_temp(self, depth, carried):
        gen = self._gen(tuple(True for _ in self.space))
        value = gen.gen(random_type(self.rng), self.rng.randint(1, 4))
        if value.type is None and not weak_fits(value, default_type(value.weak)):
            return None
        value = gen.typer.store(value, value.typed)
        return self._bind_temp(self.names.fresh(), value)

    def _s_scalar(self, depth, carried):
        gen = self._gen(())
        value = gen.gen(random_type(self.rng), self.rng.randint(1, 3))
        if value.type is None and not weak_fits(value, default_type(value.weak)):
            return None
        self.features.add("scalar_only")
        return self._bind_temp(self.names.fresh(), gen.typer.store(value, value.typed))

    def _s_overwrite(self, depth, carried):
        temps = [v for v in self.scope.values() if v.role == "temp" and self._writable(v.name, carried)]
        if not temps:
            return None
        var = self.rng.choice(temps)
        if carried is None:  # a temp may change its type and shape when it is assigned again
            gen = self._gen(tuple(True for _ in self.space))
            value = gen.gen(random_type(self.rng), self.rng.randint(1, 3))
            if value.type is None and not weak_fits(value, default_type(value.weak)):
                return None
            return self._bind_temp(var.name, gen.typer.store(value, value.typed))
        value = self._update(var, carried)  # around a loop it keeps both
        if value is None or value.typed != var.type or value.shape != var.shape:
            return None
        return self._bind_temp(var.name, value)

    def _update(self, var: Var, carried) -> Node | None:
        """`v = v op expr`: an accumulator, with the shape and type of v."""
        gen = self._gen(var.shape)
        keep_exact = var.exact
        if var.type == "bool":
            value = gen.typer.binary(self.rng.choice(("&&", "||")), var.node(), gen.gen("bool", 2, True))
        else:
            op = self.rng.choice(("+", "-", "*", "+") if not is_float(var.type) else ("+", "-", "*", "/"))
            other = gen.gen(var.type, self.rng.randint(1, 3), keep_exact)
            value = gen.typer.binary(op, var.node(), other)
            if value is not None and value.typed != var.type:
                value = gen.typer.cast(var.type, value) if (value.exact or is_float(var.type)) else None
        if value is None or (keep_exact and not value.exact):
            return None
        return gen.typer.store(value, var.type)

    def _assign_declared(self, decl: ParamDecl, carried=None) -> Stmt:
        gen = self._gen(decl.shape)
        exact = self._must_stay_exact(decl.name, carried)
        value = gen.coerce(gen.gen(decl.type, self.rng.randint(1, 4), exact), decl.type, 2)
        if exact and not value.exact:
            value = gen.literal(decl.type)
        self._mark_assigned(decl, value, carried)
        return Stmt([decl.name], value)

    def _must_stay_exact(self, name: str, carried) -> bool:
        """Inside a loop a carried value keeps the exactness it had before the loop (see `_s_repeat`)."""
        return carried is not None and self.scope[name].exact

    def _mark_assigned(self, decl: ParamDecl, value: Node, carried) -> None:
        var = self.scope[decl.name]
        was_unassigned = var.role == "out_unassigned"
        exact = var.exact if carried is not None and not was_unassigned else value.exact
        self.scope[decl.name] = Var(decl.name, decl.type, decl.shape, exact and value.exact,
                                    "out" if decl.role == "out" else decl.role)
        if carried is None:
            self.assigned_outside.add(decl.name)

    def _s_output(self, depth, carried):
        outs = [o for o in self.outputs if self._writable(o.name, carried)]
        if not outs:
            return None
        out = self.rng.choice(outs)
        if carried is not None and self.scope[out.name].role == "out" and self.rng.random() < 0.7:
            return self._assign_update(out, carried)  # in a loop, mostly an accumulator: `y = y * 0.5 + x`
        return self._assign_declared(out, carried)

    def _assign_update(self, decl: ParamDecl, carried) -> Stmt | None:
        value = self._update(self.scope[decl.name], carried)
        if value is None:
            return self._assign_declared(decl, carried)
        self._mark_assigned(decl, value, carried)
        return Stmt([decl.name], value)

    def _s_inout(self, depth, carried):
        inouts = [p for p in self.params if p.role == "inout" and self._writable(p.name, carried)]
        if not inouts:
            return None
        decl = self.rng.choice(inouts)
        if self.rng.random() < (0.8 if carried is not None else 0.5):
            return self._assign_update(decl, carried)
        return self._assign_declared(decl, carried)

    def _s_stage(self, depth, carried):
        singles = [s for s in self.stages if len(s.results) == 1]
        if not singles:
            return None
        stage = self.rng.choice(singles)
        gen = self._gen(tuple(True for _ in self.space))
        declared = [d for d in self.outputs + [p for p in self.params if p.role == "inout"]
                    if self._writable(d.name, carried) and self.scope[d.name].role in ("out", "out_unassigned", "inout")]
        target = self.rng.choice(declared) if declared and self.rng.random() < 0.4 else None
        if target is not None:
            gen = self._gen(target.shape)
        call = gen.typer.call(stage, gen.stage_args(stage, 2), 0)
        if call is None:
            return None
        self.features.add("stage_call")
        if target is None:
            if carried is not None:
                return None
            return self._bind_temp(self.names.fresh(), call)
        if self._must_stay_exact(target.name, carried) and not call.exact:
            return None
        value = gen.coerce(call, target.type, 2)
        self._mark_assigned(target, value, carried)
        return Stmt([target.name], value)

    def _s_multi(self, depth, carried):
        multis = [s for s in self.stages if len(s.results) > 1]
        if not multis or carried is not None:
            return None
        stage = self.rng.choice(multis)
        gen = self._gen(tuple(True for _ in self.space))
        call = gen.typer.call(stage, gen.stage_args(stage, 2), 0)
        if call is None:
            return None
        targets, decls = [], []
        for k, (_, rtype) in enumerate(stage.results):
            result = replace(call, type=rtype, exact=stage.result_exact[k])
            fitting = [d for d in self.outputs + [p for p in self.params if p.role == "inout"]
                       if d.name not in targets and fits(call.shape, d.shape) and (not decls or d.shape == decls[0].shape)
                       and (s := gen.typer.store(result, d.type)) is not None and s.kind != "round"]
            if fitting and self.rng.random() < 0.35:
                decl = self.rng.choice(fitting)
                targets.append(decl.name)
                decls.append(decl)
            else:
                targets.append(self.names.fresh())
        shape = decls[0].shape if decls else call.shape
        for k, name in enumerate(targets):
            result = replace(call, type=stage.results[k][1], exact=stage.result_exact[k], shape=shape)
            decl = next((d for d in decls if d.name == name), None)
            if decl is None:
                self.scope[name] = Var(name, result.type, shape, result.exact, "temp")
            else:
                self._mark_assigned(decl, result, carried)
        self.features.add("multi_target")
        return Stmt(targets, call, multi=stage)

    def _s_literal(self, depth, carried):
        """An output assigned a cast of a literal: its value is known exactly (`constant_chain`)."""
        chain = constant_chain(self.rng, self.stages)
        if chain is None:
            return None
        node, value, vtype = chain
        t = random_type(self.rng)
        if Typer().store(node, t) is None:
            t = vtype or default_type(node.weak)
            if Typer().store(node, t) is None:
                return None
        dims = [Dim(d.text, d.size) for d in self.space[len(self.space) - self.rng.randint(1, len(self.space)):]]
        bound = {d.text for p in self.params if p.dims for d in p.dims if d.size is None}
        if any(d.size is None and d.text not in bound for d in dims):
            return None
        name = self.names.fresh()
        while name in CONSTANTS:  # declared ahead of statements that may have read the constant
            name = self.names.fresh()
        decl = ParamDecl(name, t, dims, "out", tuple(True for _ in dims))
        self.constant_outputs.append(decl)  # declared at the end, so that no later statement writes it
        self.scope[decl.name] = Var(decl.name, t, decl.shape, True, "out")
        self.assigned_outside.add(decl.name)
        self.constants[decl.name] = store_constant(node, value, vtype, t)
        self.features.add("literal_output")
        return Stmt([decl.name], node)

    def _s_repeat(self, depth, carried):
        rng = self.rng
        counts = [p for p in self.params if p.role == "count"]
        if counts and rng.random() < 0.5:
            count = rng.choice(counts).name
            text = count
        else:
            count = rng.choice((0, 1, 2, 2, 3))
            text = rng.choice((str(count), f"0{count}", f"0x{count:x}")) if rng.random() < 0.3 else str(count)
        candidates = [v.name for v in self.scope.values() if v.role in ("temp", "out", "inout", "out_unassigned")
                      and (carried is None or v.name in carried) and v.name not in self.loop_only]
        if not candidates:
            return None
        chosen = set(rng.sample(candidates, min(len(candidates), rng.randint(1, 3))))
        again = [name for name in self.last_carried if name in candidates]
        if again and rng.random() < 0.6:  # loops one after another, carrying the same value
            chosen.add(rng.choice(again))
        if depth == 0:
            self.last_carried = sorted(chosen)
        outer = dict(self.scope)
        for name in sorted(chosen):  # a carried value inexact after the loop is inexact inside it, from the start
            var = self.scope[name]
            if var.role != "out_unassigned" and var.exact and rng.random() < 0.5:
                self.scope[name] = replace(var, exact=False)
        skips = count == 0 or isinstance(count, str)  # may run 0 times
        self.skipping.append(skips)
        body = self._block(rng.randint(1, 4), depth + 1, chosen)
        self.skipping.pop()
        if any(isinstance(s, Stmt) for s in body):
            self.features.add("repeat" if depth == 0 else "nested_repeat")
        after = {}
        for name, var in outer.items():
            now = self.scope[name] if name in chosen else var
            if var.role == "out_unassigned" and now.role == "out":  # assigned by this loop alone
                if skips or any(self.skipping):
                    self.loop_only.add(name)
                # README: a read after a loop with a literal count of 0 that alone assigns it is an error
                if self.allow_unassigned_read and depth == 0 and count != 0:
                    self.repeat_only[name] = count
                    self.features.add("read_after_repeat_only")
                else:
                    now = replace(now, role="out_unassigned")
            after[name] = now
        self.scope = after
        return Block(text, count, body) if any(isinstance(s, (Stmt, Block)) for s in body) else None


# ---------------------------------------------------------------------------
# Constant chains: casts of a literal, whose value the generator computes
# itself (`round_to`, `cast_value`) rather than trusting the reference


def constant_chain(rng: random.Random, stages) -> tuple[Node, object, str | None] | None:
    """`T2(T1(literal))`: the node, its exact value and its type (None: still a weak literal)."""
    typer = Typer()
    if rng.random() < 0.5:
        node = float_literal(rng, rng.choice(FLOATS))
    else:
        node = int_literal(rng, rng.choice(INTS + ("i32",)))
    value = -node.args[0].value if node.kind == "un" else node.value  # exact: a Fraction, an int or 0.0
    vtype = None
    kind = node.weak
    for _ in range(rng.randint(1, 3)):
        t = rng.choice(ALL_TYPES)
        cast = typer.cast(t, node)
        if cast is None:
            continue
        # The first cast converts the literal's exact value (README "Literal range"), as from a type
        # of its kind that holds it exactly; an integer literal fits an integer cast's type.
        value = cast_value(value, vtype or ("f64" if kind == "float" else "i64"), t)
        node, vtype = cast, t
    return node, value, vtype


def materialize(value, t: str):
    """A literal's value stored in type t (it fits; never bool, which needs a cast)."""
    if is_int(t):
        return int(value)
    return round_to(value, t)


def store_constant(node: Node, value, vtype: str | None, t: str):
    """The value a constant chain stores into type t."""
    return materialize(value, t) if vtype is None else cast_value(value, vtype, t)


# ---------------------------------------------------------------------------
# Rendering a whole program


def dims_text(dims: list[Dim]) -> str:
    return "[" + ", ".join(d.text for d in dims) + "]"


def decl_text(p: ParamDecl) -> str:
    mode = "inout " if p.role == "inout" else ""
    return f"{mode}{p.name}: {p.type}{dims_text(p.dims) if p.dims is not None else ''}"


@dataclass
class Line:
    text: str
    tag: str  # comment stage header param output stmt repeat close end blank
    names: tuple = ()  # the params or outputs a header line declares; a statement's targets
    depth: int = 0
    stmt: object = None


def pipeline_lines(name: str, params: list[ParamDecl], outputs: list[ParamDecl], body: list, wrap: bool,
                   mode=None) -> list[Line]:
    outs = f" -> ({', '.join(decl_text(o) for o in outputs)})" if outputs else ""
    one_line = f"pipeline {name}({', '.join(decl_text(p) for p in params)}){outs} {{"
    if not wrap and len(one_line) <= 110:
        lines = [Line(one_line, "header", tuple(p.name for p in params + outputs))]
    else:
        lines = [Line(f"pipeline {name}(", "header")]
        for k, p in enumerate(params):
            lines.append(Line(f"        {decl_text(p)}{',' if k + 1 < len(params) else ')'}", "param", (p.name,)))
        if not params:
            lines[0].text += ")"
        if outputs:
            lines.append(Line(f"    {outs.strip()} {{", "output", tuple(o.name for o in outputs)))
        else:
            lines[-1].text += " {"
    lines += body_lines(body, 1, mode)
    lines.append(Line("}", "end"))
    return lines


def body_lines(stmts: list, depth: int, mode) -> list[Line]:
    pad = "    " * depth
    out = []
    for stmt in stmts:
        if isinstance(stmt, str):
            out.append(Line(pad + stmt, "comment", depth=depth))
        elif isinstance(stmt, Block):
            out.append(Line(f"{pad}repeat {stmt.count_text} {{", "repeat", depth=depth))
            out += body_lines(stmt.body, depth + 1, mode)
            out.append(Line(pad + "}", "close", depth=depth))
        else:
            text = render(stmt.value, mode)
            if mode is not None and stmt.temp_type is not None:  # keep the temp's type (see `shadow`)
                text = f"{stmt.temp_type}({text})"
            out.append(Line(f"{pad}{', '.join(stmt.targets)} = {text};", "stmt", tuple(stmt.targets), depth, stmt))
    return out


# ---------------------------------------------------------------------------
# Error budgets: how far each output may be from the reference, in ulps

MAX_COUNT = 3  # the largest count a count parameter is given (see `Program.arguments`)


def site_factor(node: Node) -> str:
    """1 + the site's error budget, as a literal of the type it multiplies."""
    if node.kind in ("round", "cast"):
        inner = node.args[0].type
        return repr(1 + ROUND_BUDGET * 2.0 ** -TYPES[node.text].mant) if inner else "1.0"
    return repr(1 + LIBM_BUDGET * 2.0 ** -TYPES[compute(node.type)].mant)


def site_error(node: Node) -> float:
    if node.kind in ("round", "cast"):
        return ROUND_BUDGET * 2.0 ** -TYPES[node.text].mant
    return LIBM_BUDGET * 2.0 ** -TYPES[compute(node.type)].mant


class Budget:
    """Relative error bounds, propagated through a program as the reference runs it (each loop as many
    times as its count can be): a value's bound is the sum of its operands' (condition numbers taken
    as 1: the shadows check that) plus its own site's budget. Records the sites that carry error."""

    def __init__(self):
        self.active: set[int] = set()  # ids of the site nodes whose budget reached a value

    def node(self, node: Node, env: dict[str, float]) -> float:
        if node.kind == "name":
            return 0.0 if node.type is None else env.get(node.text, 0.0)
        if node.kind in ("lit", "const"):
            return 0.0
        if node.kind == "stage":
            stage, k = node.value
            return self.stage(stage, [self.node(a, env) for a in node.args])[k]
        errors = [self.node(a, env) for a in node.args]
        if node.kind in ("tern",) or node.text == "where":
            base = max(errors[1:])
        elif node.kind == "call" and node.text in ("min", "max", "clamp"):
            base = max(errors)
        else:
            base = sum(errors)
        if node.site and (node.kind not in ("round", "cast") or base > 0):  # rounding an exact value: no error
            self.active.add(id(node))
            base += site_error(node)
        return base

    def stage(self, stage: StageSpec, arg_errors: list[float]) -> list[float]:
        env = {p: e for (p, _, _), e in zip(stage.params, arg_errors)}
        stored = {}  # a result as converted to its type (env holds it as later statements read it)
        for what, targets, value in stage.body:
            if what == "multi":
                env.update(zip(targets, self.stage(value.value[0], [self.node(a, env) for a in value.args])))
                continue
            raw = value.args[0] if value.kind == "round" and what == "set" else value
            env[targets[0]] = self.node(raw, env)
            stored[targets[0]] = self.node(value, env)
        return [stored.get(r, env.get(r, 0.0)) for r, _ in stage.results]

    def body(self, stmts: list, env: dict[str, float]) -> None:
        for stmt in stmts:
            if isinstance(stmt, Block):
                for _ in range(stmt.count if isinstance(stmt.count, int) else MAX_COUNT):
                    self.body(stmt.body, env)
            elif isinstance(stmt, Stmt) and stmt.multi is not None:
                env.update(zip(stmt.targets, self.stage(stmt.multi, [self.node(a, env) for a in stmt.value.args])))
            elif isinstance(stmt, Stmt):
                env[stmt.targets[0]] = self.node(stmt.value, env)


def ulps(error: float, t: str) -> int:
    """A relative error as ulps of float type t: k * 2^-mant is at most 2k ulps."""
    return math.ceil(error * 2.0 ** (TYPES[t].mant + 1) - 1e-9) if error > 0 else 0


# ---------------------------------------------------------------------------
# Programs and their arguments


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    dims: tuple | None  # each a dim name or a literal size; None for a scalar
    role: str  # in inout scalar count (parameters), out (outputs)


@dataclass(frozen=True, eq=False)
class Program:
    seed: int
    source: str
    pipeline: str
    params: tuple[Param, ...]
    outputs: tuple[Param, ...]
    valid: bool
    mistake: str | None = None  # the deliberate mistake of an invalid program
    error_lines: frozenset = frozenset()  # the lines its error may be reported on
    compiles: bool = True  # False: a repeat inside a repeat (checked and run by the reference only)
    tolerance: dict = field(default_factory=dict)  # float output or inout -> ulps from the reference
    constants: dict = field(default_factory=dict)  # output -> its exact value
    unassigned_reads: tuple = ()  # repeat counts (literal or count parameter) that leave a read output unset
    aliases: dict = field(default_factory=dict)  # dim name -> the dim it must equal
    features: frozenset = frozenset()
    sites: int = 0
    render_shadow: object = None  # site -> source with that site perturbed

    @property
    def name(self) -> str:
        return f"gen{self.seed}.fz"

    def shadow(self, site: int) -> str:
        """The source with one site's value multiplied by 1 + its error budget."""
        return self.render_shadow(site)

    def sizes(self, profile: str = "small", seed: int = 0) -> dict[str, int]:
        """A size for each named dim, each its own: "small" (1-7), "wide" (the innermost beyond a
        256-thread block, not a multiple of the vector width), "vector" (the innermost a multiple of 16)."""
        rng = random.Random(f"{self.seed}:{profile}:{seed}")
        names = list(dict.fromkeys(self.aliases.get(d, d) for p in self.params if p.dims for d in p.dims
                                   if isinstance(d, str)))
        inner = [self.aliases.get(p.dims[-1], p.dims[-1]) for p in self.params if p.dims and isinstance(p.dims[-1], str)]
        pool = {"small": [1, 2, 3, 4, 5, 6, 7], "wide": [1, 2, 3, 5], "vector": [2, 3, 5]}[profile]
        sizes = {}
        for name in names:
            if profile != "small" and name == (inner[0] if inner else None):
                sizes[name] = rng.choice((257, 263, 333, 517) if profile == "wide" else (256, 272, 528))
            else:
                free = [s for s in pool if s not in sizes.values()] or pool
                sizes[name] = rng.choice(free)
        return sizes | {alias: sizes[name] for alias, name in self.aliases.items() if name in sizes}

    def arguments(self, sizes: dict[str, int], seed: int = 0) -> list:
        """Random arguments in parameter order: never all zeros, negative values, and for floats now
        and then NaN, inf, denormals and huge values; count parameters 0, 1 or 3."""
        rng = np.random.default_rng([self.seed, seed])
        args = []
        for p in self.params:
            if p.dims is None:
                args.append(int(rng.choice((0, 1, MAX_COUNT))) if p.role == "count" else random_scalar(rng, p.type))
            else:
                shape = tuple(d if isinstance(d, int) else sizes[d] for d in p.dims)
                args.append(random_array(rng, p.type, shape))
        return args

    def reads_unassigned(self, args: list) -> bool:
        """Whether this call reads an output that a loop which ran 0 times was to assign."""
        values = {p.name: a for p, a in zip(self.params, args)}
        return any((values[c] if isinstance(c, str) else c) == 0 for c in self.unassigned_reads)


def numpy_dtype(t: str) -> np.dtype:
    if t == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"bool": "bool", "f16": "float16", "f32": "float32", "f64": "float64"}.get(
        t, ("int" if TYPES[t].kind == "int" else "uint") + str(TYPES[t].bits)))


_SPECIALS = {"f16": [5.96e-8, 6.1e-5, 65504.0, 60000.0, -0.0], "bf16": [9.2e-41, 1.2e-38, 3.0e38, -0.0],
             "f32": [1e-45, 1e-40, 1.2e-38, 3.4e38, 1e30, -0.0], "f64": [5e-324, 1e-310, 1e300, 1.7e308, -0.0]}
_SCALES = {"f16": [1.0, 8.0, 100.0], "bf16": [1.0, 100.0, 1e6], "f32": [1.0, 1e3, 1e-3, 1e15],
           "f64": [1.0, 1e3, 1e-3, 1e100]}


def random_array(rng: np.random.Generator, t: str, shape: tuple) -> np.ndarray:
    size = math.prod(shape)
    if t == "bool":  # both values, where there is room for both
        data = rng.random(size) < 0.5
        if size > 1:
            picks = rng.choice(size, 2, replace=False)
            data[picks] = (True, False)
        return data.reshape(shape)
    if is_int(t):
        lo, hi = int_range(t)
        span = rng.choice(("small", "medium", "full"), p=(0.6, 0.25, 0.15))
        bound = {"small": 9, "medium": 1000, "full": None}[span]
        low, high = (lo, hi) if bound is None else (max(lo, -bound), min(hi, bound))
        data = rng.integers(low, high, size, endpoint=True, dtype=numpy_dtype(t))
        if rng.random() < 0.3 and size:
            edges = np.array([lo, hi, 0, 1, hi - 1] + ([-1] if lo < 0 else []), dtype=numpy_dtype(t))
            data[rng.integers(size, size=max(1, size // 20))] = rng.choice(edges, max(1, size // 20))
        if size and not data.any():
            data[0] = 1
        return data.reshape(shape)
    data = rng.standard_normal(size) * rng.choice(_SCALES[t])
    if rng.random() < 0.3 and size > 1:  # specials among ordinary values, never all of them
        specials = np.array(_SPECIALS[t] + [np.nan, np.inf, -np.inf, 0.5, -3.0])
        count = max(1, size // 20)
        picks = rng.choice(specials, count) * rng.choice((-1.0, 1.0), count)
        data[rng.choice(size - 1, count) + 1] = picks
    return data.astype(numpy_dtype(t)).reshape(shape)


def random_scalar(rng: np.random.Generator, t: str):
    if t == "bool":
        return bool(rng.random() < 0.5)
    if is_int(t):
        lo, hi = int_range(t)
        if rng.random() < 0.2:
            return [lo, hi, 0, 1][rng.integers(4)]
        return int(rng.integers(max(lo, -20), min(hi, 20), endpoint=True))
    roll = rng.random()
    if roll < 0.1:
        return float(rng.choice([0.5, -2.0, 3.0, 0.0, -0.0]))
    if roll < 0.12:  # a special scalar spreads to every element: rarely
        return float(rng.choice([math.inf, -math.inf, math.nan]))
    return float(round_to(float(rng.standard_normal() * rng.choice(_SCALES[t][:2])), t))


# ---------------------------------------------------------------------------
# generate()


def generate(seed: int, *, invalid: float = 0.15, nested: float = 0.1) -> Program:
    """The program for `seed`: valid, or (with probability `invalid`) with one deliberate mistake.
    `nested` is the chance of a repeat inside a repeat (checked and run by the reference only)."""
    rng = random.Random(seed)
    names = Names(rng, awkward=0.15)
    stages: list[StageSpec] = []
    banned: set[str] = set()
    stage_names = []  # a stage named like a builtin replaces it everywhere, so all are named first
    for _ in range(rng.choices((0, 1, 2, 3), (3, 3, 2, 1))[0]):
        name = rng.choice(["sigmoid", "exp", "relu", "gelu"]) if rng.random() < 0.1 else names.fresh("st")
        if name in names.used and name not in stage_names or name in stage_names:
            name = names.fresh("st")
        names.used.add(name)
        stage_names.append(name)
    banned = set(stage_names)
    for name in stage_names:
        stages.append(build_stage(rng, names, name, list(stages), banned))
    builder = PipelineBuilder(rng, names, stages, banned, nested=rng.random() < nested)
    builder.signature()
    body = builder.body()
    pipeline = names.fresh("pipe")
    wrap = rng.random() < 0.3
    env = {p.name: 0.0 for p in builder.params}
    budget = Budget()
    budget.body(body, env)
    sites = [n for n in number_sites(stages, body) if id(n) in budget.active]

    def source(mode=None) -> str:
        lines = []
        for stage in stages:
            lines += stage_lines(stage, mode) + [""]
        lines += [line.text for line in pipeline_lines(pipeline, builder.params, builder.outputs, body, wrap, mode)]
        return "\n".join(lines) + "\n"

    def shadow(site: int) -> str:
        node = sites[site]
        return source({id(node): site_factor(node)})

    tolerance = {d.name: ulps(env.get(d.name, 0.0), d.type) for d in builder.outputs + builder.params
                 if d.dims is not None and is_float(d.type)}
    features = set(builder.features)
    features |= {"stage", *(["let"] if any(w == "let" for s in stages for w, _, _ in s.body) else []),
                 *(["named_results"] if any(s.named for s in stages) else [])} if stages else set()
    program = Program(
        seed=seed, source=source(), pipeline=pipeline,
        params=tuple(Param(p.name, p.type, None if p.dims is None else tuple(d.text if d.size is None else d.size
                                                                              for d in p.dims), p.role)
                     for p in builder.params),
        outputs=tuple(Param(o.name, o.type, tuple(d.text if d.size is None else d.size for d in o.dims), "out")
                      for o in builder.outputs),
        valid=True, compiles="nested_repeat" not in features, tolerance=tolerance,
        constants=dict(builder.constants), unassigned_reads=tuple(builder.unassigned_reads),
        aliases=dict(builder.aliases),
        features=frozenset(features), sites=len(sites), render_shadow=shadow)
    if rng.random() < invalid:
        return add_mistake(program, rng, Mistakes(rng, stages, builder, pipeline, wrap, body))
    return program


def number_sites(stages: list[StageSpec], body: list) -> list[Node]:
    """Every site, in source order."""
    found = []
    for stage in stages:
        for _, _, value in stage.body:
            found += [n for n in walk(value) if n.site]

    def visit(stmts):
        for stmt in stmts:
            if isinstance(stmt, Block):
                visit(stmt.body)
            elif isinstance(stmt, Stmt):
                found.extend(n for n in walk(stmt.value) if n.site)
    visit(body)
    return found




# ---------------------------------------------------------------------------
# Deliberate mistakes: one per invalid program, with the line its error belongs on


class Mistakes:
    """Each `m_*` method edits a valid program into an invalid one; it returns the new lines and
    the 0-based indices of the lines where an error may be reported, or None where it does not apply."""

    def __init__(self, rng: random.Random, stages: list[StageSpec], builder: PipelineBuilder, pipeline: str,
                 wrap: bool, body: list):
        self.rng, self.stages, self.b, self.pipeline, self.wrap, self.body = rng, stages, builder, pipeline, wrap, body
        self.taken = set(builder.names.used) | {s.name for s in stages} | set(builder.scope)

    # ---- rendering with edits
    def render(self, stages=None, params=None, outputs=None, body=None) -> list[Line]:
        lines = []
        for stage in self.stages if stages is None else stages:
            lines += [Line(text, "stage", (stage.name,)) for text in stage_lines(stage)] + [Line("", "blank")]
        return lines + pipeline_lines(self.pipeline, self.b.params if params is None else params,
                                      self.b.outputs if outputs is None else outputs,
                                      self.body if body is None else body, self.wrap)

    def insert(self, *texts: str, at_top: bool = False) -> tuple[list[Line], set[int]]:
        """Statements inserted at the top level of the pipeline's body; the error belongs on the first."""
        body = list(self.body)
        k = 0 if at_top else self.rng.randint(0, len(body))
        marker = "\0mistake"
        body[k:k] = [marker] + list(texts[1:])
        lines = self.render(body=body)
        index = next(i for i, line in enumerate(lines) if line.text.strip() == marker)
        lines[index] = Line(lines[index].text.replace(marker, texts[0]), "stmt", depth=1)
        return lines, {index}

    def fresh(self) -> str:
        name = f"zq{self.rng.randint(0, 999)}"
        return name if name not in self.taken else self.fresh()

    def params_of(self, *, roles=("in", "inout", "scalar", "count"), kinds=None) -> list[ParamDecl]:
        return [p for p in self.b.params if p.role in roles and (kinds is None or TYPES[p.type].kind in kinds)]

    def number(self) -> str:
        """A numeric operand: a parameter, or a literal."""
        nums = self.params_of(kinds=("int", "uint", "float"))
        return self.rng.choice(nums).name if nums else self.rng.choice(("1.5", "2"))

    def line_of(self, lines: list[Line], name: str) -> set[int]:
        """The lines of the pipeline's signature that declare `name`."""
        return {i for i, line in enumerate(lines) if line.tag in ("header", "param", "output") and name in line.names}

    # ---- expressions and statements
    def m_unknown_name(self):
        return self.insert(f"{self.fresh()} = {self.number()} + nosuch_{self.rng.randint(0, 9)};")

    def m_unknown_function(self):
        name = self.rng.choice([f for f in ("sum", "mean", "rand", "softmax", "dot", "len") if f not in self.taken])
        return self.insert(f"{self.fresh()} = {name}({self.number()});")

    def m_builtin_arity(self):
        a = self.number()
        forms = [f"exp({a}, {a})", f"atan2({a})", f"clamp({a}, {a})", f"where({a} > 0, {a})", "max()", f"fma({a})"]
        forms = [f for f in forms if f.split("(")[0] not in self.taken]
        return self.insert(f"{self.fresh()} = {self.rng.choice(forms)};") if forms else None

    def m_stage_arity(self):
        if not self.stages:
            return None
        stage = self.rng.choice(self.stages)
        count = len(stage.params) + self.rng.choice((-1, 1) if len(stage.params) > 1 else (1,))
        return self.insert(f"{self.fresh()} = {stage.name}({', '.join([self.number()] * count)});")

    def m_literal_range(self):
        """A literal out of range where it is stored or is an operand (README "Literal range": a cast
        of one converts its exact value, `f16(70000.0)` is inf, and is no mistake)."""
        any_param = self.rng.choice(self.b.params).name if self.b.params else "2.0"
        if self.rng.random() < 0.2:  # stored as f16/bf16, where the literal rounds to inf
            name, t = self.fresh(), self.rng.choice(("f16", "bf16"))
            text = self.rng.choice(("70000.0", "65520.0", "-1e5") if t == "f16" else ("3.4e38", "-1e39"))
            return self._with_output(name, t, f"{name} = {text};", last=float_literal_of(1.5))
        form = self.rng.choice(["u8(256)", "i8(-129)", f"f32({any_param}) * 1e39", "1e999", "99999999999999999999",
                                "1e39", "-3.41e38", f"f16({any_param}) * -1e39", "1e38 * 10.0", "u64(-1)",
                                "i64(9223372036854775808)", "u16(0x10000)"])
        return self.insert(f"{self.fresh()} = {form};")

    def m_assign_to_input(self):
        inputs = self.params_of(roles=("in",))
        return self.insert(f"{(p := self.rng.choice(inputs)).name} = {p.name};") if inputs else None

    def m_assign_to_scalar(self):
        scalars = self.params_of(roles=("scalar", "count"))
        return self.insert(f"{(p := self.rng.choice(scalars)).name} = {p.name};") if scalars else None

    def _with_output(self, name: str, t: str, *texts, last: Node | None = None) -> tuple[list[Line], set[int]]:
        """A new output of type t (assigned `last`, or a literal, at the end), and the mistake's statements
        before that."""
        out = ParamDecl(name, t, [Dim("1", 1)], "out", (False,))
        body = list(self.body)
        k = self.rng.randint(0, len(body))
        body[k:k] = ["\0mistake"] + list(texts[1:])
        body.append(Stmt([name], last or self.b._gen((False,)).literal(t)))
        lines = self.render(outputs=self.b.outputs + [out], body=body)
        index = next(i for i, line in enumerate(lines) if line.text.strip() == "\0mistake")
        lines[index] = Line(lines[index].text.replace("\0mistake", texts[0]), "stmt", depth=1)
        return lines, {index}

    def m_bool_arithmetic(self):
        a = self.number()
        form = "true + false" if "true" not in self.taken else f"({a} > {a}) * ({a} < {a})"
        return self.insert(f"{self.fresh()} = {form};")

    def m_not_a_number(self):
        return self.insert(f"{self.fresh()} = !{self.number()};")

    def m_logic_on_numbers(self):
        return self.insert(f"{self.fresh()} = {self.number()} {self.rng.choice(('&&', '||'))} {self.number()};")

    def m_condition_not_bool(self):
        a = self.number()
        form = f"where({a}, {a}, {a})" if "where" not in self.taken and self.rng.random() < 0.5 else f"{a} ? {a} : {a}"
        return self.insert(f"{self.fresh()} = {form};")

    def m_no_common_type(self):
        a = self.rng.choice(self.b.params).name if self.b.params else "1"
        return self.insert(f"{self.fresh()} = i64({a}) + u64({a});")

    def m_float_into_integer(self):
        declared = [d for d in self.b.outputs + self.params_of(roles=("inout",)) if TYPES[d.type].kind != "float"]
        if not declared:
            name = self.fresh()
            return self._with_output(name, self.rng.choice(INTS + ("bool",)), f"{name} = 1.5;")
        return self.insert(f"{self.rng.choice(declared).name} = 1.5;")

    def m_number_into_bool(self):
        flags = [d.name for d in self.b.outputs + self.params_of(roles=("inout",)) if d.type == "bool"]
        nums = self.params_of(kinds=("int", "uint", "float"))
        value = self.rng.choice(nums).name if nums else "f32(1)"
        if not flags:
            name = self.fresh()
            return self._with_output(name, "bool", f"{name} = {value};")
        return self.insert(f"{self.rng.choice(flags)} = {value};")

    def m_read_before_assigned(self):
        if not self.b.outputs:
            return None
        return self.insert(f"{self.fresh()} = {self.rng.choice(self.b.outputs).name};", at_top=True)

    def m_repeat_count(self):
        arrays = self.params_of(roles=("in", "inout"))
        floats = self.params_of(roles=("scalar",), kinds=("float",))
        counts = ["2.5", "-1", "1e3", "2 + 1", "nosuch"] + [p.name for p in arrays + floats]
        return self.insert(f"repeat {self.rng.choice(counts)} {{", f"    {self.fresh()} = {self.number()};", "}")

    def m_carried_type_change(self):
        temps = [(k, s) for k, s in enumerate(self.body) if isinstance(s, Stmt) and s.multi is None
                 and self.b.scope.get(s.targets[0], Var("", "")).role == "temp"]
        if not temps:
            return None
        k, stmt = self.rng.choice(temps)
        other = "1.5" if stmt.value.typed != "f32" else "1"
        body = self.body[:k + 1] + ["repeat 2 {", "\0mistake", "}"] + self.body[k + 1:]
        lines = self.render(body=body)
        index = next(i for i, line in enumerate(lines) if line.text.strip() == "\0mistake")
        for i in (index - 1, index, index + 1):  # the three raw lines were rendered as comments
            lines[i] = Line(lines[i].text.replace("\0mistake", f"    {stmt.targets[0]} = {other};"), "stmt", depth=1)
        return lines, {index}

    def m_unsupported_syntax(self):
        a, t = self.number(), self.fresh()
        declared = [d.name for d in self.b.outputs + self.params_of(roles=("inout",))] or [t]
        forms = [f"{t} = {a} >> 3;", f"{t} = {a} ^ 5;", f"{self.rng.choice(declared)} += 1.0;",
                 f"if ({a} > 0) {{ {t} = {a}; }}", f"let {t} = {a};", f"return {a};", f"{t} = [{a}, {a}];",
                 f"{t} = {a}[0];", f"{t} := {a};", f"{t} = {a}++;", f"{t} = {a} @ 2;", f"{t} = 'x';",
                 f"{t} = {a};;", f"{t} = 0b101;", f"{t} = 1_000;", f"{t} = {a} + \u00e9;", f"{t} = {a} \x00;",
                 f"{t} = {'-' * 250}{a};", f"{t} = ({a};", f"{t} = {a} ** ;", f"{t} = {a} < {a} > ;"]
        if self.stages:
            forms.append(f"{t} = {self.stages[0].name}(a={a});")
        return self.insert(self.rng.choice(forms))

    def m_missing_semicolon(self):
        lines = self.render()
        stmts = [i for i, line in enumerate(lines) if line.tag == "stmt"]
        if not stmts:
            return None
        i = self.rng.choice(stmts)
        lines[i] = replace(lines[i], text=lines[i].text.rstrip(";"))
        after = next(j for j in range(i + 1, len(lines)) if lines[j].text.strip()
                     and not lines[j].text.strip().startswith(("#", "//")))
        return lines, {i, after}

    def m_target_count(self):
        multis = [s for s in self.stages if len(s.results) > 1]
        if not multis or self.rng.random() < 0.3:
            return self.insert(f"{self.fresh()}, {self.fresh()} = {self.number()};")
        stage = self.rng.choice(multis)
        args = ", ".join([self.number()] * len(stage.params))
        how = self.rng.choice(("more", "expr", "twice"))
        if how == "more":
            return self.insert(f"{', '.join(self.fresh() for _ in range(len(stage.results) + 1))} = {stage.name}({args});")
        if how == "twice":
            t = self.fresh()
            return self.insert(f"{', '.join([t] * len(stage.results))} = {stage.name}({args});")
        return self.insert(f"{self.fresh()} = {stage.name}({args}) + 1;")

    def m_builtin_on_bool(self):
        forms = [f for f in ("abs(true)", "isnan(false)", "floor(true)", "min(true, false)") if
                 f.split("(")[0] not in self.taken and "true" not in self.taken and "false" not in self.taken]
        return self.insert(f"{self.fresh()} = {self.rng.choice(forms)};") if forms else None

    def m_broadcast_mismatch(self):
        a, b = self.fresh(), self.fresh()
        params = self.b.params + [ParamDecl(a, "f32", [Dim("3", 3)], "in", (True,)),
                                  ParamDecl(b, "f32", [Dim("4", 4)], "in", (True,))]
        body = list(self.body)
        k = self.rng.randint(0, len(body))
        body[k:k] = ["\0mistake"]
        lines = self.render(params=params, body=body)
        index = next(i for i, line in enumerate(lines) if line.text.strip() == "\0mistake")
        lines[index] = Line(f"    {self.fresh()} = {a} + {b};", "stmt", depth=1)
        return lines, {index}

    # ---- declarations
    def _edit_param(self, pick, edit) -> tuple[list[Line], set[int]] | None:
        candidates = [p for p in self.b.params if pick(p)]
        if not candidates:
            return None
        target = self.rng.choice(candidates)
        params = [edit(p) if p is target else p for p in self.b.params]
        lines = self.render(params=params)
        return lines, self.line_of(lines, target.name)

    def m_inout_scalar(self):
        return self._edit_param(lambda p: p.dims is None, lambda p: replace(p, role="inout"))

    def m_unknown_type(self):
        bad = self.rng.choice(("f33", "float", "int32", "half", "f8", "i128", "F32", "double"))
        return self._edit_param(lambda p: True, lambda p: replace(p, type=bad))

    def m_bad_dims(self):
        bad = self.rng.choice(("2.5", "", "-1", "n m", "n,", "0x", "n[2]"))
        return self._edit_param(lambda p: p.dims is not None, lambda p: replace(p, dims=[Dim(bad, None)]))

    def m_param_default(self):
        return self._edit_param(lambda p: p.dims is None, lambda p: replace(p, type=f"{p.type} = 1e-5"))

    def m_duplicate_param(self):
        if not self.b.params:
            return None
        twin = replace(self.rng.choice(self.b.params), type=self.rng.choice(ALL_TYPES))
        params = list(self.b.params)
        params.insert(self.rng.randint(params.index(next(p for p in params if p.name == twin.name)) + 1,
                                       len(params)), twin)
        lines = self.render(params=params)
        # the second declaration: the last line that declares the name
        return lines, {max(self.line_of(lines, twin.name))}

    def m_output_mode(self):
        """An output never assigned, a scalar output, an unbound dim, or `inout` on an output."""
        how = self.rng.choice(("unassigned", "scalar", "unbound", "inout"))
        arrays = self.params_of(roles=("in", "inout"))
        if how == "unassigned" and not arrays:
            how = "scalar"
        name = self.fresh()
        if how == "unassigned":
            source = self.rng.choice(arrays)
            out = ParamDecl(name, random_type(self.rng), source.dims, "out", source.shape)
        elif how == "scalar":
            out = ParamDecl(name, random_type(self.rng), None, "out")
        elif how == "unbound":
            out = ParamDecl(name, random_type(self.rng), [Dim("zq_dim", None)], "out", (True,))
        else:
            out = ParamDecl(name, "f32", [Dim("1", 1)], "inout", (False,))  # rendered `inout NAME: f32[1]`
        outputs = self.b.outputs + [out]
        body = self.body + ([Stmt([name], Node("lit", "1.5", type=None, weak="float", value=1.5))]
                            if how in ("unbound", "inout") else [])
        lines = self.render(outputs=outputs, body=body)
        return lines, self.line_of(lines, name)

    # ---- stages
    def _edit_stage(self, edit) -> tuple[list[Line], set[int]] | None:
        if not self.stages:
            return None
        target = self.rng.choice(self.stages)
        changed = edit(target)
        if changed is None:
            return None
        stages = [changed if s is target else s for s in self.stages]
        lines = self.render(stages=stages)
        return lines, {i for i, line in enumerate(lines) if line.tag == "stage" and target.name in line.names}

    def m_stage_param_mode(self):
        def edit(stage):
            k = self.rng.randrange(len(stage.params))
            name, t, exact = stage.params[k]
            how = self.rng.choice(("inout", "dims"))
            params = list(stage.params)
            params[k] = (f"inout {name}", t, exact) if how == "inout" else (name, f"{t}[n]", exact)
            return replace(stage, params=params)
        return self._edit_stage(edit)

    def m_stage_result_mode(self):
        def edit(stage):
            name, t = stage.results[0]
            how = self.rng.choice(("inout", "dims")) if stage.named else "dims"
            results = [(f"inout {name}", t) if how == "inout" else (name, f"{t}[4]")] + stage.results[1:]
            return replace(stage, results=results)
        return self._edit_stage(edit)

    def m_stage_body(self):
        def edit(stage):
            body = list(stage.body)
            param = stage.params[0][0]
            how = self.rng.choice(("return_in_named", "assign_in_single", "after_return", "no_result", "twice",
                                   "repeat", "unknown", "duplicate_let"))
            if how == "return_in_named" and stage.named:
                body.append(("raw", [], f"return {param};"))
            elif how == "assign_in_single" and not stage.named:
                body.insert(0, ("raw", [], f"{self.fresh()} = {param};"))
            elif how == "after_return" and not stage.named:
                body.append(("raw", [], f"let {self.fresh()} = {param};"))
            elif how == "no_result":
                sets = [k for k, (what, _, _) in enumerate(body) if what in ("set", "return")]
                if not sets:
                    return None
                del body[self.rng.choice(sets)]
            elif how == "twice" and stage.named:
                sets = [entry for entry in body if entry[0] == "set"]
                if not sets:
                    return None
                body.append(self.rng.choice(sets))
            elif how == "repeat":
                body.insert(0, ("raw", [], f"repeat 2 {{ let {self.fresh()} = {param}; }}"))
            elif how == "duplicate_let":
                lets = [entry for entry in body if entry[0] == "let"]
                if not lets:
                    return None
                body.insert(len(body) - 1, ("raw", [], f"let {self.rng.choice(lets)[1][0]} = {param};"))
            else:
                body.insert(0, ("raw", [], f"let {self.fresh()} = nosuch + {param};"))
            return replace(stage, body=body)
        found = self._edit_stage(edit)
        return found

    def m_stage_recursion(self):
        name, other = self.fresh(), self.fresh()
        mutual = self.rng.random() < 0.5
        extra = [StageSpec(name, [("a", "f32", False)], [("r", "f32")], False,
                           body=[("raw", [], f"return {other if mutual else name}(a) + 1.0;")])]
        if mutual:
            extra.append(StageSpec(other, [("a", "f32", False)], [("r", "f32")], False,
                                   body=[("raw", [], f"return {name}(a);")]))
        lines = self.render(stages=self.stages + extra)
        return lines, {i for i, line in enumerate(lines) if line.tag == "stage" and line.names[0] in (name, other)}

    def m_duplicate_definition(self):
        if self.stages and self.rng.random() < 0.6:
            twin = self.rng.choice(self.stages)
            lines = self.render(stages=self.stages + [twin])
            first = min(i for i, line in enumerate(lines) if line.tag == "stage" and twin.name in line.names)
            return lines, {i for i, line in enumerate(lines) if line.tag == "stage" and twin.name in line.names
                           and i > first + len(stage_lines(twin)) - 1}
        lines = self.render()
        copy = [replace(line, tag="dup") for line in lines[next(i for i, line in enumerate(lines)
                                                                   if line.tag == "header"):]]
        return lines + [Line("", "blank")] + copy, {len(lines) + 1}

    def m_no_pipeline(self):
        lines = [line for line in self.render() if line.tag in ("stage", "blank")]
        return lines, {0}


MISTAKES = sorted(name[2:] for name in vars(Mistakes) if name.startswith("m_"))


def add_mistake(program: Program, rng: random.Random, mistakes: Mistakes) -> Program:
    for _ in range(20):
        name = rng.choice(MISTAKES)
        made = getattr(mistakes, "m_" + name)()
        if made is not None:
            lines, where = made
            return replace(program, source="\n".join(line.text for line in lines) + "\n", valid=False, mistake=name,
                           error_lines=frozenset(i + 1 for i in where), compiles=False, tolerance={}, constants={},
                           sites=0)
    return program
