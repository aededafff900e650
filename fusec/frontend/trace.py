"""`@fusec.jit` on a Python function: tracing into a .fz pipeline.

The function runs once per argument signature (each array's dtype and ndim,
and which of its dims are 1; each scalar's kind) on `Traced` values that
record every array operation as one .fz statement, i.e. one stage of the
unfused form. The recorded program goes through the same front end as a
.fz file. Python control flow on array values cannot be traced and raises
`TraceError`; use `fusec.where`.
"""
from __future__ import annotations

import math
import re

import numpy as np

from fusec.errors import Source
from fusec.frontend import check_source
from fusec.types import ALL, BY_NAME, F32, from_dtype, promote

KEYWORDS = {"stage", "pipeline", "let", "return", "repeat", "inout", "pi", "e", "inf", "nan", "true", "false"}


class TraceError(TypeError):
    """A Python function that cannot be traced into a pipeline."""


def _fz_type(dtype) -> str:
    """The .fz type of a NumPy, CuPy or PyTorch dtype."""
    found = from_dtype(dtype)
    if found is None:
        raise TraceError(f"dtype {dtype} is not supported by fusec")
    return found.name


class Traced:
    """A value during tracing: an array (a .fz name) or a scalar expression (text)."""

    __slots__ = ("tracer", "text", "kind", "is_array")
    __array_priority__ = 1000  # NumPy defers to these operators

    def __init__(self, tracer: "Tracer", text: str, kind: str, is_array: bool):
        self.tracer, self.text, self.kind, self.is_array = tracer, text, kind, is_array

    # arithmetic
    def __add__(self, o): return self.tracer.binary("+", self, o)
    def __radd__(self, o): return self.tracer.binary("+", o, self)
    def __sub__(self, o): return self.tracer.binary("-", self, o)
    def __rsub__(self, o): return self.tracer.binary("-", o, self)
    def __mul__(self, o): return self.tracer.binary("*", self, o)
    def __rmul__(self, o): return self.tracer.binary("*", o, self)
    def __truediv__(self, o): return self.tracer.binary("/", self, o)
    def __rtruediv__(self, o): return self.tracer.binary("/", o, self)
    def __mod__(self, o): return self.tracer.binary("%", self, o)
    def __rmod__(self, o): return self.tracer.binary("%", o, self)
    def __pow__(self, o): return self.tracer.binary("**", self, o)
    def __rpow__(self, o): return self.tracer.binary("**", o, self)
    def __neg__(self): return self.tracer.unary("-", self)
    def __pos__(self): return self
    def __abs__(self): return call("abs", self)
    # comparisons and logic (on bools)
    def __lt__(self, o): return self.tracer.binary("<", self, o)
    def __le__(self, o): return self.tracer.binary("<=", self, o)
    def __gt__(self, o): return self.tracer.binary(">", self, o)
    def __ge__(self, o): return self.tracer.binary(">=", self, o)
    def __eq__(self, o): return self.tracer.binary("==", self, o)  # type: ignore[override]
    def __ne__(self, o): return self.tracer.binary("!=", self, o)  # type: ignore[override]
    def __and__(self, o): return self.tracer.binary("&&", self, o)
    def __rand__(self, o): return self.tracer.binary("&&", o, self)
    def __or__(self, o): return self.tracer.binary("||", self, o)
    def __ror__(self, o): return self.tracer.binary("||", o, self)
    def __invert__(self): return self.tracer.unary("!", self)
    __hash__ = None

    def astype(self, dtype) -> "Traced":
        return call(_fz_type(np.dtype(dtype)) if not isinstance(dtype, str) or dtype not in _TYPE_NAMES
                    else dtype, self)

    def __floordiv__(self, o):
        raise TraceError("`//` floors, which fusec does not offer; use fusec.floor(a / b) for floats")

    __rfloordiv__ = __floordiv__

    def __bool__(self):
        raise TraceError("Python control flow (if, while, and, or, not, min(), max()) cannot depend on an array "
                         "value inside @fusec.jit; use fusec.where(cond, a, b), fusec.maximum or & and |")

    def _no(self, *_):
        raise TraceError("an array value cannot become a Python number or be iterated inside @fusec.jit")

    __float__ = __int__ = __index__ = __len__ = __iter__ = _no


_TYPE_NAMES = {t.name for t in ALL}


def _literal(value) -> tuple[str, str]:
    """A Python number as .fz text, and its kind."""
    if isinstance(value, (bool, np.bool_)):
        return ("true" if value else "false"), "bool"
    if isinstance(value, (int, np.integer)):
        return (f"({int(value)})" if value < 0 else str(int(value))), "weak_int"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return "nan", "weak_float"
        if math.isinf(value):
            return ("(-inf)" if value < 0 else "inf"), "weak_float"
        text = repr(value)
        return (f"({text})" if value < 0 else text), "weak_float"
    raise TraceError(f"cannot use a {type(value).__name__} inside @fusec.jit (numbers and arrays only)")


def _kind(*kinds: str) -> str:
    """The kind of a result, as the checker's promotion rules would give it."""
    strong = [k for k in kinds if not k.startswith("weak")]
    if "float" in strong:
        return "float"
    if "weak_float" in kinds:
        return "float" if strong else "weak_float"
    return strong[0] if strong else "weak_int"


class Tracer:
    def __init__(self):
        self.stmts: list[str] = []
        self.taken: set[str] = set()

    def operand(self, value) -> Traced:
        if isinstance(value, Traced):
            if value.tracer is not self:
                raise TraceError("a traced value escaped from another @fusec.jit call")
            return value
        text, kind = _literal(value)
        return Traced(self, text, kind, False)

    def emit(self, text: str, kind: str, is_array: bool) -> Traced:
        """An array operation is one statement (one stage); a scalar one stays inline text."""
        if not is_array:
            return Traced(self, f"({text})", kind, False)
        name = f"t{len(self.stmts)}"
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        self.stmts.append(f"    {name} = {text};")
        return Traced(self, name, kind, True)

    def binary(self, op: str, a, b) -> Traced:
        a, b = self.operand(a), self.operand(b)
        if op == "/" and a.kind in ("int", "weak_int") and b.kind in ("int", "weak_int"):
            raise TraceError("integer / integer truncates in fusec (as in C), unlike Python; cast one side first "
                             "(x.astype('f32') / y) or say so with fusec.trunc(...)")
        if op in ("<", "<=", ">", ">=", "==", "!=", "&&", "||"):
            kind = "bool"
        else:
            kind = _kind(a.kind, b.kind)
        return self.emit(f"{a.text} {op} {b.text}", kind, a.is_array or b.is_array)

    def unary(self, op: str, a: Traced) -> Traced:
        return self.emit(f"{op}{a.text}", a.kind, a.is_array)


def call(func: str, *args) -> Traced:
    tracers = [a.tracer for a in args if isinstance(a, Traced)]
    if not tracers:
        raise TraceError(f"fusec.{func}() works on traced values inside a @fusec.jit function")
    tracer = tracers[0]
    ops = [tracer.operand(a) for a in args]
    kinds = [o.kind for o in ops]
    if func in _TYPE_NAMES:
        kind = "float" if func.startswith(("f", "bf")) else "bool" if func == "bool" else "int"
    elif func in ("isnan", "isinf"):
        kind = "bool"
    elif func == "where":
        kind = _kind(*kinds[1:])
    else:
        kind = _kind(*kinds)
        if func not in ("abs", "min", "max", "clamp", "floor", "ceil", "round", "trunc") and kind != "float":
            kind = "float"
    text = f"{func}({', '.join(o.text for o in ops)})"
    return tracer.emit(text, kind, any(o.is_array for o in ops))


def trace_source(fn, names: list[str], key: tuple) -> str:
    """The .fz pipeline `fn` computes for arguments named `names` with signatures `key` (`signature_of`)."""
    fn_name = getattr(fn, "__name__", "traced")
    tracer = Tracer()
    float_type = _scalar_float_type([k[1] for k in key if k[0] == "array"])
    params, inputs = [], []
    for name, sig in zip(names, key):
        fz_name = name + "_" if name in KEYWORDS else name
        tracer.taken.add(fz_name)
        if sig[0] == "array":
            _, type_name, ones = sig
            dims = ", ".join("1" if one else f"{fz_name}_{j}" for j, one in enumerate(ones))
            params.append(f"{fz_name}: {type_name}[{dims}]")
            kind = "float" if type_name.startswith(("f", "bf")) else "bool" if type_name == "bool" else "int"
            inputs.append(Traced(tracer, fz_name, kind, True))
        else:
            type_name = {"float": float_type, "int": "i32", "bool": "bool"}.get(sig[1], sig[1])
            params.append(f"{fz_name}: {type_name}")
            kind = "float" if type_name.startswith(("f", "bf")) else "bool" if type_name == "bool" else "int"
            inputs.append(Traced(tracer, fz_name, kind, False))
    result = fn(*inputs)
    results = result if isinstance(result, tuple) else (result,)
    outs = []
    for k, r in enumerate(results):
        if not isinstance(r, Traced) or not r.is_array:
            raise TraceError(f"{fn_name} must return arrays computed from its array arguments "
                             f"(result {k} is {'a scalar expression' if isinstance(r, Traced) else type(r).__name__})")
        outs.append(r)
    name = _identifier(fn_name)
    head = f"pipeline {name}({', '.join(params)})"
    body = list(tracer.stmts)
    # The outputs' types and shapes are what the checker infers for the returned values.
    draft = check_source(Source(f"<traced {fn_name}>", f"{head} {{\n" + "\n".join(body) + "\n}\n"))
    slots = {s.name: s for s in draft.pipelines[0].slots}
    decls, renamed = [], {}
    for k, r in enumerate(outs):
        slot = slots[r.text]
        out = f"out{k}"
        while out in tracer.taken:
            out += "_"
        decls.append(f"{out}: {slot.type}[{', '.join(str(d) for d in slot.shape)}]")
        if slot.role == "temp" and r.text not in renamed:
            renamed[r.text] = out  # the statement that made it writes the output directly
        else:
            body.append(f"    {out} = {renamed.get(r.text, r.text)};")
    text = "\n".join(body)
    for temp, out in renamed.items():
        text = re.sub(rf"\b{temp}\b", out, text)
    return f"{head} -> ({', '.join(decls)}) {{\n{text}\n}}\n"


def _scalar_float_type(array_types: list[str]) -> str:
    """A Python float argument acts like a weak literal: it takes the arrays' float type."""
    floats = [BY_NAME[t] for t in array_types if BY_NAME[t].is_float]
    result = floats[0] if floats else F32
    for t in floats[1:]:
        result = promote(result, t)
    return result.name


def _identifier(name: str) -> str:
    text = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "traced"
    text = text if not text[0].isdigit() else "_" + text
    return text + "_" if text in KEYWORDS else text


def signature_of(value) -> tuple:
    if isinstance(value, (bool, np.bool_)):
        return ("scalar", "bool")
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.integer):
        return ("scalar", "int")
    if isinstance(value, float):
        return ("scalar", "float")
    if isinstance(value, (np.integer, np.floating)):
        return ("scalar", _fz_type(value.dtype))
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        raise TraceError(f"cannot pass a {type(value).__name__} to a @fusec.jit function (arrays and numbers only)")
    return ("array", _fz_type(dtype), tuple(int(d) == 1 for d in shape))


# The math functions a traced function may call, NumPy's names where they differ.
def _make(name: str, fz: str, arity: int):
    def fn(*args):
        if len(args) != arity:
            raise TypeError(f"fusec.{name}() takes {arity} argument{'s' if arity > 1 else ''}, got {len(args)}")
        return call(fz, *args)
    fn.__name__ = name
    fn.__doc__ = f"`{fz}` of the .fz language, inside a @fusec.jit function."
    return fn


_UNARY = ("sqrt rsqrt cbrt exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh "
          "sigmoid erf floor ceil round trunc isnan isinf abs").split()
FUNCTIONS = {name: _make(name, name, 1) for name in _UNARY}
FUNCTIONS.update({
    "maximum": _make("maximum", "max", 2), "minimum": _make("minimum", "min", 2),
    "atan2": _make("atan2", "atan2", 2), "arctan2": _make("arctan2", "atan2", 2),
    "power": _make("power", "pow", 2), "fma": _make("fma", "fma", 3), "where": _make("where", "where", 3),
    "clip": _make("clip", "clamp", 3), "clamp": _make("clamp", "clamp", 3),
})


def cast(x, dtype) -> Traced:
    """`x` converted to dtype (a .fz type name such as "f16", or a NumPy dtype)."""
    name = dtype if isinstance(dtype, str) and dtype in _TYPE_NAMES else _fz_type(np.dtype(dtype))
    return call(name, x)
