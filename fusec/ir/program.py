"""The checked, typed IR of a .fz program.

Scalar code is SSA: a `Body` is a list of `Instr`s, each naming its operands
by index into the same list, so a stage body is an expression DAG (a `let`
used twice is one instruction). A pipeline is an ordered list of `Apply`
statements (and `Repeat` blocks) over named `Slot`s, each with its type and
shape. All nodes are frozen; passes build new ones with `dataclasses.replace`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from fusec.errors import Loc, Source, loc_field
from fusec.types import ScalarType

Dim = Union[str, int]          # a dim: a name bound at call time, or a literal
Shape = tuple[Dim, ...]


@dataclass(frozen=True, slots=True)
class Instr:
    """One SSA instruction.

    op: "const" (attr = value), "arg" (attr = stage parameter index),
    "load" (attr = slot name), "call" (attr = (stage, result index)),
    "cast" (to `type`), or an operator / builtin name ("add", "exp", ...).
    A value of type f16/bf16 holds f32 precision until a "cast" or a store
    rounds it.
    """

    op: str
    args: tuple[int, ...]
    type: ScalarType
    attr: object = None
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Body:
    instrs: tuple[Instr, ...]
    results: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StageFn:
    name: str
    params: tuple[tuple[str, ScalarType], ...]
    results: tuple[tuple[str, ScalarType], ...]
    body: Body
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Slot:
    """A named pipeline value. `shape` is None for a scalar.

    role: "in" (read-only array), "inout", "out" (declared output),
    "temp" (assigned in the body), "scalar" (scalar parameter).
    """

    name: str
    type: ScalarType
    shape: Shape | None
    role: str
    loc: Loc = loc_field()

    @property
    def is_array(self) -> bool:
        return self.shape is not None


# Column reductions (builtins.COLUMN_REDUCTIONS, as these ops): a sum over the first axis in a
# fixed order, so that a result is the same from run to run and on every backend:
# the rows split into COLUMN_CHUNKS runs of ceil(rows / COLUMN_CHUNKS) consecutive
# rows, each summed in order from 0 ("col_partial"), then the chunks' sums in order
# ("col_sum" over them). 128 chunks give a GPU grid of 128 blocks per 256 columns
# (every SM of an H200 busy from 256 columns on); the second sum reads 128 values
# a column.
COLUMN_CHUNKS = 128
COLUMN_OPS = ("col_partial", "col_sum")


def reduced_shape(op: str, shape: tuple) -> tuple:
    """The shape of what an Apply with reduction `op` over `shape` stores (`shape`'s
    dims named or sized): a row reduction's `[..., 1]`, a column reduction's without
    the first dim, or its COLUMN_CHUNKS partial sums."""
    if op == "col_partial":
        return (COLUMN_CHUNKS,) + tuple(shape[1:])
    if op == "col_sum":
        return tuple(shape[1:])
    return tuple(shape[:-1]) + (1,)


@dataclass(frozen=True, slots=True)
class Apply:
    """One pipeline statement, i.e. one stage: computes `body.results` over the
    iteration space `shape` and stores them (converted to each target's type)
    into `targets`. `callee` names the stage it calls, None for an inline expression.

    With `reduce` (a row reduction, "sum", "max", ...; builtins.ROW_REDUCTIONS),
    the body's first result is reduced over the last axis of `shape` into the one
    target, of shape `shape[:-1] + (1,)`, in the accumulation type; for "pick" the
    second result is each row's index. With a column reduction (COLUMN_OPS)
    it is summed over the first axis of `shape`, in the order COLUMN_CHUNKS fixes:
    "col_partial" into COLUMN_CHUNKS sums of consecutive rows (a target of shape
    `(COLUMN_CHUNKS,) + shape[1:]`), "col_sum" into one (a target of shape `shape[1:]`);
    the checker writes `col_sum(x)` as the one and then the other over its chunks."""

    targets: tuple[str, ...]
    body: Body
    shape: Shape
    callee: str | None
    loc: Loc = loc_field()
    reduce: str | None = None


@dataclass(frozen=True, slots=True)
class Repeat:
    """`repeat count { body }`; count is a literal (0 to 2^63 - 1) or an integer scalar parameter.

    unassigned_if_zero: the outputs read after this loop (or returned) that only
    it assigns. With a count of 0 they would hold uninitialised memory, so a call
    whose count parameter is 0 is an `ArgumentError` (a literal 0 is a checker
    error); empty where a count of 0 is fine.
    """

    count: int | str
    body: tuple["Stmt", ...]
    unassigned_if_zero: tuple[str, ...] = ()
    loc: Loc = loc_field()


Stmt = Union[Apply, Repeat]


@dataclass(frozen=True, slots=True)
class DimEq:
    """Two dims that must be equal at call time (they met in a broadcast)."""

    a: Dim
    b: Dim
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Pipeline:
    name: str
    params: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    slots: tuple[Slot, ...]      # every slot: params, outputs and temps
    body: tuple[Stmt, ...]
    dim_eqs: tuple[DimEq, ...]
    loc: Loc = loc_field()

    def slot(self, name: str) -> Slot:
        for s in self.slots:
            if s.name == name:
                return s
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class Program:
    stages: tuple[StageFn, ...]
    pipelines: tuple[Pipeline, ...]
    source: Source

    def stage(self, name: str) -> StageFn:
        return next(s for s in self.stages if s.name == name)

    def pipeline(self, name: str) -> Pipeline:
        return next(p for p in self.pipelines if p.name == name)


def fmt_shape(shape: Shape | None) -> str:
    return "scalar" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def walk_applies(stmts: tuple[Stmt, ...]):
    """Every Apply, depth first, in program order."""
    for stmt in stmts:
        if isinstance(stmt, Repeat):
            yield from walk_applies(stmt.body)
        else:
            yield stmt


class BodyBuilder:
    """Appends instructions to a Body, sharing identical ones (all ops are pure)."""

    def __init__(self) -> None:
        self.instrs: list[Instr] = []
        self._index: dict[tuple, int] = {}

    def emit(self, instr: Instr) -> int:
        # repr(attr) keeps 0.0 and -0.0 (equal as floats) apart.
        key = (instr, repr(instr.attr))
        found = self._index.get(key)
        if found is not None:
            return found
        self.instrs.append(instr)
        self._index[key] = len(self.instrs) - 1
        return len(self.instrs) - 1

    def build(self, results) -> Body:
        return Body(tuple(self.instrs), tuple(results))

    def copy(self) -> "BodyBuilder":
        """A builder holding the same instructions, to go on emitting apart from this one."""
        new = BodyBuilder()
        new.instrs, new._index = list(self.instrs), dict(self._index)
        return new
