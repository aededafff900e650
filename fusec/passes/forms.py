"""A kernel's form (ir.launch.Form): how its threads map onto its elements.

Read by the plan pass, and by the fusion pass to price each candidate kernel
in the form it will run in.
"""
from __future__ import annotations

from fusec.ir.kernels import Kernel
from fusec.ir.launch import (
    ColumnReduce,
    CountArg,
    Elementwise,
    Form,
    GridStride,
    MultiTensor,
    RegisterLoop,
    RowBlock,
)
from fusec.ir.program import COLUMN_CHUNKS
from fusec.ir.stages import Loop
from fusec.target import FOREACH_CHUNK


def form_of(kernel: Kernel, multi_tensor: bool = False, grid_stride: bool = False, loop: Loop | None = None,
            slots: dict[str, int] | None = None) -> Form:
    """How `kernel`'s threads map onto its elements (the fusion pass prices candidates in it too)."""
    if kernel.rows:  # with column sums: a block a run of rows, adding them up as it goes
        return RowBlock(COLUMN_CHUNKS if kernel.columns else 0)
    if kernel.total:  # a total over the rows: one block, a thread a run, finished in it
        return ColumnReduce(COLUMN_CHUNKS, total=True)
    if kernel.columns:  # the chunks' partial sums, or the sum of all rows (of those chunks)
        return ColumnReduce(COLUMN_CHUNKS if any(ins.op == "col_partial" for ins in kernel.body.instrs) else 1)
    if loop is not None:
        return RegisterLoop(count_of(loop.count, slots) if slots is not None else loop.count)
    if multi_tensor:
        return MultiTensor(FOREACH_CHUNK)
    return GridStride() if grid_stride else Elementwise()


def count_of(count: int | str, slots: dict[str, int]) -> int | CountArg:
    """A repeat count as the launch reads it: a literal, or the slot of its parameter."""
    return count if isinstance(count, int) else CountArg(slots[count])
