"""Lowering: a checked pipeline -> a `StageGraph`.

Each statement becomes one stage whose body has every stage call inlined
(locals and multi-output stages stay shared subexpressions: identical
instructions are one), and whose loads name SSA versions of the slots. A
`repeat` block becomes a `Loop` over its stages: each slot it carries gets a
loop value (`h.loop0`, in the slot's buffer) that the body reads and that
stands for the slot after the loop.

A scalar-only statement (`t = s * 2.0;`: no array operand, so a 0-D stage) is
then inlined into the stages that read it (`inline_scalar_statements`): it
costs no kernel and no memory.
"""
from __future__ import annotations

from dataclasses import replace

from fusec.errors import Diagnostic, FzError
from fusec.ir.program import COLUMN_OPS, Apply, Body, BodyBuilder, Instr, Pipeline, Program, Repeat, walk_applies
from fusec.ir.stages import Loop, Stage, StageGraph, Value


def lower(program: Program, pipeline: Pipeline) -> StageGraph:
    values: list[Value] = []
    current: dict[str, str] = {}  # slot -> its current version

    def new_version(slot_name: str) -> str:
        slot = pipeline.slot(slot_name)
        count = sum(1 for v in values if v.buffer == slot_name)
        name = slot_name if count == 0 else f"{slot_name}.v{count}"  # not t.2: the checker names a re-typed t so
        values.append(Value(name, slot_name, slot.type, slot.shape, slot.role))
        current[slot_name] = name
        return name

    for param in pipeline.params:
        new_version(param.name)

    stages: list[Stage] = []
    loops: list[Loop] = []
    loop_inputs: list[str] = []
    names: dict[str, int] = {}
    for stmt in pipeline.body:
        if isinstance(stmt, Apply):
            stages.append(_stage(program, stmt, current, new_version, names))
            continue
        if any(isinstance(s, Repeat) for s in stmt.body):
            raise FzError(Diagnostic(stmt.loc, "code generation for a 'repeat' inside a 'repeat' is not "
                                               "implemented yet; run this pipeline with backend='numpy'"),
                          program.source)
        assigned = list(dict.fromkeys(t for a in walk_applies(stmt.body) for t in a.targets))
        for t in assigned:
            if t not in current and pipeline.slot(t).role == "out":
                # An output only the loop assigns is carried too, so that its last value is
                # stored; its entry is the unwritten buffer, which the body never reads (the
                # checker sees to that, and the binder to a count of at least 1).
                new_version(t)
        carried_slots = [t for t in assigned if t in current]
        loop_inputs += [current[t] for t in carried_slots]
        loop_values = []
        for t in carried_slots:
            slot = pipeline.slot(t)
            loop_values.append(f"{t}.loop{len(loops)}")
            values.append(Value(loop_values[-1], t, slot.type, slot.shape, slot.role))
            current[t] = loop_values[-1]
        start = len(stages)
        for inner in stmt.body:
            stages.append(_stage(program, inner, current, new_version, names))
        carried = tuple((lv, current[t]) for lv, t in zip(loop_values, carried_slots))
        for lv, t in zip(loop_values, carried_slots):
            current[t] = lv  # after the loop the slot holds its loop value
        entries = tuple(loop_inputs[len(loop_inputs) - len(carried_slots):])
        loops.append(Loop(stmt.count, start, len(stages), carried, entries, loc=stmt.loc))

    # What must reach memory: each output's last version, and each inout's if it was assigned.
    results = tuple(current[s.name] for s in pipeline.slots
                    if (s.role == "out" and s.name in current) or (s.role == "inout" and current[s.name] != s.name))
    graph = StageGraph(pipeline.name, tuple(values), tuple(stages), results, tuple(loops), tuple(loop_inputs))
    return assign_totals(assign_rows(inline_scalar_statements(graph)))


# Whether a row kernel may hold the partial column sums of its elements (a
# block a run of rows: ir.launch.RowBlock.chunks); benchmarks turn it off to
# time the column sums in kernels of their own.
ROW_COLUMN_SUMS = True


def assign_rows(graph: StageGraph) -> StageGraph:
    """Marks each stage that may join a row kernel with its rows: every row
    reduction, each stage outside loops over [*rows, length] or [*rows, 1]
    of a reduction's (the first such, in program order), and the partial
    column sums over [rows, length] of a reduction of one leading dim (a row
    kernel taking its runs of rows in order adds them up as it goes)."""
    spaces = [(s.shape[:-1], s.shape[-1]) for s in graph.stages if s.row_reduction]
    if not spaces:
        return graph
    stages = []
    for index, stage in enumerate(graph.stages):
        rows = None
        if stage.row_reduction:
            rows = (stage.shape[:-1], stage.shape[-1])
        elif stage.shape and graph.loop_of(index) < 0 and not stage.column:
            rows = next(((lead, length) for lead, length in spaces
                         if stage.shape[:-1] == lead and stage.shape[-1] in (length, 1)), None)
        elif stage.reduce == "col_partial" and ROW_COLUMN_SUMS and graph.loop_of(index) < 0 and len(stage.shape) == 2:
            # (a row of a literal length 1 is a value per row, not elements the row kernel sums)
            rows = next(((lead, length) for lead, length in spaces
                         if len(lead) == 1 and length != 1 and stage.shape == lead + (length,)), None)
        stages.append(replace(stage, rows=rows) if rows else stage)
    return replace(graph, stages=tuple(stages))


# Whether the column sums of one column (a total over the rows: `col_sum(loss)` of
# [rows, 1]) finish in their partial sums' kernel, with the statements over their
# results (ir.launch.ColumnReduce.total); benchmarks turn it off to time the
# kernels apart.
TOTALS = True


def assign_totals(graph: StageGraph) -> StageGraph:
    """Marks each total with its rows' dim (Stage.total): a "col_partial" of one
    column (its shape's dims after the first all a literal 1) outside loops and
    row kernels, the "col_sum" that finishes it, and each statement outside loops
    over one element (every dim a literal 1) that reads finished totals of those
    rows and scalars only. They share a kernel (Stage.space): a block whose
    threads each add up a run of rows, then the runs' sums added in order, then
    the statements over them, so cross-entropy's mean is one kernel."""
    if not TOTALS:
        return graph
    finished: dict[str, object] = {}  # a value -> the rows' dim of the totals it is computed from
    partial: dict[str, object] = {}   # a partial sums' value -> its rows' dim
    scalars = {v.name for v in graph.values if v.shape is None}
    stages = []
    for index, stage in enumerate(graph.stages):
        total = None
        reads = stage.reads()
        if graph.loop_of(index) >= 0 or stage.rows:
            pass
        elif stage.reduce == "col_partial" and stage.shape and all(d == 1 for d in stage.shape[1:]):
            total = stage.shape[0]
            partial[stage.outputs[0]] = total
        elif stage.reduce == "col_sum" and len(reads) == 1 and next(iter(reads)) in partial:
            total = partial[next(iter(reads))]
            finished[stage.outputs[0]] = total
        elif not stage.reduce and all(d == 1 for d in stage.shape):
            of = {finished[v] for v in reads if v in finished}
            if len(of) == 1 and all(v in finished or v in scalars for v in reads):
                total = of.pop()
                finished.update((v, total) for v in stage.outputs)
        stages.append(replace(stage, total=total) if total is not None else stage)
    return replace(graph, stages=tuple(stages))


def _stage(program: Program, stmt: Apply, current: dict[str, str], new_version, names: dict[str, int]) -> Stage:
    body = inline(program, stmt.body, dict(current))
    outputs = tuple(new_version(t) for t in stmt.targets)
    return Stage(_stage_name(stmt, names), stmt.shape, body, outputs, loc=stmt.loc, reduce=stmt.reduce)


def _stage_name(stmt: Apply, taken: dict[str, int]) -> str:
    """The callee's name, or the first target's for an inline expression; made unique."""
    reduction = stmt.reduce if stmt.reduce in COLUMN_OPS else f"row_{stmt.reduce}"
    base = stmt.callee or (reduction if stmt.reduce else stmt.targets[0].split(".")[0])
    taken[base] = taken.get(base, 0) + 1
    return base if taken[base] == 1 else f"{base}_{taken[base]}"


def inline(program: Program, body: Body, versions: dict[str, str]) -> Body:
    """Inlines every "call" and renames each load to the slot's current version."""
    b = BodyBuilder()
    ids = _inline_into(b, program, body, versions, [])
    return b.build([ids[r] for r in body.results])


def _inline_into(b: BodyBuilder, program: Program, body: Body, versions: dict[str, str] | None,
                 args: list[int]) -> list[int]:
    ids: list[int] = []
    for ins in body.instrs:
        operands = tuple(ids[a] for a in ins.args)
        if ins.op == "arg":
            ids.append(args[ins.attr])
        elif ins.op == "call":
            stage_name, index = ins.attr
            callee = program.stage(stage_name).body
            inner = _inline_into(b, program, callee, None, list(operands))
            ids.append(inner[callee.results[index]])
        elif ins.op == "load":
            ids.append(b.emit(Instr("load", (), ins.type, versions[ins.attr], loc=ins.loc)))
        else:
            ids.append(b.emit(Instr(ins.op, operands, ins.type, ins.attr, loc=ins.loc)))
    return ids


def inline_scalar_statements(graph: StageGraph) -> StageGraph:
    """Inlines each scalar-only statement into the stages that read its value.

    Such a stage has the 0-D iteration space and reads only scalar parameters
    (or values inlined before it). Its body ends in the store conversion of its
    target (f16/bf16 rounding, narrow-int wrapping: the checker puts it there),
    so a reader computes exactly the value it would have loaded. A 0-D stage
    stays a 0-D kernel where its value must be in memory: a pipeline result, or a
    value carried around a `repeat` (the loop's entry and exit values: each
    iteration reads what the previous one stored), and where it reads such a
    value (which a later statement may overwrite in the same buffer).
    """
    in_memory = set(graph.results) | set(graph.loop_inputs)
    in_memory |= {v for loop in graph.loops for pair in loop.carried for v in pair}
    scalars = {v.name for v in graph.values if v.shape is None}
    inlined: dict[str, tuple[Body, int]] = {}  # value -> the body computing it, and its result's index
    kept: list[int] = []
    stages: list[Stage] = []
    for index, stage in enumerate(graph.stages):
        body = _substitute(stage.body, inlined)
        reads = {ins.attr for ins in body.instrs if ins.op == "load"}
        if stage.shape == () and not in_memory & set(stage.outputs) and reads <= scalars:
            inlined.update((out, (body, body.results[k])) for k, out in enumerate(stage.outputs))
        else:
            kept.append(index)
            stages.append(replace(stage, body=body))
    if not inlined:
        return graph
    new_index = lambda old: sum(1 for k in kept if k < old)  # noqa: E731 (stage index after the drop)
    loops = tuple(replace(loop, start=new_index(loop.start), stop=new_index(loop.stop)) for loop in graph.loops)
    values = tuple(v for v in graph.values if v.name not in inlined)
    return replace(graph, values=values, stages=tuple(stages), loops=loops)


def _substitute(body: Body, inlined: dict[str, tuple[Body, int]]) -> Body:
    """`body` with each load of an inlined value replaced by the instructions computing it."""
    if not any(ins.op == "load" and ins.attr in inlined for ins in body.instrs):
        return body
    b = BodyBuilder()
    ids: list[int] = []
    for ins in body.instrs:
        if ins.op == "load" and ins.attr in inlined:
            ids.append(_splice(b, *inlined[ins.attr]))
        else:
            ids.append(b.emit(replace(ins, args=tuple(ids[a] for a in ins.args))))
    return b.build([ids[r] for r in body.results])


def _splice(b: BodyBuilder, body: Body, result: int) -> int:
    """Emits the instructions `result` depends on; returns its id in `b`."""
    needed = {result}
    for idx in range(result, -1, -1):
        if idx in needed:
            needed.update(body.instrs[idx].args)
    ids: dict[int, int] = {}
    for idx in sorted(needed):
        ins = body.instrs[idx]
        ids[idx] = b.emit(replace(ins, args=tuple(ids[a] for a in ins.args)))
    return ids[result]
