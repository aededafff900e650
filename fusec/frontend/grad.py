"""Reverse-mode differentiation of a pipeline, source to source.

The backward of `pipeline p(params) -> (outs)` is another .fz pipeline,

    pipeline p_grad(params..., grad_out: <out's type and shape>, ...) -> (grad_x: <x's>, ...)

with a gradient for each float array parameter, which fusec checks, fuses and
emits like any other (`fusec compile --grad`, `--emit fz` prints it). It
recomputes the forward statements it needs (fusion then keeps them in
registers), or takes some of the forward's outputs as saved inputs after the
parameters (`p_grad(params..., y: <y's>, grad_out...)`): an output the op
returns anyway, so saving it costs the backward a read and the forward
nothing. Which outputs it takes is the cost model's choice (`choose_backward`:
each form compiled, the forward's predicted time plus the backward's at
NOMINAL_ELEMENTS, the lower total taken; a tie recomputes). With the output
saved, a rule that reads the result (exp, sigmoid, tanh, sqrt, a division)
reads it instead of recomputing it; softmax's `e / row_sum(e)` with
`e = exp(t)` has the adjoint `y * (a - row_sum(a * y))` for t (and none for a
per-row shift of t: softmax is invariant to it), and row_logsumexp's
`exp(x - lse)` is `exp(y)` where y = x - lse is saved. For each statement,
last first, the
adjoint of every value the statement reads, by the chain rule through its
expression, with PyTorch's derivatives: zero through floor, ceil, round,
trunc, comparisons, integer casts and the unselected side of `where`; `min`,
`max` and `clamp` pass the gradient to the operand they return. A value read
through a broadcast of its last dim (`[*rows, 1]` read over `[*rows, n]`)
gets its adjoint summed over the row (`row_sum`); one read over leading dims
(a per-column bias) summed over them (`col_sum`); `row_pick(x, j)` passes its
adjoint to the element picked (`row_position(x) == j`). Integer and bool outputs
carry no gradient (as torch.max's indices); a pipeline whose float inputs reach
only such outputs cannot be differentiated. That, `repeat`, `inout` parameters and
a broadcast along a middle dim: each a located error.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Callable

from fusec.errors import Diagnostic, Diagnostics, FzError, Loc, Source
from fusec.frontend.check_pipeline import Dims
from fusec.ir.program import Program, fmt_shape
from fusec.ir.stages import Stage, StageGraph
from fusec.passes.cost import NOMINAL_ELEMENTS
from fusec.passes.lower import lower

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%", "lt": "<", "le": "<=", "gt": ">",
          "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}
# Operations through which no gradient flows (PyTorch gives them a zero gradient).
_ZERO = {"floor", "ceil", "round", "trunc", "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not", "isnan",
         "isinf", "const"}
# An adjoint longer than this (characters of .fz) that two terms or more read is named by a
# statement of its own, so that the printed backward grows with the forward, not with the
# product of its fan-outs (fusion_hurts': 1.8 MB inline). Fusion puts the statements back
# into one kernel, and the IR's common subexpressions make the same code either way.
SHARED_ADJOINT = 40
LN2, LN10, TWO_OVER_SQRT_PI = "0.6931471805599453", "2.302585092994046", "1.1283791670955126"


def backward_source(program: Program, name: str, saved: tuple[str, ...] = ()) -> str:
    """The .fz text of pipeline `name`'s backward, `<name>_grad`, taking the
    forward's outputs `saved` (names, a subset of `saveable_outputs`) after its
    parameters and recomputing every other forward value it needs."""
    return _Backward(program, name, tuple(saved)).source()


def saveable_outputs(program: Program, name: str) -> tuple[str, ...]:
    """The float outputs of pipeline `name` that its backward reads when given them
    saved (in output order): the outputs a save-or-recompute choice is made for."""
    every = _Backward(program, name, None)
    every.source()
    return tuple(o for o in every.saved if re.search(rf"\b{re.escape(every.saved[o])}\b", every.body))


@dataclass(frozen=True, slots=True)
class BackwardChoice:
    """The cost model's choice of a pipeline's backward: the outputs it takes saved
    (() recomputes everything), and the predicted µs of the forward and of each
    candidate backward, by the outputs it saves, at `elements` elements
    (backward: {saved: (µs, µs of arithmetic)}; the arithmetic breaks a tie)."""

    pipeline: str
    saved: tuple[str, ...]
    forward_us: float
    backward: dict
    elements: int = NOMINAL_ELEMENTS

    def total_us(self, saved: tuple[str, ...]) -> float:
        return self.forward_us + self.backward[saved][0]

    def describe(self) -> str:
        def form(saved):
            return f"saving {', '.join(saved)}" if saved else "recomputing every forward value"

        def cost(saved):
            us, arithmetic = self.backward[saved]
            return (f"{form(saved)}: {self.forward_us:.1f} + {us:.1f} = {self.forward_us + us:.1f} µs, "
                    f"{arithmetic:.1f} µs of it the backward's arithmetic")

        size = f"2^{self.elements.bit_length() - 1}" if self.elements & (self.elements - 1) == 0 else self.elements
        if len(self.backward) == 1:
            return (f"{self.pipeline}_grad recomputes every forward value it needs; saving an output would not "
                    f"change it (forward + backward predicted at {size} elements: {cost(())})")
        others = [s for s in self.backward if s != self.saved]
        tie = any(self.backward[s][0] <= self.backward[self.saved][0] for s in others)
        why = "within 1 % of the same predicted time, with less arithmetic," if tie else "the lower predicted time"
        return (f"{self.pipeline}_grad: {form(self.saved)}, {why} for forward + backward at {size} elements "
                f"({'; '.join(cost(s) for s in [self.saved] + others)})")


_CHOICES: dict[tuple, BackwardChoice] = {}
TIE = 0.01  # backwards predicted within 1 % of the fastest tie: the less arithmetic is taken


def choose_backward(program: Program, name: str, options=None, max_params: int | None = None) -> BackwardChoice:
    """Pipeline `name`'s backward form with the lower predicted forward + backward
    time (fusec's compile path, CompileOptions `options`, fused by the cost model, or
    unfused where options say fuse="none": the form that will run): every subset of its
    saveable outputs (the empty one and all of them beyond three), each taking at most
    `max_params` parameters if given (a torch op's limit; FzError where none does)."""
    from fusec.compiler import CompileOptions
    options = options or CompileOptions()
    options = replace(options, fuse="none" if options.fuse == "none" else "auto", persistent=False,
                      multi_tensor=False, partition=None, observed=())
    key = (program.source.text, name, options, max_params)
    if key in _CHOICES:
        return _CHOICES[key]
    saveable = saveable_outputs(program, name)
    forms = [()] + ([c for k in range(1, len(saveable) + 1) for c in itertools.combinations(saveable, k)]
                    if len(saveable) <= 3 else [saveable])
    if max_params is not None:
        pipeline = program.pipeline(name)
        taken = len(pipeline.params) + sum(o.type.is_float for o in pipeline.outputs)  # and the outputs saved
        forms = [form for form in forms if taken + len(form) <= max_params]
        if not forms:
            raise FzError(Diagnostic(pipeline.loc, f"the backward of pipeline '{name}' takes {taken} arguments (its "
                                                   f"parameters and its float outputs' gradients); at most "
                                                   f"{max_params} fit"), program.source)
    forward = _predicted(program, name, options)
    times = {form: _predicted(_checked(backward_source(program, name, form), program), f"{name}_grad", options)
             for form in forms}
    # The lower predicted time; a tie (within TIE: memory-bound, the arithmetic hidden): the less
    # arithmetic, then fewer tensors kept alive.
    fastest = min(us for us, _ in times.values())
    best = min((form for form in forms if times[form][0] <= fastest * (1 + TIE)),
               key=lambda form: (round(times[form][1], 3), len(form)))
    choice = _CHOICES[key] = BackwardChoice(name, best, forward[0], times)
    return choice


def backward_program(program: Program, *names: str, saved: dict | None = None, options=None) -> Program:
    """The backwards of the pipelines `names`, `<name>_grad` each, as one checked
    program (FzError where one cannot be derived). saved: the outputs each takes
    saved ({name: (output, ...)}; a name left out recomputes everything); None:
    the cost model's choice for each (`choose_backward`, said in a comment)."""
    texts = []
    for name in names:
        if saved is None:
            choice = choose_backward(program, name, options)
            texts.append(f"# The cost model's choice: {choice.describe()}.\n"
                         + backward_source(program, name, choice.saved))
        else:
            texts.append(backward_source(program, name, tuple(saved.get(name, ()))))
    return _checked("\n".join(texts), program)


def _checked(text: str, program: Program) -> Program:
    from fusec.frontend import check_source
    return check_source(Source(f"{program.source.name} (backward)", text))


def _predicted(program: Program, name: str, options) -> tuple[float, float]:
    """The cost model's time for the compiled pipeline, and its arithmetic's: the sums
    over its kernels' predictions."""
    from fusec.compiler import compile_pipeline
    predictions = [k.prediction for k in compile_pipeline(program, name, options).interface.kernels
                   if k.prediction is not None]
    return sum(p.us for p in predictions), sum(p.compute_us for p in predictions)


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
    """saved: the outputs taken saved (None: every float output a stage computes)."""

    def __init__(self, program: Program, name: str, saved: tuple[str, ...] | None = ()):
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
        self.producer = {out: stage for stage in self.graph.stages for out in stage.outputs}
        # Saved outputs: output name -> the backward's parameter (the value's own name), and by value.
        outputs = {o.name: o for o in self.pipeline.outputs if o.type.is_float and o.is_array}
        found = {}
        for value in self.graph.results:
            buffer = self.graph.value(value).buffer
            stage = self.producer.get(value)
            if buffer in outputs and buffer not in found and stage is not None and not stage.column:
                found[buffer] = value
        wanted = tuple(found) if saved is None else saved
        for o in wanted:
            if o not in found:
                self.error(self.pipeline.loc, f"'{o}' is not a float output of pipeline '{name}' that a stage "
                                              "computes: its backward cannot take it saved")
        order = [o.name for o in self.pipeline.outputs]
        self.saved = {o: self.names[found[o]] for o in sorted(wanted, key=order.index)}
        self.saved_values = {found[o]: o for o in self.saved}
        self.exp_seeds: dict[str, list[str]] = {}  # an exp's value -> adjoints of its argument (softmax)
        self.saved_exprs: dict[str, str] = {}  # a saved value's expression, as printed -> what reads it
        for value in self.saved_values:
            stage = self.producer[value]
            if stage.reduce:
                continue
            text, instrs = _Printer(self, stage, substitute=False), stage.body.instrs
            r = stage.body.results[stage.outputs.index(value)]
            self.saved_exprs[text(r)] = self.names[value]
            inner = instrs[r].args[0] if instrs[r].op == "cast" else None
            if inner is not None and instrs[r].type.is_float and instrs[inner].type.is_float:
                self.saved_exprs[text(inner)] = f"{instrs[inner].type.name}({self.names[value]})"
        self.body = ""

    def saved_in(self, stage: Stage) -> dict[int, str]:
        """The instructions of `stage` that compute a saved value (or, under a float
        cast, its wider form), as what reads the saved value instead."""
        found = {}
        if stage.reduce:  # a reduction's body result is its operand; the reduced value is loaded by name
            return found
        instrs = stage.body.instrs
        for out, r in zip(stage.outputs, stage.body.results):
            if out in self.saved_values:
                name = self.names[out]
                found[r] = name
                if instrs[r].op == "cast" and instrs[r].type.is_float and instrs[instrs[r].args[0]].type.is_float:
                    found[instrs[r].args[0]] = f"{instrs[instrs[r].args[0]].type.name}({name})"
        return found

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
        if inputs and not outputs:
            self.no_float_output(p)
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
        slot = {o.name: o for o in outputs}
        params = [_declare(s.name, s) for s in p.params] + [_declare(self.saved[o], slot[o]) for o in self.saved] \
            + [_declare(grads_out[o.name], o) for o in outputs]
        results = [_declare(grads_in[s.name], s) for s in inputs]
        if not results:
            self.error(p.loc, f"pipeline '{p.name}' has no float array parameter to differentiate")
        body = self.body = "\n".join(f"    {line}" for line in _live(forward, backward + returned))
        saved = f"# It takes the forward's {', '.join(self.saved)}, saved, rather than recomputing " \
                f"{'them' if len(self.saved) > 1 else 'it'}.\n" if self.saved else ""
        return (f"# The backward of pipeline {p.name}, derived by fusec (fusec compile --grad).\n{saved}"
                f"pipeline {p.name}_grad({', '.join(params)})\n    -> ({', '.join(results)}) {{\n{body}\n}}\n")

    def no_float_output(self, p) -> None:
        """The located error of a pipeline with float array inputs and no float output: at the
        statement whose integer (or bool) output a float input reaches, where the gradient stops."""
        floats = {s.name for s in p.params if s.is_array and s.type.is_float}
        for o in p.outputs:
            for value in self.graph.results:
                if self.graph.value(value).buffer != o.name:
                    continue
                reached = sorted(self.reaching(value) & floats)
                if reached:
                    self.error(self.producer[value].loc,
                               f"'{o.name}' is {o.type.name}, computed from the float parameter '{reached[0]}': "
                               f"integer and bool values carry no gradient, and pipeline '{p.name}' has no float "
                               "output to differentiate (return the float value as an output)")
        self.error(p.loc, f"pipeline '{p.name}' has no float output to differentiate")

    def reaching(self, value: str) -> set[str]:
        """The values `value` is computed from (itself included), through every statement."""
        found, todo = set(), [value]
        while todo:
            v = todo.pop()
            if v not in found:
                found.add(v)
                stage = self.producer.get(v)
                todo += sorted(stage.reads()) if stage is not None else []
        return found

    def recompute(self, stage: Stage) -> list[str]:
        """The forward statement, over SSA names."""
        body = stage.body
        text = _Printer(self, stage)
        if any(out in self.saved_values for out in stage.outputs) and stage.reduce:
            return []  # a saved reduction (columns are never saved)
        if stage.reduce == "col_partial":  # written with the col_sum over its chunks, which follows
            self.column_operands[stage.outputs[0]] = text(body.results[0])
            return []
        if stage.reduce == "col_sum":
            (partial,) = stage.reads()
            return [f"{self.names[stage.outputs[0]]} = col_sum({self.column_operands[partial]});"]
        if stage.reduce:
            operands = ", ".join(text(r) for r in body.results)
            return [f"{self.names[stage.outputs[0]]} = row_{stage.reduce}({operands});"]
        return [f"{self.names[out]} = {text(r)};" for out, r in zip(stage.outputs, body.results)
                if out not in self.saved_values]

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
        # Softmax's adjoint reaching an exp's argument past the exp (softmax_rule).
        exp_seeds = {r: self.exp_seeds.pop(out) for out, r in zip(stage.outputs, stage.body.results)
                     if out in self.exp_seeds}
        if not seeds and not exp_seeds:
            return lines
        text = _Printer(self, stage)
        instrs = stage.body.instrs
        adj: dict[int, list[str]] = {}
        for r, found in exp_seeds.items():
            arg = instrs[instrs[r].args[0]]
            if arg.op == "sub" and self.constant_along_row(stage, instrs[arg.args[1]]):
                target = arg.args[0]  # softmax(t - m) for a per-row m is softmax(t): no gradient reaches m
            else:
                target = instrs[r].args[0]
            adj.setdefault(target, []).extend(found)
        if stage.reduce:
            (seed,) = seeds.values()
            x = text(stage.body.results[0])
            index = text(stage.body.results[1]) if stage.reduce == "pick" else None
            adj[stage.body.results[0]] = [self.reduction_adjoint(stage, seed, x, index)]
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
            exp_value = self.softmax_rule(stage, ins)
            if exp_value is not None:
                y = text(i)
                name = self.fresh(f"d_{self.names[exp_value]}_arg")
                lines.append(f"{name} = {y} * ({a} - row_sum({a} * {y}));")
                self.exp_seeds.setdefault(exp_value, []).append(name)
                continue
            args = [text(j) for j in ins.args]
            terms = self.rule(ins, args, text(i), a, instrs)
            if len(a) > SHARED_ADJOINT and not a.isidentifier() and \
                    sum(term.count(a) for arg, term in terms if self.carries(instrs[arg])) > 1:
                name = self.fresh(f"d_{self.names[stage.outputs[0]]}_{ins.op}{i}")
                lines.append(f"{name} = {a};")
                terms = self.rule(ins, args, text(i), name, instrs)
            for arg, term in terms:
                adj.setdefault(arg, []).append(term)
        return lines

    def carries(self, ins) -> bool:
        """Whether an adjoint reaching instruction `ins` may go further (not into a constant, a
        scalar parameter or an integer)."""
        if ins.op == "const" or not ins.type.is_float:
            return False
        return ins.op != "load" or self.graph.value(ins.attr).shape is not None

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

    def softmax_rule(self, stage: Stage, ins) -> str | None:
        """The exp's value e where `ins` is `e / s` with s = row_sum(e) and e = exp(t),
        each of the row's elements (softmax: t's adjoint through it is y * (a - row_sum(a * y)))."""
        instrs = stage.body.instrs
        if ins.op != "div" or stage.reduce:
            return None
        num, den = instrs[ins.args[0]], instrs[ins.args[1]]
        if num.op != "load" or den.op != "load":
            return None
        summed, exp = self.producer.get(den.attr), self.producer.get(num.attr)
        if summed is None or exp is None or summed.reduce != "sum" or exp.reduce:
            return None
        operand = summed.body.instrs[summed.body.results[0]]
        result = exp.body.instrs[exp.body.results[exp.outputs.index(num.attr)]]
        same = tuple(map(self.same_dim, stage.shape))
        if operand.op != "load" or operand.attr != num.attr or result.op != "exp" or \
                tuple(map(self.same_dim, self.graph.value(num.attr).shape or ())) != same or \
                tuple(map(self.same_dim, summed.shape)) != same or len(same) < 1 or same[-1] == 1:
            return None
        return num.attr

    def constant_along_row(self, stage: Stage, ins) -> bool:
        """`ins` is a constant, or a load of a value broadcast along the row (its last dim 1)."""
        if ins.op == "const":
            return True
        if ins.op != "load":
            return False
        shape = self.graph.value(ins.attr).shape
        return not shape or (shape[-1] == 1 and self.same_dim(stage.shape[-1]) != 1)

    def reduction_adjoint(self, stage: Stage, d: str, x: str, index: str | None = None) -> str:
        op, result = stage.reduce, self.names[stage.outputs[0]]
        length = f"row_sum(where(isnan({x}), 1.0, 1.0))"
        # The reduced value's adjoint over the operand's shape: where it were left narrow ([*rows, 1]
        # or [cols]), a later sum of it over the row or the columns (a value read through a
        # broadcast) would count it once, not once an element. A parameter reduced as it is takes
        # it narrow (its gradient, an output, is broadcast as it is stored), so that its backward
        # need not read it.
        spread = d if self.parameter_as_it_is(stage) else f"where(isnan({x}), {d}, {d})"
        if op == "col_sum":  # over the chunks' partial sums (never printed): col_partial's spreads it
            return d
        if op in ("sum", "col_partial"):  # each element's adjoint is the sum's
            return spread
        if op == "mean":
            return f"{spread} / {length}"
        if op == "var":
            return f"{d} * 2.0 * ({x} - row_mean({x})) / {length}"
        if op in ("max", "min"):  # shared among the elements equal to it, as torch.amax does
            hit = f"where({x} == {result}, 1.0, 0.0)"
            return f"{d} * {hit} / row_sum({hit})"
        if op == "pick":  # to the element picked alone (none where the index is outside the row)
            return f"where(row_position({x}) == {index}, {d}, 0.0)"
        if op == "logsumexp":  # exp(y) where y = x - logsumexp(x) is saved
            return f"{d} * exp({self.saved_exprs.get(f'({x} - {result})', f'{x} - {result}')})"
        self.error(stage.loc, f"row_{op}() is not differentiable yet")

    def parameter_as_it_is(self, stage: Stage) -> bool:
        """A reduction's operand is a parameter of the reduction's own shape, loaded as it is."""
        operand = stage.body.instrs[stage.body.results[0]]
        if operand.op != "load" or operand.attr not in {s.name for s in self.pipeline.params}:
            return False
        shape = self.graph.value(operand.attr).shape or ()
        return tuple(map(self.same_dim, shape)) == tuple(map(self.same_dim, stage.shape))

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

    def __init__(self, backward: _Backward, stage: Stage, substitute: bool = True):
        self.backward, self.instrs = backward, stage.body.instrs
        self.done: dict[int, str] = dict(backward.saved_in(stage)) if substitute else {}  # saved: read

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


def _live(forward: list[str], rest: list[str]) -> list[str]:
    """The forward statements something after them reads (a value the backward takes saved, or
    needs none of, is not recomputed), then `rest`."""
    kept, read = [], " ".join(rest)
    for line in reversed(forward):
        name, _, expression = line.partition(" = ")
        if re.search(rf"\b{re.escape(name)}\b", read):
            kept.append(line)
            read += " " + expression
    return kept[::-1] + rest


def _declare(name: str, slot) -> str:
    return f"{name}: {slot.type.name}" + ("" if slot.shape is None else fmt_shape(slot.shape))


def _equated(equations) -> Callable[[object], object]:
    """dim -> one representative of the dims the call's equations make equal (a literal if any)."""
    dims = Dims(Diagnostics())
    for eq in equations:  # checked already: two literals never meet
        dims.union(eq.a, eq.b, eq.loc)
    return dims.find
