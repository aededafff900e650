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
`max` and `clamp` pass the gradient to the operand they return.

Broadcasts are differentiated where they happen: each instruction's value has
the shape of what it reads (a per-row `rsqrt(row_mean(x * x) + eps)` is
`[*rows, 1]` inside a statement over `[*rows, n]`), and its adjoint is a
product of factors (`_Term`). Where an operand is narrower than the
instruction, the adjoint reaching it is summed over the dims it is broadcast
along, there: over its last dim by `row_sum`, over leading dims (a per-column
bias) by `col_sum`, with the factors constant along the summed dim left
outside the sum (RMSNorm's per-row factor: `row_sum(d_y * w * x) * -0.5 * r *
r * r`, computed once a row, the sum reading what varies alone); a product
constant along it is multiplied by the dim's length (`row_length(x)`; a column
count). A reduction's adjoint stays as narrow as its result (it broadcasts over
the row; a later sum counts it once an element): a mean's and a variance's
divided by `row_length(x)`, which a row kernel reads from the shape;
`row_pick(x, j)` passes its adjoint to the element picked
(`row_position(x) == j`). Statements whose values reach no gradient are
dropped. Integer and bool outputs
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


# d/dx of one-argument functions, as factors of the adjoint of the result: op -> (negated,
# ((factor, divides), ...)), {x} the argument, {r} the result. rsqrt's -0.5 * x^(-3/2) is the
# result cubed: no division, and no need of x where the result is saved (LayerNorm's rstd).
_UNARY = {
    "cast": (False, ()), "neg": (True, ()),
    "exp": (False, (("{r}", False),)), "exp2": (False, (("{r}", False), (LN2, False))),
    "expm1": (False, (("({r} + 1.0)", False),)), "log": (False, (("{x}", True),)),
    "log2": (False, ((f"({{x}} * {LN2})", True),)), "log10": (False, ((f"({{x}} * {LN10})", True),)),
    "log1p": (False, (("(1.0 + {x})", True),)), "sqrt": (False, (("0.5", False), ("{r}", True))),
    "rsqrt": (False, (("-0.5", False), ("{r}", False), ("{r}", False), ("{r}", False))),
    "cbrt": (False, (("{r}", False), ("(3.0 * {x})", True))), "sin": (False, (("cos({x})", False),)),
    "cos": (True, (("sin({x})", False),)), "tan": (False, (("(1.0 + {r} * {r})", False),)),
    "asin": (False, (("rsqrt(1.0 - {x} * {x})", False),)), "acos": (True, (("rsqrt(1.0 - {x} * {x})", False),)),
    "atan": (False, (("(1.0 + {x} * {x})", True),)), "sinh": (False, (("cosh({x})", False),)),
    "cosh": (False, (("sinh({x})", False),)), "tanh": (False, (("(1.0 - {r} * {r})", False),)),
    "sigmoid": (False, (("{r}", False), ("(1.0 - {r})", False))),
    "erf": (False, ((TWO_OVER_SQRT_PI, False), ("exp(-({x} * {x}))", False))),
    "abs": (False, (("({x} > 0.0 ? 1.0 : {x} < 0.0 ? -1.0 : 0.0)", False),)),
}
_LITERAL = re.compile(r"\(?-?\d+(\.\d*)?(e[-+]?\d+)?\)?")


def _broadcast(shapes) -> tuple:
    """The broadcast of shapes (tuples of dims, aligned on the right; a dim of 1 broadcasts)."""
    shapes = [tuple(s) for s in shapes]
    width = max((len(s) for s in shapes), default=0)
    return tuple(next((d for d in (s[-k] for s in shapes if len(s) >= k) if d != 1), 1) for k in range(width, 0, -1))


def _along_row(shape: tuple) -> bool:
    """A value of this shape varies along the last dim (the row) of the shapes it broadcasts into."""
    return bool(shape) and shape[-1] != 1


@dataclass(frozen=True, slots=True)
class _Factor:
    text: str      # an operand of * or /: a name, a literal, a call or a parenthesised expression
    shape: tuple   # the dims it varies along (canonical dims, aligned on the right)
    divides: bool = False


@dataclass(frozen=True, slots=True)
class _Term:
    """An adjoint as a product of factors and a sign, so that a sum of it over a dim (the
    gradient of a value broadcast along it) holds only the factors that vary along that dim:
    `row_sum(d_y * w * x) * -0.5 * r * r * r`, the per-row factor taken once per row. Printed
    with the factors constant along the row first, grouped (computed once a row in a row
    kernel), then those that vary."""

    factors: tuple
    negated: bool = False

    @staticmethod
    def of(text: str, shape) -> "_Term":
        return _Term((_Factor(text, tuple(shape)),))

    @property
    def shape(self) -> tuple:
        return _broadcast(f.shape for f in self.factors)

    def times(self, text: str, shape, divides: bool = False) -> "_Term":
        return _Term(self.factors + (_Factor(text, tuple(shape), divides),), self.negated)

    def negate(self) -> "_Term":
        return _Term(self.factors, not self.negated)

    def text(self) -> str:
        wide = _along_row(self.shape)
        per_row = [f for f in self.factors if not (wide and _along_row(f.shape))]
        varying = [f for f in self.factors if wide and _along_row(f.shape)]
        negated = self.negated
        for k, f in enumerate(per_row):  # the sign into a literal factor, where there is one
            if negated and not f.divides and _LITERAL.fullmatch(f.text):
                bare = f.text.strip("()")
                per_row[k] = replace(f, text=bare[1:] if bare.startswith("-") else f"-{bare}")
                negated = False
                break
        head = _product(per_row)
        if negated and head:  # the sign on the per-row factors
            head, negated = f"-({head})", False
        elif head and varying and (len(per_row) > 1 or per_row[0].divides):
            head = f"({head})"
        text = head or ""
        for f in varying:
            text = f"{text} {'/' if f.divides else '*'} {f.text}" if text else \
                f.text if not f.divides else f"1.0 / {f.text}"
        return f"-({text})" if negated else text


def _product(factors: list) -> str:
    if not factors:
        return ""
    text = " * ".join(f.text for f in factors if not f.divides) or "1.0"
    return text + "".join(f" / {f.text}" for f in factors if f.divides)


def _sum(terms: list) -> _Term:
    """Terms added up, as one term (several: one factor, their sum in parentheses)."""
    if len(terms) == 1:
        return terms[0]
    return _Term.of("(" + " + ".join(t.text() for t in terms) + ")", _broadcast(t.shape for t in terms))


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
        self.reduced: dict[str, str] = {}  # a forward reduction, as printed -> its name (recompute)
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

    def saved_in(self, stage: Stage) -> dict[int, tuple[str, str]]:
        """The instructions of `stage` that compute a saved value (or, under a float
        cast, its wider form), as what reads the saved value instead, and the value."""
        found = {}
        if stage.reduce:  # a reduction's body result is its operand; the reduced value is loaded by name
            return found
        instrs = stage.body.instrs
        for out, r in zip(stage.outputs, stage.body.results):
            if out in self.saved_values:
                name = self.names[out]
                found[r] = (name, out)
                if instrs[r].op == "cast" and instrs[r].type.is_float and instrs[instrs[r].args[0]].type.is_float:
                    found[instrs[r].args[0]] = (f"{instrs[instrs[r].args[0]].type.name}({name})", out)
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
        contributions: dict[str, list[_Term]] = {}
        for value in graph.results:
            buffer = graph.value(value).buffer
            if buffer in grads_out:
                contributions.setdefault(value, []).append(_Term.of(grads_out[buffer], self.shape_of(value)))
        forward = [line for stage in graph.stages for line in self.recompute(stage)]
        backward: list[str] = []
        for stage in reversed(graph.stages):
            backward += self.adjoints(stage, contributions)
        returned = []
        for s in inputs:
            found = contributions.get(s.name)
            # No path from the outputs: a zero of x's shape.
            total = " + ".join(t.text() for t in found) if found else f"where(isnan({s.name}), 0.0, 0.0)"
            returned.append(f"{grads_in[s.name]} = {total};")
        slot = {o.name: o for o in outputs}
        params = [_declare(s.name, s) for s in p.params] + [_declare(self.saved[o], slot[o]) for o in self.saved] \
            + [_declare(grads_out[o.name], o) for o in outputs]
        results = [_declare(grads_in[s.name], s) for s in inputs]
        if not results:
            self.error(p.loc, f"pipeline '{p.name}' has no float array parameter to differentiate")
        body = self.body = "\n".join(f"    {line}" for line in _live(forward + backward, returned))
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
        if stage.reduce and not stage.column:
            operands = ", ".join(text(r) for r in body.results)
            self.reduced[f"row_{stage.reduce}({operands})"] = self.names[stage.outputs[0]]
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
    def adjoints(self, stage: Stage, contributions: dict[str, list[_Term]]) -> list[str]:
        lines = []
        seeds = []
        for out, r in zip(stage.outputs, stage.body.results):
            found = contributions.pop(out, None)
            if found and self.graph.value(out).type.is_float:
                name = self.fresh(f"d_{self.names[out]}")
                lines.append(f"{name} = {' + '.join(t.text() for t in found)};")
                seeds.append((out, r, _Term.of(name, _broadcast(t.shape for t in found))))
        # Softmax's adjoint reaching an exp's argument past the exp (softmax_rule).
        exp_seeds = {r: self.exp_seeds.pop(out) for out, r in zip(stage.outputs, stage.body.results)
                     if out in self.exp_seeds}
        if not seeds and not exp_seeds:
            return lines
        text = _Printer(self, stage)
        instrs = stage.body.instrs
        shapes = self.shapes(stage)
        adj: dict[int, list[_Term]] = {}
        for r, found in exp_seeds.items():
            arg = instrs[instrs[r].args[0]]
            if arg.op == "sub" and self.constant_along_row(stage, instrs[arg.args[1]]):
                target = arg.args[0]  # softmax(t - m) for a per-row m is softmax(t): no gradient reaches m
            else:
                target = instrs[r].args[0]
            adj.setdefault(target, []).extend(self.fit(t, shapes[r], shapes[target], stage, target) for t in found)
        if stage.reduce:
            ((_, _, seed),) = seeds
            operand = stage.body.results[0]
            term = self.reduction_adjoint(stage, seed, text, shapes)
            if term is not None:
                adj[operand] = [term]
        else:
            for out, r, seed in seeds:  # the stored value's adjoint, summed where the instruction is narrower
                adj.setdefault(r, []).append(self.fit(seed, self.shape_of(out), shapes[r], stage, r))
        for i in range(len(instrs) - 1, -1, -1):
            if i not in adj:
                continue
            a = _sum(adj[i])
            ins = instrs[i]
            if ins.op == "load":
                self.arrive(ins.attr, a, contributions)
                continue
            exp_value = self.softmax_rule(stage, ins)
            if exp_value is not None:
                y, d = text(i), a.text()
                name = self.fresh(f"d_{self.names[exp_value]}_arg")
                lines.append(f"{name} = {y} * ({d} - row_sum({d} * {y}));")
                self.exp_seeds.setdefault(exp_value, []).append(_Term.of(name, shapes[i]))
                continue
            terms = [(arg, t) for arg, t in self.rule(ins, i, text, a, shapes) if self.carries(instrs[arg], shapes[arg])]
            if len(terms) > 1 and len(a.text()) > SHARED_ADJOINT:
                a, named = self.shared(stage, i, a)
                lines += named
                terms = [(arg, t) for arg, t in self.rule(ins, i, text, a, shapes)
                         if self.carries(instrs[arg], shapes[arg])]
            for arg, term in terms:
                adj.setdefault(arg, []).append(self.fit(term, shapes[i], shapes[arg], stage, arg))
        return lines

    def shapes(self, stage: Stage) -> list[tuple]:
        """The shape of each instruction's value as the backward prints it (a saved value's where
        it is read instead): the dims it varies along, canonical (`same_dim`)."""
        saved = self.saved_in(stage)
        found: list[tuple] = []
        for i, ins in enumerate(stage.body.instrs):
            if i in saved:
                found.append(self.shape_of(saved[i][1]))
            elif ins.op == "load":
                found.append(self.shape_of(ins.attr))
            elif ins.op == "const":
                found.append(())
            else:
                found.append(_broadcast(found[j] for j in ins.args))
        return found

    def shape_of(self, value: str) -> tuple:
        shape = self.graph.value(value).shape
        return tuple(map(self.same_dim, shape)) if shape else ()

    def carries(self, ins, shape: tuple) -> bool:
        """Whether an adjoint reaching instruction `ins` may go further (not into a constant, an
        integer or a value of scalars alone)."""
        return ins.op != "const" and ins.type.is_float and shape != ()

    def shared(self, stage: Stage, i: int, a: _Term) -> tuple[_Term, list[str]]:
        """A long adjoint that several terms read, named by a statement of its own: the factors
        that vary along the row by one, those constant along it by another (so that a later sum
        over the row can still leave them outside)."""
        base = f"d_{self.names[stage.outputs[0]]}_{stage.body.instrs[i].op}{i}"
        wide = _along_row(a.shape)
        groups = [[f for f in a.factors if wide and _along_row(f.shape)],
                  [f for f in a.factors if not (wide and _along_row(f.shape))]]
        both = all(groups)
        lines, factors = [], []
        for group, suffix in zip(groups, ("", "_row")):
            if len(group) == 1 and not group[0].divides and (group[0].text.isidentifier()
                                                              or _LITERAL.fullmatch(group[0].text)):
                factors.append(group[0])
            elif group:
                name = self.fresh(base + (suffix if both else ""))
                lines.append(f"{name} = {_Term(tuple(group)).text()};")
                factors.append(_Factor(name, _Term(tuple(group)).shape))
        return _Term(tuple(factors), a.negated), lines

    def fit(self, term: _Term, domain: tuple, target: tuple, stage: Stage, arg: int) -> _Term:
        """An adjoint over `domain` reaching an operand of shape `target`, summed over the dims the
        operand is broadcast along: its last dim where that is 1 (`row_sum`), then the leading dims
        it lacks and its first dim where that is 1 (`col_sum`). The factors constant along a dim
        stay outside its sum; where none varies, the sum is the product times the dim's length."""
        if target == domain:
            return term
        lead = len(domain) - len(target)
        aligned = domain[lead:]
        ones = {k for k, (d, e) in enumerate(zip(target, aligned)) if d == 1 and e != 1}
        if lead < 0 or any(d != e for k, (d, e) in enumerate(zip(target, aligned)) if k not in ones) \
                or not ones <= {0, len(target) - 1}:
            self.broadcast_error(stage, arg)
        if len(target) - 1 in ones:
            term = self.summed(term, domain, stage, -1)
            domain = domain[:-1] + (1,)
        for _ in range(lead + (0 in ones and len(target) > 1)):
            term = self.summed(term, domain, stage, 0)
            domain = domain[1:]
        return term

    def summed(self, term: _Term, domain: tuple, stage: Stage, dim: int) -> _Term:
        """`term` (over `domain`) summed over its last dim (dim -1: row_sum, a trailing 1 left) or
        its first (dim 0: col_sum, the dim gone)."""
        def varies(shape):
            return _along_row(shape) if dim == -1 else len(shape) == len(domain) and shape[0] != 1

        inside = [f for f in term.factors if varies(f.shape)]
        outside = [f for f in term.factors if not varies(f.shape)]
        if dim == -1 and inside and _broadcast([_broadcast(f.shape for f in inside), (1,) * len(domain)]) != domain:
            # over the statement's rows, [*rows, length] (a row kernel it fuses with), not a narrower row space
            inside, outside = list(term.factors), []
        if inside:
            operand = _Term(tuple(inside))
            shape = operand.shape
            total = _Factor(f"row_sum({operand.text()})" if dim == -1 else f"col_sum({operand.text()})",
                            shape[:-1] + (1,) if dim == -1 else shape[1:])
        else:  # constant along the dim: the product times its length
            witness, shape = self.witness(stage, domain, rows=dim == 0)
            total = _Factor(f"row_length({witness})", shape[:-1] + (1,)) if dim == -1 else \
                _Factor(f"col_sum(where(isnan({witness}), 1.0, 1.0))", shape[1:])
        return _Term((total, *outside), term.negated)

    def witness(self, stage: Stage, domain: tuple, rows: bool = False) -> tuple[str, tuple]:
        """A float array of the shape `domain` the statement reads (a parameter first, then any value,
        then any computed instruction), to count the elements of its rows by: its name (or
        expression) and its shape. rows: to count its rows (dim 0), any of its leading dim
        (the one of fewest elements first: a per-row value over a whole array)."""
        instrs, shapes = stage.body.instrs, self.shapes(stage)
        text = _Printer(self, stage)
        params = {s.name for s in self.pipeline.params}

        def fits(shape):
            return shape == domain if not rows else len(shape) == len(domain) and shape[0] == domain[0]
        found = [i for i, ins in enumerate(instrs) if fits(shapes[i]) and ins.type.is_float and ins.op != "const"]
        best = sorted(found, key=lambda i: (-sum(d == 1 for d in shapes[i]), instrs[i].op != "load",
                                            instrs[i].op != "load" or instrs[i].attr not in params, i))
        if not best:
            raise AssertionError(f"no value of shape {domain} in statement {stage.name}")
        return text(best[0]), shapes[best[0]]

    def broadcast_error(self, stage: Stage, arg: int):
        """The located error of a gradient summed over a dim fusec cannot reduce: at the value
        read through that broadcast."""
        instrs = stage.body.instrs
        space = tuple(map(self.same_dim, stage.shape))
        todo, seen = [arg], set()
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            todo += instrs[i].args
            v = self.graph.value(instrs[i].attr) if instrs[i].op == "load" else None
            if v is None or v.shape is None or not v.type.is_float:
                continue
            shape = tuple(map(self.same_dim, v.shape))
            lead = len(space) - len(shape)
            ones = {j for j, (d, e) in enumerate(zip(shape, space[lead:])) if d == 1 and e != 1}
            if not ones <= {0, len(shape) - 1}:
                self.error(instrs[i].loc, f"the gradient of '{v.buffer}' ({fmt_shape(shape)}, read over "
                                          f"{fmt_shape(stage.shape)}) is a sum over the dims it is broadcast along, "
                                          "which fusec cannot reduce yet (only leading dims, and a first or last "
                                          "dim of 1)")
        self.error(instrs[arg].loc, "the gradient here is a sum over dims it is broadcast along that fusec cannot "
                                    "reduce yet (only leading dims, and a first or last dim of 1)")

    def arrive(self, value: str, a: _Term, contributions: dict[str, list[_Term]]) -> None:
        """An adjoint reaching a value the statement loads (summed to its shape already)."""
        v = self.graph.value(value)
        if v.shape is None or not v.type.is_float:
            return  # scalars and integers have no gradient here
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

    def reduction_adjoint(self, stage: Stage, d: _Term, text: "_Printer", shapes: list[tuple]) -> _Term | None:
        """The adjoint of a reduction's operand from `d`, that of its result ([*rows, 1], or [cols]
        for a column sum): kept as narrow as it is (it broadcasts over the row, and a later sum
        over the row counts it once an element), with the row's length from `row_length`."""
        op, result = stage.reduce, self.names[stage.outputs[0]]
        operand = stage.body.results[0]
        x, shape = text(operand), shapes[operand]
        if op in ("sum", "col_partial", "col_sum"):  # each element's adjoint is the sum's
            return d
        if op == "length":  # the row's length: no gradient
            return None
        if op == "pick":  # to the element picked alone (none where the index is outside the row)
            index = text(stage.body.results[1])
            return _Term.of(f"where(row_position({x}) == {index}, {d.text()}, 0.0)", _broadcast([shape, d.shape]))
        if op == "logsumexp":  # exp(y) where y = x - logsumexp(x) is saved
            return d.times(f"exp({self.saved_exprs.get(f'({x} - {result})', f'{x} - {result}')})", shape)
        if op in ("max", "min"):  # shared among the elements equal to it, as torch.amax does
            hit = f"where({x} == {result}, 1.0, 0.0)"
            return d.times(f"row_sum({hit})", shape[:-1] + (1,), divides=True).times(hit, shape)
        if op in ("mean", "var"):
            if shape and shape[-1] != 1:  # divided by the row's length (1: nothing to divide)
                witness, _ = self.witness(stage, shape)
                d = d.times(f"row_length({witness})", shape[:-1] + (1,), divides=True)
            if op == "mean":
                return d
            mean = self.reduced.get(f"row_mean({x})", f"row_mean({x})")  # the forward's, where it has it
            return d.times("2.0", ()).times(f"({x} - {mean})", shape)
        self.error(stage.loc, f"row_{op}() is not differentiable yet")

    def rule(self, ins, i: int, text: "_Printer", a: _Term, shapes: list[tuple]) -> list[tuple[int, _Term]]:
        """(argument, adjoint term) for each argument a gradient flows to."""
        op, ids = ins.op, ins.args
        if op in _ZERO or (op == "cast" and not (ins.type.is_float and text.instrs[ids[0]].type.is_float)):
            return []
        args = [text(j) for j in ids]
        arg_shapes = [shapes[j] for j in ids]
        x, sx = (args[0], arg_shapes[0]) if args else ("", ())
        y, sy = (args[1], arg_shapes[1]) if len(args) > 1 else ("", ())
        r, sr = text(i), shapes[i]
        if op in _UNARY:
            negated, factors = _UNARY[op]
            term = a.negate() if negated else a
            for template, divides in factors:
                shape = _broadcast(([sx] if "{x}" in template else []) + ([sr] if "{r}" in template else []))
                term = term.times(template.format(x=x, r=r), shape, divides)
            return [(ids[0], term)]
        both = _broadcast([sx, sy])
        if op == "add":
            return [(ids[0], a), (ids[1], a)]
        if op == "sub":
            return [(ids[0], a), (ids[1], a.negate())]
        if op == "mul":  # x * x: one term, 2 * a * x
            if ids[0] == ids[1]:
                return [(ids[0], a.times("2.0", ()).times(x, sx))]
            return [(ids[0], a.times(y, sy)), (ids[1], a.times(x, sx))]
        if op == "div":
            return [(ids[0], a.times(y, sy, divides=True)), (ids[1], a.negate().times(r, sr).times(y, sy, divides=True))]
        if op == "mod":
            return [(ids[0], a), (ids[1], a.negate().times(f"trunc({x} / {y})", both))]
        if op == "pow":
            return [(ids[0], a.times(y, sy).times(f"pow({x}, {y} - 1.0)", both)),
                    (ids[1], a.times(r, sr).times(f"log({x})", sx))]
        if op == "atan2":  # atan2(y, x)
            norm = f"({x} * {x} + {y} * {y})"
            return [(ids[0], a.times(y, sy).times(norm, both, divides=True)),
                    (ids[1], a.negate().times(x, sx).times(norm, both, divides=True))]
        if op == "fma":
            return [(ids[0], a.times(y, sy)), (ids[1], a.times(x, sx)), (ids[2], a)]
        d = a.text()
        if op in ("min", "max"):  # to the operand returned (the first on a tie; the other of a NaN)
            first = f"({x} {'<=' if op == 'min' else '>='} {y} || isnan({y}))"
            shape = _broadcast([both, a.shape])
            return [(ids[0], _Term.of(f"where({first}, {d}, 0.0)", shape)),
                    (ids[1], _Term.of(f"where({first}, 0.0, {d})", shape))]
        if op == "clamp":
            lo, hi = args[1], args[2]
            shape = _broadcast(arg_shapes + [a.shape])
            return [(ids[0], _Term.of(f"where({x} >= {lo} && {x} <= {hi}, {d}, 0.0)", shape)),
                    (ids[1], _Term.of(f"where({x} < {lo}, {d}, 0.0)", shape)),
                    (ids[2], _Term.of(f"where({x} > {hi} && {x} >= {lo}, {d}, 0.0)", shape))]
        if op == "select":
            shape = _broadcast([sx, a.shape])
            return [(ids[1], _Term.of(f"where({x}, {d}, 0.0)", shape)), (ids[2], _Term.of(f"where({x}, 0.0, {d})", shape))]
        self.error(ins.loc, f"fusec cannot differentiate '{op}' yet")


class _Printer:
    """A stage's instructions as .fz expressions over the backward's names (memoised)."""

    def __init__(self, backward: _Backward, stage: Stage, substitute: bool = True):
        self.backward, self.instrs = backward, stage.body.instrs
        self.done: dict[int, str] = {i: text for i, (text, _) in backward.saved_in(stage).items()} \
            if substitute else {}  # saved: read

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
    """The statements something after them reads (a forward value the backward takes saved, or
    needs none of, is not recomputed; an adjoint that reaches no gradient is dropped), then `rest`."""
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
