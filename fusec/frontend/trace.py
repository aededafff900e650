"""`@fusec.jit` on a Python function: tracing into a .fz pipeline.

The function runs once per argument signature (`signature_key`) on `Traced`
values that record every array operation as one .fz statement, i.e. one
stage of the unfused form; operations on scalars alone stay inline text. The
recorded program goes through the same front end as a .fz file.

Types follow NumPy and PyTorch: every value has the type they would give it
(`Traced.type`; a Python number is weak, like a .fz literal). But f16 and
bf16 values are carried in f32 from statement to statement and rounded only
where the function returns them, as Inductor does: a parameter or an explicit
cast of a storage type is widened to f32 where an operation reads it
(`Traced.read`). A traced f16 chain is therefore rounded once, like the same
maths written as one .fz statement.

Python's operators and NumPy's functions mean what they mean in NumPy (`%`
takes the divisor's sign, `np.maximum` propagates NaN). Reductions over the
last axis with keepdims (`np.max(x, axis=-1, keepdims=True)`, `x.sum(-1,
keepdims=True)`, `np.mean`, `np.var`, `fusec.row_logsumexp`) are .fz's row
reductions. What has no .fz equivalent (control flow on array values, `//`,
integer `/`, indexing, other reductions) raises `TraceError` saying what to
write instead.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

from fusec.errors import Source
from fusec.frontend import check_source
from fusec.frontend.builtins import BOOL_CONSTANTS, BUILTINS, FLOAT_CONSTANTS, ROW_REDUCTIONS
from fusec.types import BOOL, BY_NAME, F32, I32, ScalarType, from_dtype, promote

KEYWORDS = {"stage", "pipeline", "let", "return", "repeat", "inout"}
# Names the traced text uses as functions or constants: a parameter of one of these names is renamed.
RESERVED = KEYWORDS | set(BUILTINS) | set(BY_NAME) | set(FLOAT_CONSTANTS) | set(BOOL_CONSTANTS)

# The type of a Python number: weak, it takes the other operand's type (as a .fz literal does).
WEAK_INT, WEAK_FLOAT = "int", "float"


class TraceError(TypeError):
    """A Python function that cannot be traced into a pipeline."""


# ---- types

def _is_float(t) -> bool:
    return t == WEAK_FLOAT or (isinstance(t, ScalarType) and t.is_float)


def _is_int(t) -> bool:
    return t == WEAK_INT or (isinstance(t, ScalarType) and t.is_int)


def join(a, b):
    """The type of `a op b`: .fz's promotion (the checker's `join`); two weak operands stay weak."""
    if isinstance(a, str) and isinstance(b, str):
        return WEAK_FLOAT if WEAK_FLOAT in (a, b) else WEAK_INT
    if isinstance(a, str):
        a, b = b, a
    if isinstance(b, str):
        if b == WEAK_FLOAT and not a.is_float:
            return F32
        return I32 if a.is_bool else a
    common = promote(a, b)
    if common is None:
        raise TraceError(f"{a} and {b} have no common type; convert one of them with .astype(...)")
    return common


def _builtin_type(func: str, types: list):
    """The result type of a .fz builtin, by its rule in the builtins table."""
    rule = BUILTINS[func].rule
    if rule == "select":
        return join(types[1], types[2])
    if rule == "class":
        return BOOL
    common = functools.reduce(join, types)
    if rule == "float" and not _is_float(common):
        return WEAK_FLOAT if common == WEAK_INT else F32
    return common


def fz_type(dtype) -> ScalarType:
    """The .fz type of a .fz type name ("f16"), or of a NumPy, CuPy, ml_dtypes or PyTorch dtype."""
    if isinstance(dtype, ScalarType):
        return dtype
    if isinstance(dtype, str) and dtype in BY_NAME:
        return BY_NAME[dtype]
    text = str(dtype)
    if not text.startswith("torch."):
        try:
            text = str(np.dtype(dtype))
        except TypeError:
            raise TraceError(f"{dtype!r} is not a dtype") from None
    found = from_dtype(text)
    if found is None:
        raise TraceError(f"dtype {dtype} is not supported by fusec (types: {', '.join(BY_NAME)})")
    return found


# ---- traced values

class Traced:
    """A value during tracing: an array (a .fz name; inside `Tracer.one_statement`,
    an expression) or a scalar expression (inline text).

    `type` is the type NumPy and PyTorch would give the value (WEAK_INT or
    WEAK_FLOAT for a Python number). `narrow`: the text itself has an f16/bf16
    type (a parameter or an explicit cast); everything computed is carried in
    f32, so that only the returned arrays are rounded. `compound`: the text is
    an expression, parenthesized where it is read.
    """

    __slots__ = ("tracer", "text", "type", "is_array", "narrow", "compound")

    def __init__(self, tracer: "Tracer", text: str, type_, is_array: bool, *, narrow=False, compound=False):
        self.tracer, self.text, self.type, self.is_array = tracer, text, type_, is_array
        self.narrow, self.compound = narrow, compound

    @property
    def read(self) -> str:
        """The text an operation reads: widened to f32 if narrow."""
        if self.narrow:
            return f"f32({self.text})"
        return f"({self.text})" if self.compound else self.text

    def __repr__(self) -> str:
        return f"<traced {'array' if self.is_array else 'scalar'} {self.text} : {self.type}>"

    @property
    def dtype(self) -> np.dtype:
        if isinstance(self.type, str):
            return np.dtype(float if self.type == WEAK_FLOAT else int)
        return self.type.numpy_dtype

    def astype(self, dtype) -> "Traced":
        return cast(self, dtype)

    # reductions over the last axis, as NumPy's methods (x.max(axis=-1, keepdims=True))
    def sum(self, *args, **kwargs): return ROW_METHODS["sum"](self, *args, **kwargs)
    def mean(self, *args, **kwargs): return ROW_METHODS["mean"](self, *args, **kwargs)
    def max(self, *args, **kwargs): return ROW_METHODS["max"](self, *args, **kwargs)
    def min(self, *args, **kwargs): return ROW_METHODS["min"](self, *args, **kwargs)
    def var(self, *args, **kwargs): return ROW_METHODS["var"](self, *args, **kwargs)

    # arithmetic, as NumPy's operators
    def __add__(self, o): return self.tracer.binary("+", self, o)
    def __radd__(self, o): return self.tracer.binary("+", o, self)
    def __sub__(self, o): return self.tracer.binary("-", self, o)
    def __rsub__(self, o): return self.tracer.binary("-", o, self)
    def __mul__(self, o): return self.tracer.binary("*", self, o)
    def __rmul__(self, o): return self.tracer.binary("*", o, self)
    def __truediv__(self, o): return self.tracer.binary("/", self, o)
    def __rtruediv__(self, o): return self.tracer.binary("/", o, self)
    def __mod__(self, o): return remainder(self, o)
    def __rmod__(self, o): return remainder(o, self)
    def __pow__(self, o): return self.tracer.binary("**", self, o)
    def __rpow__(self, o): return self.tracer.binary("**", o, self)
    def __neg__(self): return self.tracer.unary("-", self)
    def __pos__(self): return self
    def __abs__(self): return call("abs", self)
    def __round__(self, ndigits=None): return _round(self, ndigits or 0)
    # comparisons, and & | ^ ~ on bools
    def __lt__(self, o): return self.tracer.binary("<", self, o)
    def __le__(self, o): return self.tracer.binary("<=", self, o)
    def __gt__(self, o): return self.tracer.binary(">", self, o)
    def __ge__(self, o): return self.tracer.binary(">=", self, o)
    def __eq__(self, o): return self.tracer.binary("==", self, o)  # type: ignore[override]
    def __ne__(self, o): return self.tracer.binary("!=", self, o)  # type: ignore[override]
    def __and__(self, o): return _logic("&", self, o)
    def __rand__(self, o): return _logic("&", o, self)
    def __or__(self, o): return _logic("|", self, o)
    def __ror__(self, o): return _logic("|", o, self)
    def __xor__(self, o): return _logic("^", self, o)
    def __rxor__(self, o): return _logic("^", o, self)
    def __invert__(self): return _logic("~", self)
    __hash__ = None

    def __floordiv__(self, o):
        raise TraceError("`//` floors, which fusec does not offer; write np.floor(a / b) for floats")

    __rfloordiv__ = __floordiv__

    # NumPy's functions (np.exp(x), np.where(c, a, b)) come here
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        name = f"np.{ufunc.__name__}"
        if method != "__call__":
            raise TraceError(f"{name}.{method} is not supported inside @fusec.jit: fusec compiles elementwise "
                             f"operations, not reductions or accumulations")
        if kwargs:
            raise TraceError(f"{name}(..., {'=..., '.join(kwargs)}=...): keyword arguments of NumPy functions are "
                             f"not supported inside @fusec.jit (return the result; the function takes out=)")
        return _numpy_function(name, NUMPY_UFUNCS, ufunc.__name__)(*inputs)

    def __array_function__(self, func, types, args, kwargs):
        return _numpy_function(f"np.{func.__name__}", NUMPY_FUNCTIONS, func.__name__)(*args, **kwargs)

    def __array__(self, *_, **__):
        raise TraceError("a traced value cannot become a NumPy array inside @fusec.jit; use NumPy's elementwise "
                         "functions on it (np.exp(x)), or fusec's")

    def __bool__(self):
        raise TraceError("Python control flow (if, while, and, or, not, min(), max()) cannot depend on an array "
                         "value inside @fusec.jit; use np.where(cond, a, b), np.maximum/np.minimum, or & | ~ "
                         "on comparisons")

    def _no_number(self, *_):
        raise TraceError("a traced value cannot become a Python number or be iterated inside @fusec.jit "
                         "(math.exp(x), float(x), len(x), for v in x); use NumPy's functions (np.exp(x)) or fusec's")

    __float__ = __int__ = __index__ = __len__ = __iter__ = _no_number

    def __getitem__(self, _):
        raise TraceError("indexing and slicing are not supported inside @fusec.jit: fusec compiles elementwise "
                         "operations over whole arrays")


@dataclass(slots=True)
class Statement:
    target: str
    expr: str
    origin: str  # the Python line that made it, shown as a comment

    def render(self, rename: dict[str, str]) -> str:
        expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: rename.get(m.group(), m.group()), self.expr)
        comment = f"  # {self.origin}" if self.origin else ""
        return f"    {rename.get(self.target, self.target)} = {expr};{comment}"


def _python_line() -> str:
    """`file:line` of the user's code that made the current operation."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith((__name__, "numpy")):
        frame = frame.f_back
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else ""


class Tracer:
    def __init__(self):
        self.statements: list[Statement] = []
        self.taken: set[str] = set(RESERVED)
        self.inline = 0

    def fresh(self, base: str) -> str:
        """`base`, or `base_`, `base__`, ...: a name no parameter, dim, temp or builtin has."""
        name = base
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name

    def operand(self, value) -> Traced:
        if isinstance(value, Traced):
            if value.tracer is not self:
                raise TraceError("a traced value escaped from another @fusec.jit call")
            return value
        text, type_ = _literal(value)
        narrow = isinstance(type_, ScalarType) and type_.compute != type_
        return Traced(self, text, type_, False, narrow=narrow, compound=text.startswith("-"))

    def emit(self, expr: str, type_, is_array: bool, narrow: bool = False) -> Traced:
        """An array operation is one statement (one stage); a scalar one stays inline text."""
        if not is_array or self.inline:
            return Traced(self, expr, type_, is_array, narrow=narrow, compound=True)
        name = self.fresh(f"t{len(self.statements)}")
        self.statements.append(Statement(name, expr, _python_line()))
        return Traced(self, name, type_, True, narrow=narrow)

    @contextlib.contextmanager
    def one_statement(self):
        """Array operations inside stay one expression: a composite (np.maximum's
        NaN rule, np.clip) is one stage, as the NumPy function is one operation."""
        self.inline += 1
        try:
            yield
        finally:
            self.inline -= 1

    def settle(self, value: Traced) -> Traced:
        """The end of a composite: its array expression becomes one statement."""
        if value.is_array and value.compound:
            return self.emit(value.text, value.type, True, value.narrow)
        return value

    def binary(self, op: str, a, b) -> Traced:
        a, b = self.operand(a), self.operand(b)
        if op == "/" and _is_int(a.type) and _is_int(b.type):
            raise TraceError("integer / integer truncates in fusec (as in C), unlike Python; convert one side "
                             "first (x.astype(np.float32) / y), or write np.trunc(...) of a float division")
        common = join(a.type, b.type)
        type_ = BOOL if op in ("<", "<=", ">", ">=", "==", "!=", "&&", "||") else common
        return self.emit(f"{a.read} {op} {b.read}", type_, a.is_array or b.is_array)

    def unary(self, op: str, a) -> Traced:
        a = self.operand(a)
        return self.emit(f"{op}{a.read}", BOOL if op == "!" else a.type, a.is_array)


def _literal(value) -> tuple[str, object]:
    """A number as .fz text, and its type: a Python number is weak, a NumPy scalar has its dtype."""
    if isinstance(value, (bool, np.bool_)):
        return ("true" if value else "false"), BOOL
    if isinstance(value, np.generic) and not isinstance(value, np.bool_):
        t = fz_type(value.dtype)
        text, _ = _literal(value.item() if t.is_int else float(value))
        return f"{t.name}({text})", t
    if isinstance(value, int):
        return str(value), WEAK_INT
    if isinstance(value, float):
        if math.isnan(value):
            return "nan", WEAK_FLOAT
        if math.isinf(value):
            return ("-inf" if value < 0 else "inf"), WEAK_FLOAT
        return repr(value), WEAK_FLOAT
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        raise TraceError(f"a {type(value).__name__} used inside @fusec.jit must be one of the function's "
                         f"arguments (arrays cannot be captured as constants)")
    raise TraceError(f"cannot use a {type(value).__name__} inside @fusec.jit (numbers and arrays only)")


def _tracer_of(name: str, args) -> Tracer:
    for a in args:
        if isinstance(a, Traced):
            return a.tracer
    raise TraceError(f"{name}() works on traced values inside a @fusec.jit function")


# ---- operations: .fz builtins, and NumPy's meaning where .fz differs

def call(func: str, *args) -> Traced:
    """The .fz builtin `func` on traced values."""
    tracer = _tracer_of(f"fusec.{func}", args)
    ops = [tracer.operand(a) for a in args]
    type_ = _builtin_type(func, [o.type for o in ops])
    return tracer.emit(f"{func}({', '.join(o.read for o in ops)})", type_, any(o.is_array for o in ops))


def cast(x, dtype) -> Traced:
    """`x` converted to dtype (a .fz type name such as "f16", or a NumPy or PyTorch dtype).
    A cast to f16 or bf16 rounds, as it does in .fz and in PyTorch."""
    to = fz_type(dtype)
    tracer = _tracer_of("fusec.cast", (x,))
    x = tracer.operand(x)
    if x.type == to and (x.narrow or to.compute == to):
        return x  # already that type, rounded
    text = f"({x.text})" if x.compound else x.text  # a cast reads its operand as it is
    return tracer.emit(f"{to.name}({text})", to, x.is_array, narrow=to.compute != to)


def _truth(tracer: Tracer, value) -> Traced:
    """A value as bool, as NumPy's logical functions take it (`!= 0`)."""
    value = tracer.operand(value)
    return value if value.type == BOOL else cast(value, BOOL)


def _logic(symbol: str, a, b=None) -> Traced:
    """`&`, `|`, `^`, `~`: logical on bools; fusec has no bitwise operations on integers."""
    tracer = _tracer_of(f"`{symbol}`", (a, b))
    ops = [tracer.operand(v) for v in ((a,) if b is None else (a, b))]
    for v in ops:
        if v.type != BOOL:
            raise TraceError(f"`{symbol}` on {v.type} is bitwise, which fusec does not offer; `&`, `|`, `^` and "
                             f"`~` work on bools (comparisons, np.isnan(x), ...)")
    if symbol == "~":
        return tracer.unary("!", ops[0])
    return tracer.binary({"&": "&&", "|": "||", "^": "!="}[symbol], *ops)


def _composite(args, build) -> Traced:
    """`build(tracer, *operands)`, made one statement."""
    tracer = _tracer_of("fusec", args)
    ops = [tracer.operand(a) for a in args]
    with tracer.one_statement():
        result = build(tracer, *ops)
    return tracer.settle(result)


def _nan_propagating(name: str, func: str, op: str):
    """np.maximum or np.minimum: a NaN operand gives NaN (.fz's max and min, like np.fmax, give the other)."""
    def fn(a, b):
        def build(tracer, a, b):
            if not _is_float(join(a.type, b.type)):
                return call(func, a, b)
            return call("where", tracer.binary(op, a, b) | call("isnan", a), a, b)
        return _composite((a, b), build)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"np.{name}: elementwise, a NaN operand gives NaN (fusec.f{func} ignores it)."
    return fn


maximum = _nan_propagating("maximum", "max", ">")
minimum = _nan_propagating("minimum", "min", "<")


def where(cond, a, b) -> Traced:
    """np.where(cond, a, b): elementwise a where cond is true (nonzero), else b."""
    return _composite((cond, a, b), lambda tracer, c, a, b: call("where", _truth(tracer, c), a, b))


def clip(x, lo=None, hi=None) -> Traced:
    """np.clip: np.minimum(np.maximum(x, lo), hi), a NaN staying NaN (.fz's clamp ignores it); None: no bound."""
    if lo is None and hi is None:
        raise TraceError("np.clip needs a lower or an upper bound")
    bounds = [(maximum, lo), (minimum, hi)]

    def build(tracer, x, *_):
        for bound, value in bounds:
            x = x if value is None else bound(x, value)
        return x
    return _composite([v for v in (x, lo, hi) if v is not None], build)


def power(a, b) -> Traced:
    """np.power, i.e. `a ** b`: integers stay integers."""
    return _tracer_of("power", (a, b)).binary("**", a, b)


def remainder(a, b) -> Traced:
    """Python's and NumPy's `%`: the result has the divisor's sign (.fz's `%` and np.fmod the dividend's)."""
    def build(tracer, a, b):
        r = tracer.binary("%", a, b)
        if isinstance(r.type, ScalarType) and r.type.kind in ("uint", "bool"):
            return r
        wrong_sign = (r != 0) & ((r < 0) != (b < 0))
        return where(wrong_sign, r + b, r)
    return _composite((a, b), build)


def _round(x, decimals=0) -> Traced:
    if decimals != 0:
        raise TraceError(f"rounding to {decimals} decimals is not supported inside @fusec.jit; "
                         f"write np.round(x * 10**{decimals}) / 10**{decimals}")
    return call("round", x)


def _isfinite(x) -> Traced:
    return _composite((x,), lambda tracer, x: ~(call("isnan", x) | call("isinf", x)))


def _sign(x) -> Traced:
    """np.sign: -1, 0 or 1 in x's type; NaN stays NaN."""
    return _composite((x,), lambda tracer, x: where(x > 0, 1, where(x < 0, -1, x)))


def _floor_divide(a, b):
    raise TraceError("np.floor_divide (`//`) floors, which fusec does not offer; write np.floor(a / b) for floats")


def _fz(func: str, arity: int):
    """The .fz builtin `func` as a function of `arity` arguments."""
    def fn(*args):
        if len(args) != arity:
            raise TypeError(f"{func}() takes {arity} argument{'s' if arity > 1 else ''}, got {len(args)}")
        return call(func, *args)
    fn.__name__ = func
    fn.__doc__ = f"`{func}` of the .fz language, inside a @fusec.jit function."
    return fn


def _operator(op: str):
    def fn(a, b):
        return _tracer_of(op, (a, b)).binary(op, a, b)
    return fn


def _logical(symbol: str):
    """np.logical_and/or/xor: `&`, `|`, `^` on the operands' truth (`!= 0`)."""
    def fn(a, b):
        return _composite((a, b), lambda tracer, a, b: _logic(symbol, _truth(tracer, a), _truth(tracer, b)))
    return fn


# NumPy's ufuncs that are .fz builtins under the same name, and under another one.
_SAME_NAME = "sqrt cbrt exp exp2 expm1 log log2 log10 log1p sin cos tan sinh cosh tanh floor ceil trunc isnan isinf"
_RENAMED = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arctan2": "atan2", "absolute": "abs",
            "fabs": "abs", "rint": "round", "fmax": "max", "fmin": "min"}

# np.<ufunc> -> what it does on traced values (keyed by the ufunc's __name__).
NUMPY_UFUNCS = {
    **{name: _fz(name, 1) for name in _SAME_NAME.split()},
    **{np_name: _fz(fz, BUILTINS[fz].arity) for np_name, fz in _RENAMED.items()},
    "add": _operator("+"), "subtract": _operator("-"), "multiply": _operator("*"), "divide": _operator("/"),
    "equal": _operator("=="), "not_equal": _operator("!="), "less": _operator("<"),
    "less_equal": _operator("<="), "greater": _operator(">"), "greater_equal": _operator(">="),
    "power": power, "remainder": remainder, "fmod": _operator("%"), "floor_divide": _floor_divide,
    "maximum": maximum, "minimum": minimum, "negative": lambda x: -x, "positive": lambda x: x,
    "square": lambda x: x * x, "reciprocal": lambda x: 1 / x, "sign": _sign, "isfinite": _isfinite,
    "logical_and": _logical("&"), "logical_or": _logical("|"), "logical_xor": _logical("^"),
    "logical_not": lambda x: _composite((x,), lambda tracer, x: _logic("~", _truth(tracer, x))),
    "bitwise_and": lambda a, b: _logic("&", a, b), "bitwise_or": lambda a, b: _logic("|", a, b),
    "bitwise_xor": lambda a, b: _logic("^", a, b), "invert": lambda x: _logic("~", x),
}


def _np_clip(a, a_min=None, a_max=None, out=None, *, min=None, max=None, **kwargs):
    if out is not None or kwargs:
        raise TraceError("np.clip(..., out=...) is not supported inside @fusec.jit; return the result")
    return clip(a, a_min if min is None else min, a_max if max is None else max)


def _np_where(condition, x=None, y=None):
    if x is None or y is None:
        raise TraceError("np.where(condition) with one argument gives indices; inside @fusec.jit write "
                         "np.where(condition, a, b)")
    return where(condition, x, y)


def _np_round(a, decimals=0, out=None):
    if out is not None:
        raise TraceError("np.round(..., out=...) is not supported inside @fusec.jit; return the result")
    return _round(a, decimals)


def _row_reduction(np_name: str, fz: str):
    """np.<np_name>(x, axis=-1, keepdims=True): .fz's `fz` (a row reduction), in
    NumPy's type (an f16 row's max is f16; computed in f32 and rounded where returned)."""
    def fn(a, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        if axis not in (-1,) or keepdims is not True or dtype is not None or out is not None or kwargs:
            raise TraceError(f"np.{np_name} inside @fusec.jit reduces each row (the last axis): write "
                             f"np.{np_name}(x, axis=-1, keepdims=True), .fz's {fz}(x)")
        return _row_call(fz, a)
    fn.__name__ = np_name
    return fn


def _row_call(fz: str, *args) -> Traced:
    tracer = _tracer_of(f"fusec.{fz}", args)
    ops = [tracer.operand(a) for a in args]
    if not ops[0].is_array or not _is_float(ops[0].type):
        raise TraceError(f"{fz}() reduces each row of a float array; got {ops[0]!r} (convert with x.astype(np.float32))")
    return tracer.emit(f"{fz}({', '.join(o.read for o in ops)})", ops[0].type, True)


ROW_METHODS = {name: _row_reduction(name, f"row_{name}") for name in ("sum", "mean", "max", "min", "var")}

# np.<function> (not a ufunc) -> what it does on traced values.
NUMPY_FUNCTIONS = {"where": _np_where, "clip": _np_clip, "round": _np_round, "around": _np_round,
                   "astype": lambda x, dtype, **_: cast(x, dtype), **ROW_METHODS,
                   "amax": ROW_METHODS["max"], "amin": ROW_METHODS["min"]}


def _numpy_function(shown: str, table: dict, name: str):
    found = table.get(name)
    if found is None:
        supported = sorted(f"np.{n}" for n in (*NUMPY_UFUNCS, *NUMPY_FUNCTIONS))
        raise TraceError(f"{shown} is not supported inside @fusec.jit (fusec compiles elementwise operations); "
                         f"supported: {', '.join(supported)}, and x.astype(dtype)")
    return found


# fusec.<name>: the .fz builtins by their .fz names (min, max and pow as fmin, fmax and power),
# and NumPy's names with NumPy's meaning.
FUNCTIONS = {name: _fz(name, b.arity) for name, b in BUILTINS.items() if name not in ("min", "max", "pow")}
FUNCTIONS.update({"arctan2": _fz("atan2", 2), "fmax": _fz("max", 2), "fmin": _fz("min", 2),
                  "maximum": maximum, "minimum": minimum, "where": where, "clip": clip, "power": power})
FUNCTIONS.update({name: functools.partial(_row_call, name) for name in ROW_REDUCTIONS})


# ---- the traced program

def signature_of(value) -> tuple:
    """An array's dtype and which of its dims are 1; a scalar's kind (Python) or dtype (NumPy)."""
    if isinstance(value, (bool, np.bool_)):
        return ("scalar", "bool")
    if isinstance(value, np.generic):
        return ("scalar", fz_type(value.dtype).name)
    if isinstance(value, int):
        return ("scalar", "int")
    if isinstance(value, float):
        return ("scalar", "float")
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        raise TraceError(f"cannot pass a {type(value).__name__} to a @fusec.jit function (arrays and numbers only)")
    if len(shape) == 0:
        raise TraceError("a 0-d array cannot be passed to a @fusec.jit function; pass a number (x.item()) or a "
                         "1-element array")
    return ("array", fz_type(dtype).name, tuple(int(d) == 1 for d in shape))


def quick_key(value) -> tuple:
    """What `signature_of(value)` depends on, cheaper to compute: the type; an array's dtype and 1-dims."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value)
    return type(value), value.dtype, tuple(int(d) == 1 for d in shape)


def trace_source(name: str, key: tuple, run) -> str:
    """The .fz pipeline that `run(values)` computes, called with one traced value per
    argument of `key` ((name, signature_of(value)) each), `name` the function's."""
    tracer = Tracer()
    params, inputs = _parameters(tracer, key)
    return _program(tracer, name, params, _returned(name, run(inputs)))


def _parameters(tracer: Tracer, key: tuple) -> tuple[list[str], list[Traced]]:
    """Declarations of the pipeline's parameters, and the values the function is called with."""
    float_arrays = [BY_NAME[sig[1]] for _, sig in key if sig[0] == "array" and BY_NAME[sig[1]].is_float]
    # A Python float is weak: it takes the arrays' float type, and is carried as that type computes.
    float_type = functools.reduce(promote, float_arrays, float_arrays[0]).compute if float_arrays else F32
    params, inputs = [], []
    for name, sig in key:
        fz_name = tracer.fresh(name)
        if sig[0] == "array":
            t = BY_NAME[sig[1]]
            dims = ", ".join("1" if one else tracer.fresh(f"{fz_name}_{j}") for j, one in enumerate(sig[2]))
            params.append(f"{fz_name}: {t}[{dims}]")
            inputs.append(Traced(tracer, fz_name, t, True, narrow=t.compute != t))
            continue
        declared = {"float": float_type, "int": I32}.get(sig[1]) or BY_NAME[sig[1]]
        params.append(f"{fz_name}: {declared}")
        nominal = WEAK_FLOAT if sig[1] == "float" else declared
        inputs.append(Traced(tracer, fz_name, nominal, False, narrow=declared.compute != declared))
    return params, inputs


def _returned(fn_name: str, result) -> list[Traced]:
    results = result if isinstance(result, (tuple, list)) else (result,)
    for k, r in enumerate(results):
        if not isinstance(r, Traced) or not r.is_array:
            shown = "a scalar expression" if isinstance(r, Traced) else type(r).__name__
            raise TraceError(f"{fn_name} must return arrays computed from its array arguments "
                             f"(result {k} is {shown})")
    return list(results)


def _program(tracer: Tracer, fn_name: str, params: list[str], outs: list[Traced]) -> str:
    name = _identifier(fn_name)
    head = f"pipeline {name}({', '.join(params)})"
    body = [s.render({}) for s in tracer.statements]
    # The outputs' shapes are what the checker infers for the returned values; their
    # types are the nominal ones (f16 where the values were carried in f32).
    draft = check_source(Source(f"<traced {fn_name}>", f"{head} {{\n" + "\n".join(body) + "\n}\n"))
    slots = {s.name: s for s in draft.pipelines[0].slots}
    decls, rename, copies = [], {}, []
    for k, r in enumerate(outs):
        slot = slots[r.text]
        out = tracer.fresh(f"out{k}")
        decls.append(f"{out}: {r.type}[{', '.join(str(d) for d in slot.shape)}]")
        # The statement that made a temp writes the output directly, unless later statements
        # must read the unrounded value.
        if slot.role == "temp" and r.text not in rename and (slot.type == r.type or not _read(tracer, r.text)):
            rename[r.text] = out
        else:
            copies.append(Statement(out, rename.get(r.text, r.text), ""))
    text = "\n".join(s.render(rename) for s in tracer.statements + copies)
    return f"{head} -> ({', '.join(decls)}) {{\n{text}\n}}\n"


def _read(tracer: Tracer, name: str) -> bool:
    pattern = re.compile(rf"\b{name}\b")
    return any(pattern.search(s.expr) for s in tracer.statements)


def _identifier(name: str) -> str:
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "traced"
    text = text if not text[0].isdigit() else "_" + text
    return text + "_" if text in RESERVED else text
