"""Reverse-mode differentiation of a pipeline, source to source.

The backward of `pipeline p(params) -> (outs)` is another .fz pipeline,

    pipeline p_grad(params..., grad_out: <out's type and shape>, ...) -> (grad_x: <x's>, ...)

with a gradient for each float array parameter, which fusec checks, fuses and
emits like any other (`fusec compile --grad`, `--emit fz` prints it). It
recomputes the forward statements it needs rather than saving them (fusion
then keeps them in registers), and for each statement, last first, the
adjoint of every value the statement reads, by the chain rule through its
expression, with PyTorch's derivatives: zero through floor, ceil, round,
trunc, comparisons, integer casts and the unselected side of `where`; `min`,
`max` and `clamp` pass the gradient to the operand they return. A value read
through a broadcast of its last dim (`[*rows, 1]` read over `[*rows, n]`)
gets its adjoint summed over the row (`row_sum`); one read over leading dims
(a per-column bias) summed over them (`col_sum`). Not yet: `repeat`, `inout`
parameters, `row_pick`, and a broadcast along a middle dim: each a located error.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Callable

from fusec.errors import Diagnostic, Diagnostics, FzError, Loc, Source
from fusec.frontend.check_pipeline import Dims
from fusec.ir.program import Program, fmt_shape
from fusec.ir.stages import Stage, StageGraph
from fusec.passes.lower import lower

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "lt": "<", "le": "<=", "gt": ">",
          "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}
# Operations through which no gradient flows (PyTorch gives them a zero gradient).
_ZERO = {"floor", "ceil", "round", "trunc", "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not", "isnan",
         "isinf", "const"}
LN2, LN10, TWO_OVER_SQRT_PI = "0.6931471805599453", "2.302585092994046", "1.1283791670955126"


def backward_source(program: Program, name: str) -> str:
    """The .fz text of pipeline `name`'s backward, `<name>_grad`."""
    return _Backward(program, name).source()


def backward_program(program: Program, *names: str) -> Program:
    """The backwards of the pipelines `names`, `<name>_grad` each, as one checked
    program (FzError where one cannot be derived)."""
    from fusec.frontend import check_source
    text = "\n".join(backward_source(program, name) for name in names)
    return check_source(Source(f"{program.source.name} (backward)", text))


# d/dx of one-argument functions: {a} the adjoint of the result {r}, {x} the argument.
_UNARY = {
    "cast": "{a}", "neg": "-({a})", "exp": "{a} * {r}", "exp2": f"{{a}} * {{r}} * {LN2}",
    "expm1": "{a} * ({r} + 1.0)", "log": "{a} / {x}", "log2": f"{{a}} / ({{x}} * {LN2})",
    "log10": f"{{a}} / ({{x}} * {LN10})", "log1p": "{a} / (1.0 + {x})", "sqrt": "{a} * 0.5 / {r}",
    "rsqrt": "{a} * -0.5 * {r} / {x}", "cbrt": "{a} * {r} / (3.0 * {x})", "sin": "{a} * cos({x})",
    "cos": "-({a}) * sin({x})", "tan": "{a} * (1.0 + {r} * {r})", "asin": "{a} * rsqrt(1.0 - {x} * {x})",
    "acos": "-({a}) * rsqrt(1.0 - {x} * {x})", "atan": "{a} / (1.0 + {x} * {x})",
    "sinh": "{a} * cosh({x})", "cosh": "{a} * sinh({x})", "tanh": "{a} * (1.0 - {r} * {r})",
    "sigmoid": "{a} * {r} * (1.0 - {r})", "erf": f"{{a}} * {TWO_OVER_SQRT_PI} * exp(-({{x}} * {{x}}))",
    "abs": "{a} * ({x} > 0.0 ? 1.0 : {x} < 0.0 ? -1.0 : 0.0)",
}


class _Backward:
    def __init__(self, program: Program, name: str):
        self.program, self.pipeline = program, program.pipeline(name)
        self.graph: StageGraph = lower(program, self.pipeline)
        self.same_dim = _equated(self.pipeline.dim_eqs)
        self.names: dict[str, str] = {}
        taken = {s.name for s in self.pipeline.slots}
        for value in self.graph.values:  # SSA versions as identifiers: h, h.v1 -> h, h_v1
            ident = re.sub(r"\W", "_", value.name)
            while ident in taken and ident != value.name:
                ident += "_"
            taken.add(ident)
            self.names[value.name] = ident
        self.taken = taken
        self.column_operands: dict[str, str] = {}  # a column sum's chunks -> the text of what they sum

    def error(self, loc: Loc, message: str):
        raise FzError(Diagnostic(loc, message), self.program.source)

    def fresh(self, hint: str) -> str:
        name = re.sub(r"\W", "_", hint)
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name

    # ---- the pipeline
    def source(self) -> str:
        p, graph = self.pipeline, self.graph
        if graph.loops:
            self.error(graph.loops[0].loc, "differentiating a 'repeat' is not supported yet")
        for slot in p.params:
            if slot.role == "inout":
                self.error(slot.loc, f"'{slot.name}' is updated in place (inout): its gradient needs the value "
                                     "before the update; make the new value an output to differentiate")
        outputs = [o for o in p.outputs if o.type.is_float]
        inputs = [s for s in p.params if s.is_array and s.type.is_float]
        grads_out = {o.name: self.fresh(f"grad_{o.name}") for o in outputs}
        grads_in = {s.name: self.fresh(f"grad_{s.name}") for s in inputs}
        contributions: dict[str, list[str]] = {}
        for value in graph.results:
            buffer = graph.value(value).buffer
            if buffer in grads_out:
                contributions.setdefault(value, []).append(grads_out[buffer])
        forward = [line for stage in graph.stages for line in self.recompute(stage)]
        backward: list[str] = []
        for stage in reversed(graph.stages):
            backward += self.adjoints(stage, contributions)
        returned = []
        for s in inputs:
            found = contributions.get(s.name)
            # No path from the outputs: a zero of x's shape.
            returned.append(f"{grads_in[s.name]} = {' + '.join(found) if found else f'where(isnan({s.name}), 0.0, 0.0)'};")
        params = [_declare(s.name, s) for s in p.params] + [_declare(grads_out[o.name], o) for o in outputs]
        results = [_declare(grads_in[s.name], s) for s in inputs]
        if not results:
            self.error(p.loc, f"pipeline '{p.name}' has no float array parameter to differentiate")
        body = "\n".join(f"    {line}" for line in forward + backward + returned)
        return (f"# The backward of pipeline {p.name}, derived by fusec (fusec compile --grad).\n"
                f"pipeline {p.name}_grad({', '.join(params)})\n    -> ({', '.join(results)}) {{\n{body}\n}}\n")

    def recompute(self, stage: Stage) -> list[str]:
        """The forward statement, over SSA names."""
        body = stage.body
        text = _Printer(self, stage)
        if stage.reduce == "col_partial":  # written with the col_sum over its chunks, which follows
            self.column_operands[stage.outputs[0]] = text(body.results[0])
            return []
        if stage.reduce == "col_sum":
            (partial,) = stage.reads()
            return [f"{self.names[stage.outputs[0]]} = col_sum({self.column_operands[partial]});"]
        if stage.reduce:
            operands = ", ".join(text(r) for r in body.results)
            return [f"{self.names[stage.outputs[0]]} = row_{stage.reduce}({operands});"]
        return [f"{self.names[out]} = {text(r)};" for out, r in zip(stage.outputs, body.results)]

    # ---- the chain rule through one statement
    def adjoints(self, stage: Stage, contributions: dict[str, list[str]]) -> list[str]:
        lines = []
        seeds = {}
        for out, r in zip(stage.outputs, stage.body.results):
            found = contributions.pop(out, None)
            if found and self.graph.value(out).type.is_float:
                name = self.fresh(f"d_{self.names[out]}")
                lines.append(f"{name} = {' + '.join(found)};")
                seeds[r] = name
        if not seeds:
            return lines
        text = _Printer(self, stage)
        instrs = stage.body.instrs
        adj: dict[int, list[str]] = {}
        if stage.reduce:
            (seed,) = seeds.values()
            x = text(stage.body.results[0])
            adj[stage.body.results[0]] = [self.reduction_adjoint(stage, seed, x)]
        else:
            for r, name in seeds.items():
                adj.setdefault(r, []).append(name)
        for i in range(len(instrs) - 1, -1, -1):
            if i not in adj:
                continue
            a = adj[i][0] if len(adj[i]) == 1 else "(" + " + ".join(adj[i]) + ")"
            ins = instrs[i]
            if ins.op == "load":
                self.arrive(stage, ins.attr, a, contributions, ins.loc)
                continue
            for arg, term in self.rule(ins, [text(j) for j in ins.args], text(i), a, instrs):
                adj.setdefault(arg, []).append(term)
        return lines

    def arrive(self, stage: Stage, value: str, a: str, contributions: dict[str, list[str]], loc: Loc) -> None:
        """An adjoint reaching a value the statement loads, summed over what it was broadcast along."""
        v = self.graph.value(value)
        if v.shape is None or not v.type.is_float:
            return  # scalars and integers have no gradient here
        # Dims the call must give equal sizes (a traced function's x_0 and y_0) are one dim here.
        space, shape = tuple(map(self.same_dim, stage.shape)), tuple(map(self.same_dim, v.shape))
        # Summed over the dims it is broadcast along: the leading dims it lacks and its first
        # dim where that is 1 by col_sum, its last dim where that is 1 by row_sum.
        lead = len(space) - len(shape)
        space = space[lead:]
        ones = {j for j, (d, e) in enumerate(zip(shape, space)) if d == 1 and e != 1}
        if any(d != e for j, (d, e) in enumerate(zip(shape, space)) if j not in ones) \
                or not ones <= {0, len(shape) - 1}:
            self.error(loc, f"the gradient of '{v.buffer}' ({fmt_shape(shape)}, read over {fmt_shape(stage.shape)}) "
                            "is a sum over the dims it is broadcast along, which fusec cannot reduce yet (only "
                            "leading dims, and a first or last dim of 1)")
        for _ in range(lead):
            a = f"col_sum({a})"
        if len(shape) - 1 in ones:
            a = f"row_sum({a})"
        if 0 in ones and len(shape) > 1:
            a = f"col_sum({a})"
        contributions.setdefault(value, []).append(a)

    def reduction_adjoint(self, stage: Stage, d: str, x: str) -> str:
        op, result = stage.reduce, self.names[stage.outputs[0]]
        length = f"row_sum(where(isnan({x}), 1.0, 1.0))"
        if op in ("sum", "col_sum", "col_partial"):  # each element's adjoint is the sum's (broadcast back)
            return d
        if op == "mean":
            return f"{d} / {length}"
        if op == "var":
            return f"{d} * 2.0 * ({x} - row_mean({x})) / {length}"
        if op in ("max", "min"):  # shared among the elements equal to it, as torch.amax does
            hit = f"where({x} == {result}, 1.0, 0.0)"
            return f"{d} * {hit} / row_sum({hit})"
        if op == "logsumexp":
            return f"{d} * exp({x} - {result})"
        self.error(stage.loc, f"row_{op}() is not differentiable yet")

    def rule(self, ins, args: list[str], r: str, a: str, instrs) -> list[tuple[int, str]]:
        """(argument, adjoint term) for each argument a gradient flows to."""
        op, ids = ins.op, ins.args
        if op in _ZERO or (op == "cast" and not (ins.type.is_float and instrs[ids[0]].type.is_float)):
            return []
        x = args[0] if args else ""
        y = args[1] if len(args) > 1 else ""
        if op in _UNARY:
            return [(ids[0], _UNARY[op].format(a=a, x=x, r=r))]
        if op == "add":
            return [(ids[0], a), (ids[1], a)]
        if op == "sub":
            return [(ids[0], a), (ids[1], f"-({a})")]
        if op == "mul":
            return [(ids[0], f"{a} * {y}"), (ids[1], f"{a} * {x}")]
        if op == "div":
            return [(ids[0], f"{a} / {y}"), (ids[1], f"-({a}) * {r} / {y}")]
        if op == "mod":
            return [(ids[0], a), (ids[1], f"-({a}) * trunc({x} / {y})")]
        if op == "pow":
            return [(ids[0], f"{a} * {y} * pow({x}, {y} - 1.0)"), (ids[1], f"{a} * {r} * log({x})")]
        if op == "atan2":  # atan2(y, x)
            return [(ids[0], f"{a} * {y} / ({x} * {x} + {y} * {y})"),
                    (ids[1], f"-({a}) * {x} / ({x} * {x} + {y} * {y})")]
        if op == "fma":
            return [(ids[0], f"{a} * {y}"), (ids[1], f"{a} * {x}"), (ids[2], a)]
        if op in ("min", "max"):  # to the operand returned (the first on a tie; the other of a NaN)
            first = f"({x} {'<=' if op == 'min' else '>='} {y} || isnan({y}))"
            return [(ids[0], f"where({first}, {a}, 0.0)"), (ids[1], f"where({first}, 0.0, {a})")]
        if op == "clamp":
            lo, hi = args[1], args[2]
            return [(ids[0], f"where({x} >= {lo} && {x} <= {hi}, {a}, 0.0)"),
                    (ids[1], f"where({x} < {lo}, {a}, 0.0)"), (ids[2], f"where({x} > {hi} && {x} >= {lo}, {a}, 0.0)")]
        if op == "select":
            return [(ids[1], f"where({x}, {a}, 0.0)"), (ids[2], f"where({x}, 0.0, {a})")]
        self.error(ins.loc, f"fusec cannot differentiate '{op}' yet")


class _Printer:
    """A stage's instructions as .fz expressions over the backward's names (memoised)."""

    def __init__(self, backward: _Backward, stage: Stage):
        self.backward, self.instrs, self.done = backward, stage.body.instrs, {}

    def __call__(self, i: int) -> str:
        if i not in self.done:
            self.done[i] = self._print(i)
        return self.done[i]

    def _print(self, i: int) -> str:
        ins = self.instrs[i]
        args = [self(j) for j in ins.args]
        if ins.op == "load":
            return self.backward.names[ins.attr]
        if ins.op == "const":
            return _literal(ins.attr, ins.type)
        if ins.op == "cast":
            return f"{ins.type.name}({args[0]})"
        if ins.op in _INFIX:
            return f"({args[0]} {_INFIX[ins.op]} {args[1]})"
        if ins.op == "neg":
            return f"(-{args[0]})"
        if ins.op == "not":
            return f"(!{args[0]})"
        if ins.op == "select":
            return f"where({', '.join(args)})"
        return f"{ins.op}({', '.join(args)})"


def _literal(value, t) -> str:
    """A literal, weak as it was written: it takes its type from the other operand again."""
    if t.is_bool:
        return "true" if value else "false"
    if t.is_int:
        return f"({int(value)})" if int(value) < 0 else str(int(value))
    v = float(value) if isinstance(value, Fraction) else value
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "(-inf)" if v < 0 else "inf"
    text = repr(float(v))
    return f"({text})" if text.startswith("-") else text


def _declare(name: str, slot) -> str:
    return f"{name}: {slot.type.name}" + ("" if slot.shape is None else fmt_shape(slot.shape))


def _equated(equations) -> Callable[[object], object]:
    """dim -> one representative of the dims the call's equations make equal (a literal if any)."""
    dims = Dims(Diagnostics())
    for eq in equations:  # checked already: two literals never meet
        dims.union(eq.a, eq.b, eq.loc)
    return dims.find
