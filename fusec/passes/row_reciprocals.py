"""Division by a per-row sum as a multiplication by its reciprocal, once a row.

`y = e / row_sum(e)` divides every element by one value of its row. An IEEE
division costs a thread about ten instructions an element (a reciprocal, its
refinement, a range check); in a bf16 row kernel that is what keeps softmax
below the copy's rate (benchmarks/row_sass.py: 38.9 -> 26.5 instructions an
element at 4 Ki, against about 33 at the copy's rate). Where the divisor is
held to a tolerance anyway (it is computed from a row_sum, row_mean, row_var
or row_logsumexp, whose order a GPU does not keep: README, "Row reductions"),
the division becomes

    c = 2^64 if |d| < 2^-64, 2^-64 if |d| > 2^64, else 1     (once a row)
    r = 1 / (d * c)                                          (once a row)
    y = (a * c) * r                                          (an element)

within 1.5 ulp of a / d: d * c is exact and its reciprocal a normal number, so
subnormal and huge divisors stay within that bound, and 0, infinities and NaN
give what the division gives (a * c overflows only where a / d does). A divisor
computed from exact values only (row_max, row_pick, row_length, inputs) keeps
its division, as does a value per row divided by one (no element to save on).
Every form of the pipeline (fused, unfused, each backend but the NumPy
reference) computes the same rewritten body, so they agree bit for bit.
"""
from __future__ import annotations

from dataclasses import replace

from fusec.ir.program import Body, BodyBuilder, Instr
from fusec.ir.stages import StageGraph
from fusec.types import BOOL

# Reductions whose results a GPU computes in another order than the reference.
INEXACT_REDUCTIONS = ("sum", "mean", "var", "logsumexp")
SCALE = 2.0 ** 64


def divide_by_row_reciprocals(graph: StageGraph) -> StageGraph:
    shapes = {v.name: v.shape for v in graph.values}
    inexact: set[str] = set()  # values per row computed from an inexact reduction
    stages = []
    for stage in graph.stages:
        reads = {ins.attr for ins in stage.body.instrs if ins.op == "load"}
        if stage.reduce in INEXACT_REDUCTIONS or (not stage.reduce and _per_row_shape(stage.shape) and reads & inexact):
            inexact.update(stage.outputs)
        if stage.shape and not _per_row_shape(stage.shape):
            stage = replace(stage, body=_rewrite(stage.body, shapes, inexact))
        stages.append(stage)
    return replace(graph, stages=tuple(stages))


def _per_row_shape(shape) -> bool:
    """A value the same along the row: a scalar, or a trailing dim of 1."""
    return not shape or shape[-1] == 1


def _rewrite(body: Body, shapes: dict, inexact: set[str]) -> Body:
    per_row: list[bool] = []  # per instruction: the same along the row
    tainted: list[bool] = []  # per instruction: reads an inexact per-row value
    for ins in body.instrs:
        if ins.op == "load":
            per_row.append(_per_row_shape(shapes.get(ins.attr)))
            tainted.append(ins.attr in inexact)
        elif not ins.args:  # a constant or the row's length; anything else (row_position) varies
            per_row.append(ins.op in ("const", "row_length"))
            tainted.append(False)
        else:
            per_row.append(all(per_row[a] for a in ins.args))
            tainted.append(any(tainted[a] for a in ins.args))
    targets = [i for i, ins in enumerate(body.instrs)
               if ins.op == "div" and ins.type.name in ("f32", "f64") and not per_row[ins.args[0]]
               and per_row[ins.args[1]] and tainted[ins.args[1]]]
    if not targets:
        return body
    b, ids = BodyBuilder(), []
    for i, ins in enumerate(body.instrs):
        args = tuple(ids[a] for a in ins.args)
        if i not in targets:
            ids.append(b.emit(replace(ins, args=args)))
            continue
        t, loc = ins.type, ins.loc

        def emit(op: str, *operands: int, type_=t) -> int:
            return b.emit(Instr(op, operands, type_, loc=loc))

        def const(value: float) -> int:
            return b.emit(Instr("const", (), t, value, loc=loc))
        a, d = args
        magnitude = emit("abs", d)
        scale = emit("select", emit("lt", magnitude, const(1 / SCALE), type_=BOOL), const(SCALE),
                     emit("select", emit("gt", magnitude, const(SCALE), type_=BOOL), const(1 / SCALE), const(1.0)))
        reciprocal = emit("div", const(1.0), emit("mul", d, scale))
        ids.append(emit("mul", emit("mul", a, scale), reciprocal))
    return b.build([ids[r] for r in body.results])
