"""Building one kernel from a run of stages: the merged body and its accesses.

Used by the fusion pass to price a candidate merge and by the plan pass to
build the final kernels, so that what the fusion pass prices is the kernel
that is emitted.
"""
from __future__ import annotations

from typing import Callable

from fusec.ir.kernels import Access, Kernel
from fusec.ir.program import Body, BodyBuilder, Dim, Instr, Shape
from fusec.ir.stages import Loop, Stage, StageGraph


def build_kernel(graph: StageGraph, stages: list[Stage], stored: set[str], name: str = "",
                 loop: Loop | None = None, merged: "Merged | None" = None) -> Kernel:
    """One kernel for `stages`, storing the values in `stored`. With `loop`, a
    loop kernel: the stages are the loop's whole body, iterated in registers; each
    carried slot's loop value is loaded once, updated with its exit value after
    every iteration, and stored at the end if it is in `stored`.

    Stages that share rows (Stage.rows) with a row reduction among them, or with
    several shapes, make a row kernel over [*rows, length]: its body holds the
    reductions as instructions (ROW_OPS), each value a whole row's, and may
    hold partial column sums of its elements (a "col_partial" instruction,
    stored as each column's COLUMN_CHUNKS sums).

    `merged`: these stages' bodies merged already (`Merged.extended`), or None."""
    rows = stages[0].rows
    row_kernel = rows is not None and (any(s.row_reduction for s in stages) or len({s.shape for s in stages}) > 1)
    shape = rows[0] + (rows[1],) if row_kernel else stages[0].shape
    total = stages[0].total is not None and any(s.column for s in stages)
    if total:  # over the rows its partial sums add up (a group of finishes alone: over their 128 runs)
        shape = next((s.shape for s in stages if s.reduce == "col_partial"), shape)
    if loop is not None:  # a loop value needed after the loop is loaded even if the body never reads it
        def loop_loads(loaded: dict[str, int]) -> list[Instr]:
            return [Instr("load", (), graph.value(lv).type, lv)
                    for lv, _ in loop.carried if lv in stored and lv not in loaded]
        merged = Merged(stages, loop_loads)
    elif merged is None:
        merged = Merged(stages)
    loaded, value_ids = merged.loaded, merged.value_ids
    if loop is None:
        stores = [(out, value_ids[out]) for stage in stages for out in stage.outputs if out in stored]
        carried = []
    else:  # a loop value's load instruction stands for its variable, which ends holding the final value
        stores = [(lv, loaded[lv]) for lv, _ in loop.carried if lv in stored]
        carried = [(loaded[lv], value_ids[ev], lv) for lv, ev in loop.carried if lv in loaded]
    body, remap = live_only(merged.builder.build([]), [i for _, i in stores] + [ev for _, ev, _ in carried])
    stores = [(v, remap[i]) for v, i in stores]
    loaded = {v: remap[i] for v, i in loaded.items() if i in remap}
    carried = [(remap[lv], remap[ev]) for lv, ev, name in carried if name in loaded]

    array_loads = [v for v in loaded if graph.value(v).shape is not None]
    operand_shapes = [graph.value(v).shape for v in array_loads] + [graph.value(v).shape for v, _ in stores]
    columns = any(s.column for s in stages)
    # an element's place along the last dim (row_position) needs that dim its own extent
    position = any(ins.op == "position" for ins in body.instrs)
    if columns and not row_kernel:
        extents, presence = collapse_columns(shape, operand_shapes, keep_last=position)
    else:
        extents, presence = (collapse_rows if row_kernel or position else collapse)(shape, operand_shapes)
    loads = tuple(_access(graph, v, p) for v, p in zip(array_loads, presence))
    store_access = tuple((_access(graph, v, p), i) for (v, i), p in zip(stores, presence[len(array_loads):]))
    scalars = tuple(v for v in loaded if graph.value(v).shape is None)
    return Kernel(name, tuple(s.name for s in stages), shape, extents, body, loads, store_access, scalars,
                  carried=tuple(carried), rows=row_kernel, columns=columns, total=total)


class Merged:
    """Stages' bodies merged as a kernel's body, before what no store needs is
    dropped: every load first (in order of first use: all of them in flight
    before any math), then the stages' instructions in program order, identical
    ones shared (all ops are pure). A stage that loads nothing new extends it
    (`extended`) without merging the others again: the fusion pass builds a
    group from the group one stage shorter."""

    def __init__(self, stages: list[Stage], loop_loads: Callable[[dict[str, int]], list[Instr]] | None = None):
        """`loop_loads(loaded)`: a loop kernel's loads beyond its stages' (after theirs)."""
        self.stages = list(stages)
        self.produced = {v for s in stages for v in s.outputs}  # a value computed in the kernel is not loaded
        self.builder = BodyBuilder()
        self.loaded: dict[str, int] = {}
        for stage in stages:
            for ins in self._new_loads(stage):
                self.loaded[ins.attr] = self.builder.emit(ins)
        for ins in loop_loads(self.loaded) if loop_loads else ():
            self.loaded[ins.attr] = self.builder.emit(ins)
        self.value_ids: dict[str, int] = dict(self.loaded)
        for stage in stages:
            self._add(stage)

    def extended(self, stage: Stage) -> "Merged":
        """These stages and `stage` merged (the same as merging them all afresh)."""
        new_loads = self._new_loads(stage, self.produced | set(stage.outputs))
        # new loads go before every instruction; a value computed by `stage` is not to be loaded
        if new_loads or any(v in self.loaded for v in stage.outputs):
            return Merged(self.stages + [stage])
        new = Merged.__new__(Merged)
        new.stages, new.produced = self.stages + [stage], self.produced | set(stage.outputs)
        new.builder, new.loaded, new.value_ids = self.builder.copy(), self.loaded, dict(self.value_ids)
        new._add(stage)
        return new

    def _new_loads(self, stage: Stage, produced: set[str] | None = None) -> list[Instr]:
        produced = self.produced if produced is None else produced
        return [ins for ins in stage.body.instrs
                if ins.op == "load" and ins.attr not in produced and ins.attr not in self.loaded]

    def _add(self, stage: Stage) -> None:
        b, value_ids = self.builder, self.value_ids
        ids: list[int] = []
        for ins in stage.body.instrs:
            if ins.op == "load":
                ids.append(value_ids[ins.attr])
            else:
                ids.append(b.emit(Instr(ins.op, tuple(ids[a] for a in ins.args), ins.type, ins.attr, loc=ins.loc)))
        if stage.column:  # the body's value at each element, summed over the first axis
            result = stage.body.instrs[stage.body.results[0]]
            value_ids[stage.outputs[0]] = b.emit(Instr(stage.reduce, (ids[stage.body.results[0]],), result.type,
                                                       loc=stage.loc))
        elif stage.reduce:
            operands = [ids[r] for r in stage.body.results]
            value_ids[stage.outputs[0]] = _reduction(b, stage.reduce, operands, stage.body.instrs[stage.body.results[0]])
        else:
            for out, result in zip(stage.outputs, stage.body.results):
                value_ids[out] = ids[result]


def _reduction(b: BodyBuilder, op: str, operands: list[int], value: Instr) -> int:
    """The statement's row reduction `op` as instructions: mean, variance and
    log-sum-exp from sums and maxima, as the reference computes them."""
    t = value.type  # the accumulation type (the checker converts to it)

    def emit(name: str, *args: int, type_=t) -> int:
        return b.emit(Instr(name, args, type_, loc=value.loc))
    x = operands[0]
    if op in ("sum", "max", "min", "pick"):
        return emit(f"row_{op}", *operands)
    length = emit("row_length")
    if op == "length":  # row_length(x): x is not computed
        return length
    if op == "mean":
        return emit("div", emit("row_sum", x), length)
    if op == "var":
        deviation = emit("sub", x, emit("div", emit("row_sum", x), length))
        return emit("div", emit("row_sum", emit("mul", deviation, deviation)), length)
    if op == "logsumexp":  # in one pass over the row (online); an infinite or NaN max is the result
        return emit("row_lse", x)
    raise ValueError(f"unknown row reduction {op!r}")


def live_only(body: Body, roots: list[int]) -> tuple[Body, dict[int, int]]:
    """Drops instructions no store depends on (a dead temporary); returns old -> new ids."""
    live = set(roots)
    for idx in range(len(body.instrs) - 1, -1, -1):
        if idx in live:
            live.update(body.instrs[idx].args)
    if len(live) == len(body.instrs):  # nothing dead: the body as it is
        return body, dict(zip(range(len(live)), range(len(live))))
    remap: dict[int, int] = {}
    kept = []
    for idx, ins in enumerate(body.instrs):
        if idx in live:
            remap[idx] = len(kept)
            args = tuple(remap[a] for a in ins.args)
            kept.append(ins if args == ins.args else Instr(ins.op, args, ins.type, ins.attr, loc=ins.loc))
    return Body(tuple(kept), ()), remap


def _access(graph: StageGraph, value: str, present: tuple[bool, ...]) -> Access:
    v = graph.value(value)
    return Access(v.name, v.buffer, v.type, present)


def collapse_rows(shape: Shape, operands: list[Shape]) -> tuple[tuple[tuple[Dim, ...], ...], list[tuple[bool, ...]]]:
    """As `collapse`, with the last dim (a row reduction's row) always its own extent, even a literal 1."""
    lead, lead_presence = collapse(shape[:-1], [op[:-1] for op in operands])  # right-aligned, as in `collapse`
    last = [len(op) >= 1 and op[-1] != 1 for op in operands]
    return lead + ((shape[-1],),), [p + (v,) for p, v in zip(lead_presence, last)]


def collapse_columns(shape: Shape, operands: list[Shape],
                     keep_last: bool = False) -> tuple[tuple[tuple[Dim, ...], ...], list[tuple[bool, ...]]]:
    """As `collapse`, with the first dim (a column reduction's) always its own extent,
    even a literal 1, and the others collapsed (none: one column; with `keep_last`,
    the last dim its own extent too). A column kernel's store (its sums, not of this
    shape) is the emitter's to place."""
    rank = len(shape)
    rest_operands = [op[-(rank - 1):] if len(op) >= rank else op for op in operands]
    rest, rest_presence = (collapse_rows if keep_last and rank > 1 else collapse)(shape[1:], rest_operands)
    first = [len(op) == rank and op[0] != 1 for op in operands]
    return ((shape[0],),) + rest, [(v,) + p for v, p in zip(first, rest_presence)]


def collapse(shape: Shape, operands: list[Shape]) -> tuple[tuple[tuple[Dim, ...], ...], list[tuple[bool, ...]]]:
    """Merges adjacent dims of the iteration space along which every operand
    varies alike; returns the collapsed extents and, per operand, along which
    of them it varies (a broadcast operand does not)."""
    rank = len(shape)
    columns = []
    for op_shape in operands:
        offset = rank - len(op_shape)
        columns.append([j >= offset and op_shape[j - offset] != 1 for j in range(rank)])
    groups: list[list[int]] = []
    for j in range(rank):
        if shape[j] == 1:
            continue  # a literal 1 in the iteration space takes no part
        if groups and all(col[j] == col[groups[-1][-1]] for col in columns):
            groups[-1].append(j)
        else:
            groups.append([j])
    extents = tuple(tuple(shape[j] for j in g) for g in groups)
    presence = [tuple(col[g[0]] for g in groups) for col in columns]
    return extents, presence
