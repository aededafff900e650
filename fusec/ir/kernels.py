"""Kernels: what one fused kernel computes (`passes.build_kernel`).

A kernel is a run of stages over one iteration space, merged into one SSA
body: the values it loads, the computation, and the values it stores. How its
threads map onto the elements, and which functions are emitted for it, is the
launch interface's business (`ir.launch`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fusec.ir.program import Body, Dim, Shape
from fusec.ir.stages import Decision
from fusec.types import ScalarType


# The row reductions a row kernel's body may hold: each reduces its first operand
# over the row ("row_pick": the element where the column equals its second
# operand, 0 where none does); "row_length" is the row's length. A statement's
# mean, variance and log-sum-exp are written with them (passes.build_kernel).
ROW_REDUCTIONS = ("row_sum", "row_max", "row_min", "row_pick")
ROW_OPS = ROW_REDUCTIONS + ("row_length",)


@dataclass(frozen=True, slots=True)
class Access:
    """A load or store of one value by a kernel.

    `present` has one flag per collapsed dim of the kernel's iteration space:
    whether the value varies along it (False: broadcast along that dim).
    """

    value: str
    buffer: str
    type: ScalarType
    present: tuple[bool, ...]

    @property
    def contiguous(self) -> bool:
        return all(self.present)

    @property
    def broadcast(self) -> bool:
        """Read along some dims only: through index arithmetic on the coordinates."""
        return any(self.present) and not all(self.present)


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    stages: tuple[str, ...]
    shape: Shape                          # iteration space
    extents: tuple[tuple[Dim, ...], ...]  # collapsed dims, each a product of dims
    body: Body                            # loads first, then computation
    loads: tuple[Access, ...]
    stores: tuple[tuple[Access, int], ...]  # (where, body instruction stored)
    scalars: tuple[str, ...]              # scalar values read (by name)
    decisions: tuple[Decision, ...] = field(default=())
    # A repeat body iterated in registers: `carried` pairs each loop value's load
    # with its exit value (body instructions), the load standing for the variable
    # the loop updates.
    carried: tuple[tuple[int, int], ...] = ()
    # A row kernel (ir.launch.RowBlock): one block per row; the last collapsed
    # extent is the row, and the body may hold row reductions (build_kernel.ROW_OPS).
    rows: bool = False

    @property
    def accesses(self) -> tuple[Access, ...]:
        return self.loads + tuple(a for a, _ in self.stores)

    @property
    def needs_coordinates(self) -> bool:
        """Whether some operand is read along only some dims (a broadcast needing index arithmetic)."""
        return any(a.broadcast for a in self.loads)
