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
# row_lse: the log-sum-exp in one pass (a running max and the sum of exp(x - max), rescaled as the max grows)
ROW_REDUCTIONS = ("row_sum", "row_max", "row_min", "row_pick", "row_lse")
ROW_OPS = ROW_REDUCTIONS + ("row_length",)


@dataclass(frozen=True, slots=True)
class RowSchedule:
    """How a row kernel computes its body: `per_element[i]` whether instruction
    i has a value per element of the row (else one per row); `rounds[i]` the
    row reductions it waits for (a reduction is known after a pass over the row,
    so round r's reductions share pass r); `passes[r - 1]` the per-element
    instructions pass r computes, and `passes[-1]` those of the last pass, which
    stores the row's elements (absent where none are stored); `roots[p]` the
    values pass p reduces or stores."""

    per_element: tuple[bool, ...]
    rounds: tuple[int, ...]
    passes: tuple[frozenset[int], ...]
    roots: tuple[tuple[int, ...], ...]

    @property
    def reductions(self) -> int:
        return max(self.rounds, default=0)

    def cached_loads(self, kernel: "Kernel") -> list["Access"]:
        """The contiguous loads a later pass reads again: kept in shared memory
        from the first pass that reads them, widest first (so each stays aligned)."""
        body = kernel.body.instrs
        seen, again = set(), set()
        for needed in self.passes:
            loaded = {body[i].attr for i in needed if body[i].op == "load"}
            again |= loaded & seen
            seen |= loaded
        return sorted((a for a in kernel.loads if a.contiguous and a.value in again),
                      key=lambda a: -a.type.itemsize)


def row_schedule(kernel: "Kernel") -> RowSchedule:
    body = kernel.body.instrs
    element_loads = {a.value for a in kernel.loads if a.present[-1]}
    per_element: list[bool] = []
    rounds: list[int] = []
    for ins in body:
        reduces = ins.op in ROW_REDUCTIONS
        per_element.append(not reduces and ((ins.op == "load" and ins.attr in element_loads)
                                            or any(per_element[a] for a in ins.args)))
        rounds.append(max((rounds[a] for a in ins.args), default=0) + reduces)
    roots = [[a for i, ins in enumerate(body) if ins.op in ROW_REDUCTIONS and rounds[i] == r for a in ins.args]
             for r in range(1, max(rounds, default=0) + 1)]
    element_stores = [at for a, at in kernel.stores if a.present[-1]]
    if element_stores:
        roots.append(element_stores)

    def cone(ids) -> frozenset[int]:
        needed = {i for i in ids if per_element[i]}
        for i in range(len(body) - 1, -1, -1):
            if i in needed:
                needed.update(a for a in body[i].args if per_element[a])
        return frozenset(needed)
    roots = [r for r in roots if r]
    return RowSchedule(tuple(per_element), tuple(rounds), tuple(cone(r) for r in roots), tuple(map(tuple, roots)))


def indexed_picks(kernel: "Kernel", schedule: RowSchedule) -> dict[int, int]:
    """The row kernel's picks (row_pick) of an input array's element, as it is or
    widened (a float cast no narrower), at an index known before the row's first
    pass (a per-row value of round 0): codegen.emit reads each as one load a row,
    not as an accumulator of every pass and a combine. Pick -> the load it reads."""
    body = kernel.body.instrs
    arrays = {a.value for a in kernel.loads if a.contiguous and a.present[-1]}
    out = {}
    for idx, ins in enumerate(body):
        if ins.op != "row_pick" or schedule.per_element[ins.args[1]] or schedule.rounds[ins.args[1]]:
            continue
        at = ins.args[0]
        source = body[at]
        if source.op == "cast" and source.type.is_float and body[source.args[0]].type.is_float \
                and body[source.args[0]].type.itemsize <= source.type.itemsize:
            at = source.args[0]  # a widening (exact)
        if body[at].op == "load" and body[at].attr in arrays:
            out[idx] = at
    return out


# A resident row keeps a value a later pass needs again where it holds at most
# this many (each takes a register per element the thread holds).
HELD_VALUES = 2


def held_values(body, schedule: RowSchedule) -> tuple[list, list]:
    """For a row held in registers, the values computed in one pass that a later
    pass would compute again, kept in registers instead: in each later pass,
    those its new computation reads (or stores, or reduces) directly. Returns
    each pass's values to compute (reading the kept ones, not what they came
    from) and the values each pass keeps."""
    sets, roots = schedule.passes, schedule.roots
    first: dict[int, int] = {}  # value -> the pass that first computes it
    held: set[int] = set()
    keeps: list[list[int]] = [[] for _ in sets]
    effective = []

    def closure(needed, root) -> set[int]:
        keep, stack = set(), [i for i in root if i in needed]
        while stack:
            i = stack.pop()
            if i not in keep:
                keep.add(i)
                if i not in held:
                    stack.extend(a for a in body[i].args if a in needed)
        return keep

    for q, (needed, root) in enumerate(zip(sets, roots)):
        computing = closure(needed, root)
        again = {i for i in computing if i in first and i not in held and body[i].op not in ("load", "const")}
        frontier = sorted(i for i in again if i in root or any(i in body[j].args for j in computing - again))
        if frontier and len(held) + len(frontier) <= HELD_VALUES:
            for i in frontier:
                held.add(i)
                keeps[first[i]].append(i)
            computing = closure(needed, root)
        effective.append(frozenset(computing))
        for i in computing:
            first.setdefault(i, q)
    return effective, [tuple(k) for k in keeps]


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
    # A column kernel (ir.launch.ColumnReduce): one column reduction whose body's last
    # instruction is its sum (ir.program.COLUMN_OPS) over the first collapsed extent.
    columns: bool = False
    # A total's kernel (Stage.total; ir.launch.ColumnReduce.total): its column sums,
    # of one column, finished in it, and the statements over them computed after.
    total: bool = False

    @property
    def accesses(self) -> tuple[Access, ...]:
        return self.loads + tuple(a for a, _ in self.stores)

    @property
    def column_sums(self) -> tuple[tuple[Access, int], ...]:
        """The stores of partial column sums ("col_partial"): a run of rows' sums
        of each column, not a value of each element."""
        return tuple((a, at) for a, at in self.stores if self.body.instrs[at].op == "col_partial")

    @property
    def needs_coordinates(self) -> bool:
        """Whether some operand is read along only some dims (a broadcast needing index
        arithmetic), or the body takes an element's place along the last dim."""
        return any(a.broadcast for a in self.loads) or self.has_position

    @property
    def has_position(self) -> bool:
        """Whether the body reads an element's place along the last dim (row_position)."""
        return any(ins.op == "position" for ins in self.body.instrs)
