"""The stage graph: the IR after lowering (`passes.lower`).

One `Stage` per pipeline statement over SSA `Value`s, each stage body inlined
into one instruction list whose "load"s name values; `repeat` blocks as
`Loop`s. The fusion pass partitions it into kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

from fusec.errors import Loc, loc_field
from fusec.ir.program import COLUMN_OPS, Body, Dim, Shape
from fusec.types import ScalarType


@dataclass(frozen=True, slots=True)
class Value:
    """One SSA version of a pipeline slot. `shape` is None for a scalar."""

    name: str       # unique: "h", "h.1", ...
    buffer: str     # the slot whose memory holds it
    type: ScalarType
    shape: Shape | None
    role: str       # the slot's role: "in", "inout", "out", "temp", "scalar"


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    shape: Shape                  # iteration space
    body: Body                    # no "call"; "load" attr names a Value
    outputs: tuple[str, ...]      # the Value each body result is stored as
    loc: Loc = loc_field()
    # A reduction (ir.program.Apply.reduce): over the row, one output of shape [..., 1];
    # or over the first axis (COLUMN_OPS), one output without it.
    reduce: str | None = None
    # The rows (leading dims, row length) of the reductions this stage may share
    # a kernel with: a reduction's own, or those its shape is [*rows, length] or [*rows, 1] of.
    rows: tuple[Shape, Dim] | None = None
    # A total over the rows (passes.lower.assign_totals): the rows' dim of the column
    # sums of one column this stage computes, finishes, or is a statement over the
    # finished sums of (their kernel: a block of a thread a run of rows).
    total: Dim | None = None

    @property
    def column(self) -> bool:
        """A column reduction (each thread of its kernel sums a column's run of rows)."""
        return self.reduce in COLUMN_OPS

    @property
    def row_reduction(self) -> bool:
        return self.reduce is not None and not self.column

    @property
    def space(self) -> tuple:
        """What stages must share to be one kernel: the same rows (a row kernel:
        one block per row), or else the same elementwise iteration space. A
        column reduction's partial sums share the space of the elements they
        sum (their kernel also computes, and stores, the statements over those
        elements), or their rows' where they have some (a row kernel adds them
        up as it takes its rows); its finish, over the partial sums, shares its
        kernel with no other stage. A total (column sums of one column) shares its
        rows' dim with the other totals over them, their finishes and the
        statements over those: one kernel, of one block."""
        if self.total is not None:
            return ("total", self.total)
        if self.column and not self.rows:  # (only partial sums are given rows: passes.lower.assign_rows)
            return ("elements", self.shape) if self.reduce == "col_partial" else ("columns", self.name)
        return ("rows",) + self.rows if self.rows else ("elements", self.shape)

    def reads(self) -> set[str]:
        return {i.attr for i in self.body.instrs if i.op == "load"}


@dataclass(frozen=True, slots=True)
class Loop:
    """`repeat count { ... }`: stages [start, stop) run `count` times (a literal,
    or the name of an integer scalar parameter).

    carried: (loop value, exit value) per slot the body assigns that existed
    before it. The body reads the loop value; an iteration ends with the exit
    value in the slot's buffer; after the loop the slot's value is the loop value.
    """

    count: int | str
    start: int
    stop: int
    carried: tuple[tuple[str, str], ...]
    entries: tuple[str, ...] = ()   # each carried slot's value when the loop starts
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class StageGraph:
    pipeline: str
    values: tuple[Value, ...]
    stages: tuple[Stage, ...]
    results: tuple[str, ...]      # values that must reach memory: final versions of inout/out slots
    loops: tuple[Loop, ...] = ()
    # Also must reach memory: what a loop reads from its slots' buffers when it starts.
    loop_inputs: tuple[str, ...] = ()

    def loop_of(self, stage_index: int) -> int:
        """Which loop a stage is in (-1: none)."""
        return next((k for k, loop in enumerate(self.loops) if loop.start <= stage_index < loop.stop), -1)

    def value(self, name: str) -> Value:
        return _by_name(self.values, name)


def _by_name(items, name):
    for item in items:
        if item.name == name:
            return item
    raise KeyError(name)


@dataclass(frozen=True, slots=True)
class Decision:
    """Why a stage joined a kernel, or why it did not join a candidate."""

    stage: str
    kernel: int
    merged: bool
    reason: str
