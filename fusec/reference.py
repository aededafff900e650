"""The NumPy reference interpreter: the oracle for every other backend.

It runs the checked IR statement by statement, exactly as the README's
semantics say: f16/bf16 are computed in f32 and rounded when stored, integer
arithmetic wraps, integer division truncates (x / 0 == 0), float -> int casts
truncate and saturate (NaN -> 0), min/max ignore a NaN operand, round is half
to even. It shares no code with lowering, fusion or emission.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from fusec.ir.launch import call_signature
from fusec.ir.program import COLUMN_CHUNKS, COLUMN_OPS, Apply, Body, Pipeline, Program, Repeat, reduced_shape
from fusec.runtime.binder import Binder, allocate, concrete
from fusec.runtime.host_arrays import HostArrays
from fusec.types import INT_RANGE, ScalarType


def numpy_dtype(t: ScalarType) -> np.dtype:
    return t.numpy_dtype


def compute_dtype(t: ScalarType) -> np.dtype:
    return t.compute.numpy_dtype


@functools.lru_cache(maxsize=64)
def _binder(program: Program, name: str) -> Binder:
    return Binder(call_signature(program.pipeline(name)), HostArrays("the numpy backend"))


def _int_div(a, b):
    """C division: truncation toward zero; x / 0 == 0; MIN / -1 wraps."""
    safe = np.where((b == 0) | (b == -1) if np.issubdtype(b.dtype, np.signedinteger) else b == 0, 1, b)
    q = a // safe
    q = q + (((a % safe) != 0) & ((a < 0) != (safe < 0))).astype(q.dtype)
    q = np.where(b == 0, 0, q)
    if np.issubdtype(b.dtype, np.signedinteger):
        q = np.where(b == -1, -a, q)  # -a wraps for MIN, as in two's complement
    return q.astype(a.dtype)


def _int_mod(a, b):
    """C remainder (sign of the dividend); x % 0 == 0."""
    safe = np.where(b == 0, 1, b)
    if np.issubdtype(b.dtype, np.signedinteger):
        safe = np.where(b == -1, 1, safe)
    r = np.fmod(a, safe)
    return np.where(b == 0, 0, r).astype(a.dtype)


def _int_pow(a, b):
    """Integer power by squaring, wrapping; a negative exponent gives 0 unless |a| == 1."""
    a, b = np.broadcast_arrays(a, b)
    result = np.ones_like(a)
    base = a.copy()
    e = b.astype(np.int64) if np.issubdtype(b.dtype, np.signedinteger) else b.astype(np.uint64)
    neg = e < 0
    e = np.where(neg, 0, e)
    for _ in range(64):
        if not np.any(e):
            break
        result = np.where(e & 1, result * base, result)
        base = base * base
        e = e >> 1
    if np.any(neg):
        inverse = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
        result = np.where(neg, inverse, result)
    return result.astype(a.dtype)


def cast(value: np.ndarray, src: ScalarType, dst: ScalarType) -> np.ndarray:
    """Conversion of a computed value (in src's compute type) to dst, in dst's compute type."""
    value = np.asarray(value)
    if dst.is_bool:
        return value != 0
    if dst.is_int and src.is_float:
        lo, hi = INT_RANGE[dst]
        with np.errstate(invalid="ignore"):
            t = np.trunc(value.astype(np.float64))
            clipped = np.where(t <= lo, lo, np.where(t >= hi, hi, np.where(np.isnan(t), 0, t)))
        # float64 cannot hold every i64; the bounds are exact as Python ints
        out = np.empty(value.shape, numpy_dtype(dst))
        out[...] = clipped if dst.bits < 64 else np.where(t >= hi, 0, clipped)
        if dst.bits == 64:
            out[t >= hi] = hi
        return out
    if dst.is_float:
        if dst.name == "bf16" and (src.compute.bits == 64 or (src.is_int and src.bits >= 32)):
            value = _f32_round_to_odd(_f64_round_to_odd(value) if src.is_int else value.astype(np.float64))
        # round through the storage type (f16/bf16), compute in f32
        return value.astype(numpy_dtype(dst)).astype(compute_dtype(dst))
    return value.astype(numpy_dtype(dst))


# ml_dtypes converts to bf16 through f32, which rounds twice from a source wider
# than f32's 24 bits. Rounding to odd in the wider steps (the last bit set when
# anything was dropped) keeps the final rounding to nearest even exact
# (Boldo and Melquiond, "When double rounding is odd", 2005). NumPy's f64 -> f16
# is direct, and an integer beyond f32's 24 bits is beyond f16's range.
def _f32_round_to_odd(x: np.ndarray) -> np.ndarray:
    """f64 -> f32, truncated toward zero with the last bit set if inexact."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = np.asarray(x.astype(np.float32))
        back = f.astype(np.float64)
    inexact = (back != x) & ~np.isnan(x)
    away = inexact & (np.abs(back) > np.abs(x))  # rounded away from zero (to inf, too): step back
    bits = f.view(np.uint32)
    bits = np.where(away, bits - np.uint32(1), bits) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def _f64_round_to_odd(v: np.ndarray) -> np.ndarray:
    """A 64-bit integer -> f64: exact below 2^53; above, its low 11 bits become one sticky bit."""
    with np.errstate(over="ignore"):
        mag = v.astype(np.uint64)
        if np.issubdtype(v.dtype, np.signedinteger):
            mag = np.where(v < 0, np.uint64(0) - mag, mag)  # |MIN| too
    sticky = ((mag & np.uint64(0x7FF)) != 0).astype(np.uint64)
    odd = ((mag >> np.uint64(11)) | sticky).astype(np.float64) * 2048.0
    mag_f = np.where(mag >= np.uint64(1 << 53), odd, mag.astype(np.float64))
    return np.where(v < 0, -mag_f, mag_f)


def _erf(x):
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64)), np.float64).astype(x.dtype)


_FLOAT_FUNCS = {
    "sqrt": np.sqrt, "cbrt": np.cbrt, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1,
    "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
    "cosh": np.cosh, "tanh": np.tanh, "erf": _erf, "floor": np.floor, "ceil": np.ceil,
    "round": np.rint, "trunc": np.trunc, "isnan": np.isnan, "isinf": np.isinf,
    "rsqrt": lambda x: x.dtype.type(1) / np.sqrt(x),
    "sigmoid": lambda x: x.dtype.type(1) / (x.dtype.type(1) + np.exp(-x)),
}


def apply_op(op: str, t: ScalarType, args: list[np.ndarray]) -> np.ndarray:
    """One IR operator on NumPy values of compute type `t` (the instruction's type)."""
    is_int = np.issubdtype(args[0].dtype, np.integer) if args else False
    if op in _FLOAT_FUNCS:
        return _FLOAT_FUNCS[op](args[0])
    a = args[0]
    if op == "add":
        return a + args[1]
    if op == "sub":
        return a - args[1]
    if op == "mul":
        return a * args[1]
    if op == "div":
        return _int_div(a, args[1]) if is_int else a / args[1]
    if op == "mod":
        return _int_mod(a, args[1]) if is_int else np.fmod(a, args[1])
    if op == "pow":
        return _int_pow(a, args[1]) if is_int else np.power(a, args[1])
    if op == "neg":
        return -a
    if op == "abs":
        return np.abs(a)
    if op in ("min", "max"):
        f = (np.fmin if op == "min" else np.fmax) if not is_int else (np.minimum if op == "min" else np.maximum)
        return f(a, args[1])
    if op == "clamp":
        lo = apply_op("max", t, [a, args[1]])
        return apply_op("min", t, [lo, args[2]])
    if op == "atan2":
        return np.arctan2(a, args[1])
    if op == "fma":
        wide = np.float64 if a.dtype != np.float64 else np.longdouble
        return (a.astype(wide) * args[1] + args[2]).astype(a.dtype)
    if op == "select":
        return np.where(a, args[1], args[2])
    if op == "not":
        return ~a
    if op in ("and", "or"):
        return (a & args[1]) if op == "and" else (a | args[1])
    compare = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
               "eq": np.equal, "ne": np.not_equal}
    return compare[op](a, args[1])


class Interpreter:
    def __init__(self, program: Program):
        self.program = program

    def run(self, name: str, *args, **kwargs):
        """Runs pipeline `name` on NumPy arrays; returns its outputs (one array or a tuple).
        The call is checked by the binder every backend shares."""
        pipeline = self.program.pipeline(name)
        call = _binder(self.program, name).bind(args, kwargs)
        if call.outputs is not None:
            results, outputs = call.out, call.outputs
        else:  # new arrays of the call's kind (torch tensors for tensors), written through NumPy views
            results, outputs = allocate(call.kind, [(concrete(o.shape, call.dims), numpy_dtype(o.type))
                                                    for o in pipeline.outputs])
        self.execute(pipeline, call.values, outputs, call.dims)
        return results[0] if len(results) == 1 else tuple(results) if results else None

    def execute(self, pipeline: Pipeline, values: list, outputs: list, dims: dict) -> None:
        """Runs `pipeline` on checked values (one per parameter, scalars as Python
        numbers), writing `outputs` and the inout arrays in place."""
        store: dict[str, object] = {}
        for p, value in zip(pipeline.params, values):
            store[p.name] = value if p.is_array else np.asarray(value, compute_dtype(p.type))
        for out, array in zip(pipeline.outputs, outputs):
            store[out.name] = array
        with np.errstate(all="ignore"):
            self._stmts(pipeline, pipeline.body, store, dims)

    def foreach(self, name: str, sets, *scalars, **named_scalars) -> list:
        """The pipeline over each set of arrays (`JitPipeline.foreach` on the numpy
        backend), checked as every backend checks a foreach call."""
        from fusec.runtime.foreach import SetBinder
        pipeline = self.program.pipeline(name)
        scalar_values, calls = SetBinder(_binder(self.program, name)).bind(sets, scalars, named_scalars)
        results = []
        for call in calls:
            made, outputs = allocate(call.kind, [(concrete(o.shape, call.dims), numpy_dtype(o.type))
                                                 for o in pipeline.outputs])
            self.execute(pipeline, call.values, outputs, call.dims)
            results.append(made[0] if len(made) == 1 else tuple(made) if made else None)
        return results

    def _stmts(self, pipeline: Pipeline, stmts, store: dict, dims: dict) -> None:
        for stmt in stmts:
            if isinstance(stmt, Repeat):
                count = stmt.count if isinstance(stmt.count, int) else int(store[stmt.count])
                for _ in range(count):
                    self._stmts(pipeline, stmt.body, store, dims)
            else:
                self._apply(pipeline, stmt, store, dims)

    def _apply(self, pipeline: Pipeline, stmt: Apply, store: dict, dims: dict) -> None:
        def load(name):
            value = store[name]
            return value.astype(compute_dtype(pipeline.slot(name).type)) if value.ndim else value
        results = self.eval_body(stmt.body, load, [])
        shape = concrete(stmt.shape, dims)
        if stmt.reduce in COLUMN_OPS:
            results = [reduce_columns(stmt.reduce, np.broadcast_to(results[0], shape))]
        elif stmt.reduce:
            index = np.broadcast_to(results[1], reduced_shape(stmt.reduce, shape)) if stmt.reduce == "pick" else None
            results = [reduce_rows(stmt.reduce, np.broadcast_to(results[0], shape), index)]
        if stmt.reduce:
            shape = reduced_shape(stmt.reduce, shape)
        for target, value in zip(stmt.targets, results):
            slot = pipeline.slot(target)
            stored = np.broadcast_to(value, shape).astype(numpy_dtype(slot.type))
            if slot.role in ("inout", "out"):
                store[target][...] = stored  # in place, as the kernels write
            else:
                store[target] = stored

    def eval_body(self, body: Body, load, args: list) -> list[np.ndarray]:
        vals: list[np.ndarray] = []
        for ins in body.instrs:
            operands = [vals[i] for i in ins.args]
            if ins.op == "const":
                vals.append(np.asarray(ins.attr, compute_dtype(ins.type)))
            elif ins.op == "load":
                vals.append(load(ins.attr))
            elif ins.op == "arg":
                vals.append(args[ins.attr])
            elif ins.op == "position":  # the place along the last axis (row_position; never a broadcast 1)
                vals.append(np.arange(operands[0].shape[-1], dtype=np.int64))
            elif ins.op == "cast":
                src = body.instrs[ins.args[0]].type
                vals.append(cast(operands[0], src, ins.type))
            elif ins.op == "call":
                stage_name, index = ins.attr
                stage = self.program.stage(stage_name)
                vals.append(self.eval_body(stage.body, None, operands)[index])
            else:
                vals.append(np.asarray(apply_op(ins.op, ins.type, operands)))
        return [vals[i] for i in body.results]


def reduce_columns(op: str, x: np.ndarray) -> np.ndarray:
    """A column reduction of `x` (f32 or f64) over its first axis, in the order
    ir.program.COLUMN_CHUNKS fixes: "col_partial" the sums of COLUMN_CHUNKS runs of
    consecutive rows, each added up in order from 0; "col_sum" all rows added up in
    order (over such chunks: the chunks' sums in order). Each addition rounds once,
    as each of a GPU thread's does."""
    rows = x.shape[0]
    chunks = COLUMN_CHUNKS if op == "col_partial" else 1
    per = -(-rows // chunks)
    out = np.zeros((chunks,) + x.shape[1:], x.dtype)
    with np.errstate(all="ignore"):
        for step in range(per):  # the step-th row of every chunk at once
            first = np.arange(chunks) * per + step
            inside = first < rows
            out[inside] = out[inside] + x[first[inside]]
    return out if op == "col_partial" else out[0]


def reduce_rows(op: str, x: np.ndarray, index: np.ndarray | None = None) -> np.ndarray:
    """A row reduction over the last axis of `x` (f32 or f64, the accumulation
    type), keeping it as a length-1 axis. NaN propagates through every one; an
    empty row gives the identity (sum 0, max -inf, min inf) or NaN (mean, var)."""
    length = x.shape[-1]
    t = x.dtype.type
    with np.errstate(all="ignore"):
        if op == "sum":
            return np.sum(x, axis=-1, keepdims=True, dtype=x.dtype)
        if op == "mean":
            return np.sum(x, axis=-1, keepdims=True, dtype=x.dtype) / t(length)
        if op == "max":
            return np.max(x, axis=-1, keepdims=True, initial=-np.inf)
        if op == "min":
            return np.min(x, axis=-1, keepdims=True, initial=np.inf)
        if op == "var":  # two passes: the mean, then the mean squared deviation from it
            mean = np.sum(x, axis=-1, keepdims=True, dtype=x.dtype) / t(length)
            return np.sum((x - mean) * (x - mean), axis=-1, keepdims=True, dtype=x.dtype) / t(length)
        if op == "logsumexp":  # shifted by the row's max; an infinite or NaN max is the result
            m = np.max(x, axis=-1, keepdims=True, initial=-np.inf)
            finite = np.isfinite(m)
            shifted = np.sum(np.exp(x - np.where(finite, m, t(0))), axis=-1, keepdims=True, dtype=x.dtype)
            return np.where(finite, m + np.log(shifted), m).astype(x.dtype)
        if op == "length":  # the row's length, from the shape alone
            return np.full(x.shape[:-1] + (1,), length, x.dtype)
        if op == "pick":  # each row's element at its index; 0 where the index is outside the row
            idx = index.astype(np.int64)
            inside = (idx >= 0) & (idx < length)
            picked = np.take_along_axis(x, np.where(inside, idx, 0), axis=-1) if length else np.zeros_like(idx, x.dtype)
            return np.where(inside, picked, t(0)).astype(x.dtype)
    raise ValueError(f"unknown row reduction {op!r}")


def walk_repeats(stmts):
    for stmt in stmts:
        if isinstance(stmt, Repeat):
            yield stmt
            yield from walk_repeats(stmt.body)


def run(program: Program, name: str, *args, **kwargs):
    return Interpreter(program).run(name, *args, **kwargs)
