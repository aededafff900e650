"""The peers a user would pick instead of fusec, generated from the IR.

`peer_function(graph, ops)` runs a pipeline's stage graph with one array
library's operations, stage by stage: PyTorch (eager, or under
torch.compile), CuPy (under cupy.fuse) or NumPy (the CPU check of the CuPy
peer). The same semantics as the reference where the library allows: f16 and
bf16 computed in f32 and rounded at each stage's store.
"""
from __future__ import annotations

from fusec.ir.program import COLUMN_CHUNKS, COLUMN_OPS
from fusec.ir.stages import StageGraph
from fusec.types import ScalarType


class Unsupported(Exception):
    """This peer cannot express this pipeline (an op or type it lacks)."""


# IR op -> attribute of the library namespace (NumPy and CuPy spell them alike).
_XP_FUNCS = {
    "sqrt": "sqrt", "cbrt": "cbrt", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
    "log10": "log10", "log1p": "log1p", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "arcsin",
    "acos": "arccos", "atan": "arctan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "floor": "floor",
    "ceil": "ceil", "round": "rint", "trunc": "trunc", "abs": "abs", "isnan": "isnan", "isinf": "isinf",
    "atan2": "arctan2", "pow": "power", "mod": "fmod", "lt": "less", "le": "less_equal", "gt": "greater",
    "ge": "greater_equal", "eq": "equal", "ne": "not_equal", "and": "logical_and", "or": "logical_or",
    "not": "logical_not", "select": "where",
}
_TORCH_FUNCS = {
    "sqrt": "sqrt", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
    "log10": "log10", "log1p": "log1p", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos",
    "atan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "floor": "floor", "ceil": "ceil",
    "round": "round", "trunc": "trunc", "abs": "abs", "isnan": "isnan", "isinf": "isinf", "atan2": "atan2",
    "pow": "pow", "mod": "fmod", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne",
    "and": "logical_and", "or": "logical_or", "not": "logical_not", "select": "where", "sigmoid": "sigmoid",
    "erf": "erf", "rsqrt": "rsqrt",
}


class XpOps:
    """NumPy or CuPy (a module with NumPy's names)."""

    def __init__(self, xp, erf=None):
        self.xp = xp
        self.erf = erf

    def dtype(self, t: ScalarType):
        return t.numpy_dtype

    def load(self, a, t: ScalarType):
        return a.astype(self.dtype(t.compute)) if t.compute != t else a

    def store(self, v, t: ScalarType):
        return v.astype(self.dtype(t)) if hasattr(v, "astype") else self.xp.asarray(v, self.dtype(t))

    def cast(self, v, src: ScalarType, dst: ScalarType):
        if dst.is_bool:
            return v != 0
        out = v.astype(self.dtype(dst))
        return out.astype(self.dtype(dst.compute)) if dst.compute != dst else out

    def op(self, name: str, t: ScalarType, args):
        xp = self.xp
        if name in ("add", "sub", "mul", "neg"):
            return _arith(name, args)
        if name == "div":
            if t.is_int:
                raise Unsupported("integer division (C truncation)")
            return args[0] / args[1]
        if name in ("min", "max", "clamp"):
            lo, hi = (xp.fmin, xp.fmax) if t.is_float else (xp.minimum, xp.maximum)
            if name == "clamp":
                return lo(hi(args[0], args[1]), args[2])
            return (lo if name == "min" else hi)(args[0], args[1])
        if name == "sigmoid":
            return 1 / (1 + xp.exp(-args[0]))
        if name == "rsqrt":
            return 1 / xp.sqrt(args[0])
        if name == "fma":
            return args[0] * args[1] + args[2]
        if name == "erf":
            if self.erf is None:
                raise Unsupported("erf")
            return self.erf(args[0])
        if name == "pow" and t.is_int:
            raise Unsupported("integer power")
        return getattr(xp, _XP_FUNCS[name])(*args)

    def assign(self, target, value):
        target[...] = value

    def reduce(self, op: str, x, index=None):
        """A row reduction over the last axis, kept as a length-1 axis (the reference's
        meaning), or a column reduction over the first (`column_sums`)."""
        xp = self.xp
        if op in COLUMN_OPS:
            return column_sums(op, x, lambda rows: xp.zeros((rows,) + x.shape[1:], x.dtype),
                               lambda parts: xp.concatenate(parts))
        if op == "length":
            return xp.full(x.shape[:-1] + (1,), x.shape[-1], x.dtype)
        if op == "logsumexp":
            m = x.max(-1, keepdims=True)
            finite = xp.isfinite(m)
            return xp.where(finite, m + xp.log(xp.exp(x - xp.where(finite, m, 0)).sum(-1, keepdims=True)), m)
        if op == "pick":
            inside = (index >= 0) & (index < x.shape[-1])
            picked = xp.take_along_axis(x, xp.where(inside, index, 0).astype(xp.int64), axis=-1)
            return xp.where(inside, picked, 0)
        return getattr(x, op)(-1, keepdims=True)  # sum, mean, max, min, var (population)


def column_sums(op: str, x, zeros, concatenate):
    """A column reduction as an array library sums it: "col_sum" the sum over the
    first axis; "col_partial" the sums of the COLUMN_CHUNKS runs of rows the
    reference's order fixes (the rows padded with zeros to whole runs)."""
    if op == "col_sum":
        return x.sum(0)
    rows = x.shape[0]
    per = -(-rows // COLUMN_CHUNKS)
    padded = concatenate([x, zeros(COLUMN_CHUNKS * per - rows)])
    return padded.reshape((COLUMN_CHUNKS, per) + tuple(x.shape[1:])).sum(1)


class TorchOps:
    def __init__(self, torch):
        self.torch = torch

    def dtype(self, t: ScalarType):
        if t.name in ("u16", "u32", "u64"):  # torch has the dtypes but few operations on them
            raise Unsupported(f"{t} tensors")
        return getattr(self.torch, t.torch)

    def load(self, a, t: ScalarType):
        return a.to(self.dtype(t.compute)) if t.compute != t else a

    def store(self, v, t: ScalarType):
        return v.to(self.dtype(t)) if isinstance(v, self.torch.Tensor) else self.torch.tensor(v, dtype=self.dtype(t))

    def cast(self, v, src: ScalarType, dst: ScalarType):
        if dst.is_bool:
            return v != 0
        out = v.to(self.dtype(dst))
        return out.to(self.dtype(dst.compute)) if dst.compute != dst else out

    def op(self, name: str, t: ScalarType, args):
        torch = self.torch
        if name in ("add", "sub", "mul", "neg"):
            return _arith(name, args)
        if name == "div":
            return torch.div(args[0], args[1], rounding_mode="trunc") if t.is_int else args[0] / args[1]
        if name in ("min", "max", "clamp"):
            lo, hi = (torch.fmin, torch.fmax) if t.is_float else (torch.minimum, torch.maximum)
            args = [a if isinstance(a, torch.Tensor) else torch.tensor(a) for a in args]
            if name == "clamp":
                return lo(hi(args[0], args[1]), args[2])
            return (lo if name == "min" else hi)(args[0], args[1])
        if name == "cbrt":
            return torch.sign(args[0]) * torch.abs(args[0]).pow(1 / 3)
        if name == "fma":
            return args[0] * args[1] + args[2]
        if name == "sigmoid":
            return 1 / (1 + torch.exp(-args[0]))  # the reference's formula, not torch's
        if name == "pow" and t.is_int:
            raise Unsupported("integer power")
        if name in ("atan2", "pow", "mod", "select") or name in ("lt", "le", "gt", "ge", "eq", "ne"):
            args = [a if isinstance(a, torch.Tensor) else torch.tensor(a) for a in args]
        return getattr(torch, _TORCH_FUNCS[name])(*args)

    def assign(self, target, value):
        target.copy_(value)

    def reduce(self, op: str, x, index=None):
        """A row reduction as PyTorch users write it (a column reduction: `column_sums`)."""
        torch = self.torch
        if op in COLUMN_OPS:
            return column_sums(op, x, lambda rows: x.new_zeros((rows,) + tuple(x.shape[1:])), torch.cat)
        if op == "pick":
            inside = (index >= 0) & (index < x.shape[-1])
            picked = torch.gather(x, -1, torch.where(inside, index, 0).to(torch.int64).expand(*x.shape[:-1], 1))
            return torch.where(inside, picked, torch.zeros((), dtype=x.dtype, device=x.device))
        if op == "var":
            return torch.var(x, -1, keepdim=True, unbiased=False)
        if op == "length":
            return x.new_full((*x.shape[:-1], 1), x.shape[-1])
        fn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin, "logsumexp": torch.logsumexp}
        return fn[op](x, -1, keepdim=True)


def _arith(name, args):
    if name == "neg":
        return -args[0]
    a, b = args
    return a + b if name == "add" else a - b if name == "sub" else a * b


def check_supported(graph: StageGraph, ops) -> None:
    """Raises Unsupported before timing if the peer lacks something the pipeline needs."""
    for value in graph.values:
        if hasattr(ops, "torch"):
            ops.dtype(value.type)
    for stage in graph.stages:
        for ins in stage.body.instrs:
            if ins.op == "div" and ins.type.is_int and not hasattr(ops, "torch"):
                raise Unsupported("integer division (C truncation)")
            if ins.op == "erf" and getattr(ops, "erf", True) is None:
                raise Unsupported("erf")
            if ins.op == "pow" and ins.type.is_int:
                raise Unsupported("integer power")


def peer_function(graph: StageGraph, ops, param_names: list[str], in_place: bool = True):
    """A Python function of the pipeline's parameters: each stage one expression
    of library calls. In place (`inout` arrays updated, outputs returned), or
    out of place (every result returned, inout values last), for cupy.fuse."""
    stages = graph.stages
    inout_results = [(v, graph.value(v).buffer) for v in graph.results if graph.value(v).role == "inout"]
    output_results = [v for v in graph.results if graph.value(v).role == "out"]
    types = {v.name: v.type for v in graph.values}
    loops = list(graph.loops)

    def run(*args):
        env = dict(zip(param_names, args))
        for name in param_names:
            if types[name].compute != types[name] and graph.value(name).shape is not None:
                env[name] = ops.load(env[name], types[name])  # scalars are Python numbers already
        position, pending = 0, 0  # the next stage, and the next loop (loops are in program order)
        while position < len(stages) or pending < len(loops):
            if pending < len(loops) and loops[pending].start == position:
                loop = loops[pending]
                pending += 1
                for (loop_value, _), entry in zip(loop.carried, loop.entries):
                    if entry in env:  # an output only the loop assigns has no value before it
                        env[loop_value] = env[entry]
                for _ in range(loop.count if isinstance(loop.count, int) else int(env[loop.count])):
                    for stage in stages[loop.start:loop.stop]:
                        run_stage(stage, env)
                    for loop_value, exit_value in loop.carried:
                        env[loop_value] = env[exit_value]
                position = loop.stop
            else:
                run_stage(stages[position], env)
                position += 1
        outputs = [ops.store(env[v], types[v]) for v in output_results]
        finals = [ops.store(env[v], types[v]) for v, _ in inout_results]
        if not in_place:
            return tuple(outputs + finals) if len(outputs) + len(finals) != 1 else (outputs + finals)[0]
        for (_, buffer), value in zip(inout_results, finals):
            ops.assign(args[param_names.index(buffer)], value)
        return tuple(outputs) if len(outputs) != 1 else outputs[0] if outputs else None

    def run_stage(stage, env):
        if stage.reduce:
            (out,), results = stage.outputs, stage.body.results
            vals = evaluate(stage, env)
            value = ops.reduce(stage.reduce, vals[results[0]], vals[results[1]] if stage.reduce == "pick" else None)
            env[out] = ops.store(value, types[out])
            return
        vals = evaluate(stage, env)
        for out, result in zip(stage.outputs, stage.body.results):
            t = types[out]
            stored = ops.store(vals[result], t)  # rounded to its type, as a store does
            env[out] = ops.load(stored, t) if t.compute != t else stored

    def evaluate(stage, env):
        vals = []
        for ins in stage.body.instrs:
            operands = [vals[a] for a in ins.args]
            if ins.op == "load":
                vals.append(env[ins.attr])
            elif ins.op == "const":
                vals.append(ins.attr)  # a Python number: weak, it takes the other operand's type
            elif ins.op == "cast":
                vals.append(ops.cast(operands[0], stage.body.instrs[ins.args[0]].type, ins.type))
            else:
                vals.append(ops.op(ins.op, ins.type, operands))
        return vals

    return run
