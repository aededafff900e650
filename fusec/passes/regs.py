"""The register estimate: 32-bit registers per thread of each emitted variant.

A kernel is emitted in several variants (`VariantShape`): one element per
thread; a vector of E elements per thread (each array one vector, the element
loop unrolled); a grid-stride loop over elements; a loop kernel iterating a
`repeat` body in registers; and the multi-tensor (foreach) form, a work-item
loop holding a vector loop and an element loop. The estimate follows what
nvcc and ptxas do with each:

- **Values.** The body is walked in the order a pressure-aware scheduler runs
  it: each stored value in turn, each value computed just before its first
  use, the loads issued at the top (for latency). Live values are counted by
  width: a 64-bit value takes two registers; a vector load lands all E
  elements of an array at once (two 2-byte elements share a register) and each
  element is freed at its lane's last use; the E results of a stored value are
  held until the vector is whole and its store issues.
- **Lanes.** The unrolled lanes run one after the other, or each instruction
  for all lanes together, whichever holds fewer values (a kernel with many
  outputs and few inputs keeps fewer by finishing one output at a time).
- **Math functions.** A libdevice expansion keeps scratch registers while it
  runs (`SCRATCH_F32`, `SCRATCH_F64`, measured one function at a time); the
  branch-free ones run the lanes of a vector interleaved, and keep part of
  each further lane's scratch too.
- **Overheads.** The index and its bound, each stored array's address, the
  vector variant's scaled index and tail, broadcast coordinates (64-bit
  divisions: a floor under the body, since they come before any load), a
  grid-stride loop's stride and bound, a loop's counter, a multi-tensor
  kernel's per-set pointers and work item.

The constants were calibrated against ptxas (CUDA 13.0, `nvcc -cubin
-arch=sm_90 -O3`) on the generated corpus of `tests/estimate_corpus.py`
(about 150 pipelines, 600 functions): first the scratch tables from
one-function kernels, then the overheads by search for the most functions
within max(4, 20 %). `tests/test_estimate_nvcc.py` holds the estimate to that
bound for at least 90 % of the corpus, and to never more than 25 % under
where ptxas uses 48 registers or more.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace

import numpy as np

from fusec.ir.kernels import ROW_REDUCTIONS, Access, Kernel, indexed_picks, row_schedule
from fusec.ir.launch import ColumnReduce, Elementwise, Form, GridStride, MultiTensor, RegisterLoop, RowBlock, unhandled
from fusec.ir.program import COLUMN_OPS, Body, Instr


@dataclass(frozen=True, slots=True)
class VariantShape:
    """What of an emitted variant's form matters to its register pressure.

    elements: elements per thread: 1, or the vector variant's E (2, 4, 8, 16).
    grid_stride: the thread strides over the elements (a persistent kernel).
    loop: the body iterates in registers (a `repeat` loop kernel; grid-stride too).
    multi_tensor: foreach's form: a work-item loop, with a vector loop of
        `elements` per thread and an element loop inside.
    The widths of the arrays moved (an E-wide vector of a 2-byte type holds
    half the registers of a 4-byte one), 64-bit types and broadcast index
    arithmetic come from the body and the other arguments of
    `estimate_registers`: they are the kernel's, not the variant's.
    """

    elements: int = 1
    grid_stride: bool = False
    loop: bool = False
    multi_tensor: bool = False
    rows: bool = False  # a row kernel: loops over its row, accumulators combined across the block
    columns: bool = False  # a column kernel (with rows: its loop over rows, unrolled by ptxas)
    warp: bool = False  # a row kernel's warp-per-row variant (with rows)
    column_finish: bool = False  # a column kernel's finish (one run of rows: the partial sums)
    resident: int = 0  # a row kernel holding its row in registers: the 32-bit registers its elements take


    def __post_init__(self):
        if self.elements not in (1, 2, 4, 8, 16):
            raise ValueError(f"VariantShape.elements must be 1, 2, 4, 8 or 16, not {self.elements!r}")
        if self.loop and not self.grid_stride:
            raise ValueError("VariantShape.loop needs grid_stride=True (a loop kernel strides over the grid)")
        if self.multi_tensor and self.grid_stride:
            raise ValueError("VariantShape.multi_tensor excludes grid_stride and loop (it has its own loops)")
        if self.rows and (self.grid_stride or self.multi_tensor):
            raise ValueError("VariantShape.rows is a form of its own (passes over a row, an element or a vector a thread)")
        if self.elements > 1 and self.grid_stride:
            raise ValueError("VariantShape: a grid-stride or loop variant moves one element per thread")


def variant_shape(form: Form, elements_per_thread: int) -> VariantShape:
    """The shape of a variant of a kernel launched in `form` (ir.launch) that
    takes `elements_per_thread` elements a thread."""
    match form:
        case Elementwise():
            return VariantShape(elements=elements_per_thread)
        case GridStride():
            return VariantShape(grid_stride=True)
        case RegisterLoop():
            return VariantShape(grid_stride=True, loop=True)
        case RowBlock():
            return VariantShape(rows=True, elements=elements_per_thread)
        case ColumnReduce(chunks):  # a loop over elements into an accumulator, as a row kernel's
            return VariantShape(rows=True, columns=True, column_finish=chunks == 1)
        case MultiTensor():
            return VariantShape(elements=elements_per_thread, multi_tensor=True)
        case _:
            unhandled(form)


# ---------------------------------------------------------------------------
# Constants: ptxas of CUDA 13.0, sm_90, -O3. The examples in the comments are
# measurements; the values are the calibration's fit over the corpus of
# tests/estimate_corpus.py (see the module's docstring).

# The index (64-bit), its bound check and the first address. y = abs(x) in
# f32 uses 10 registers (estimated 9: this, its stored address, 2 values).
BASE_REGS = 6
# A column kernel's row loop, which ptxas unrolls (four rows in flight, their
# addresses and the trip count): ptxas gave 26-32 registers for the first column
# kernels (tests/programs/columns.fz) where the row kernel's terms said 17-20;
# but not where one thread sums a single column's 128 partials (the finish of a
# [rows, 1] or 1-D total: 16 registers where the loop's terms said 27).
COLUMN_LOOP_REGS = 10
# A row kernel's warp-per-row variant: ptxas unrolls its 32-stride loops further
# than the block's; on the six row examples (f32 and bf16) it took 5-14 more
# registers than the block-per-row variant (median 10).
WARP_ROW_REGS = 10
# A row kernel's 16-byte vector variants: the vector of each pass held while its
# elements are computed one by one; on the six row examples (f32 and bf16) -2 to
# +6 registers over the element variant of the same strategy (mean about 2.5).
ROW_VECTOR_REGS = 4
# Each stored array's 64-bit address, formed where it is stored.
STORE_ADDRESS_REGS = 1
# The vector variant's scaled index, its whole-vector check and the scalar
# tail's index: y = abs(x) uses 14 registers with 4 floats a thread (estimated 15).
VECTOR_BASE_REGS = 3
# An f16/bf16 array stored as a vector: its lanes rounded once at the store, packed in pairs
# (F2FP): h = x + r in bf16, 8 a thread, takes 24 registers where rounding each lane
# first took 19 (nvcc 13, sm_90). 2 a stored array keeps the estimate corpus at 91 % within
# max(4, 20 %) (4 over-counted f16 kernels: 90.8 %, f16 74 %).
PACKED_STORE_REGS = 2
# Broadcast coordinates: a setup and each 64-bit division or remainder
# (fz_quot, fz_rem: a 32-bit fast path and a 64-bit one, `index_divisions`).
# Small 2-D f32 kernels with one or two use 16-20 registers, 3-D ones with
# three or four 26-28.
INDEX_SETUP_REGS = 1
DIVISION_REGS = 4
# A grid-stride loop carries the index, the stride and the bound (64-bit) and
# strength-reduced pointers around the loop: y = abs(x) uses 20 registers in
# this form against 10 (estimated 18).
GRID_STRIDE_REGS = 9
# A loop kernel carries its iteration counter too, but fewer pointers: its
# body's values take their place.
LOOP_REGS = 7
# A row kernel: a grid-stride-like loop over its row, the row, its length and
# the shuffles' partners; and each reduction's accumulator (pick: two). Fitted
# to ptxas on the examples' row kernels (tests/test_estimate_nvcc.py).
ROW_REGS = 7
# A row held in registers (VariantShape.resident: the registers its elements
# take, passes.variants): the loops' indices, the row's and lane's, the
# accumulators' combining; fitted on the examples' 214 resident functions.
RESIDENT_BASE_REGS = 14
ROW_ACCUMULATOR_REGS = 1
# The multi-tensor form: the work item (set, start, vector end, end: 64-bit
# each) and its loops' indices, and per array of the set its 64-bit pointer,
# loaded for each work item (1.5: some are reloaded from the table instead).
# y = abs(x) uses 32 registers in this form (estimated 26), the Adam example
# (4 arrays) 53 (estimated 55).
MULTI_TENSOR_BASE_REGS = 14
MULTI_TENSOR_POINTER_REGS = 1.5
# Registers per element of a vector of 1-byte elements: they count as 2-byte
# ones (fitted on the i8, u8 and bool kernels; ptxas extracts bytes in pairs).
BYTE_LANE_REGS = 0.5
# Scratch registers a math function's libdevice expansion (accurate math, no
# fast math) keeps live while it runs: (one lane, each further lane of a vector).
# Measured one function at a time, y = f(x) against y = abs(x), with 1 and 4
# elements a thread in f32 (f16 and bf16 compute in f32), 1 and 2 in f64.
# sin, cos and tan keep their Payne-Hanek reduction's words but run a lane at a
# time, as pow and atan2 do (their slow paths branch); polynomial expansions
# (erf, sinh, expm1, tanh; f64 exp2, atan, asin) are interleaved across the
# lanes. f64 sqrt, log and the like are software sequences where f32 has a
# hardware approximation, and f64 constants take registers (no 64-bit
# immediates).
SCRATCH_F32 = {
    "exp": (1, 0.67), "exp2": (0, 0.33), "expm1": (2, 3), "log": (1, 2.33), "log2": (1, 2.33), "log10": (1, 2.67),
    "log1p": (2, 2.67), "sqrt": (2, 0), "rsqrt": (0, 0.33), "cbrt": (2, 0.67), "sin": (12, 0), "cos": (12, 0),
    "tan": (12, 0), "asin": (0, 2.33), "acos": (0, 1.67), "atan": (2, 1.67), "atan2": (9, 0), "sinh": (2, 3.67),
    "cosh": (0, 1), "tanh": (3, 2), "sigmoid": (5, 0.33), "erf": (3, 4.33), "pow": (4, 0), "div": (5, 0.33),
    "mod": (3, 0),
}
SCRATCH_F64 = {
    "exp": (4, 8), "exp2": (4, 22), "expm1": (6, 0), "log": (12, 2), "log2": (12, 2), "log10": (12, 2),
    "log1p": (16, 0), "sqrt": (10, 0), "rsqrt": (4, 4), "cbrt": (12, 5), "sin": (18, 0), "cos": (18, 0),
    "tan": (18, 0), "asin": (10, 22), "acos": (12, 0), "atan": (4, 28), "atan2": (17, 3), "sinh": (20, 2),
    "cosh": (4, 2), "tanh": (8, 0), "sigmoid": (6, 6), "erf": (6, 8), "pow": (17, 3), "div": (14, 0),
    "mod": (10, 0),
}
# Integer division and remainder (fz_div, fz_mod) and power (fz_ipow, a loop).
SCRATCH_INT = {"div": (4, 0), "mod": (4, 0), "pow": (4, 0)}
# The share of the further lanes' scratch live at once: ptxas overlaps the
# interleaved expansions about halfway (fitted over the corpus; 1 reproduces
# the one-function kernels, whose lanes have nothing else to overlap with).
FURTHER_LANE_SCRATCH = 0.5


# ---------------------------------------------------------------------------
# The estimate


def estimate_registers(body: Body, stored: list[int], scalar_loads: Collection[int], array_loads: int,
                       broadcast_loads: int = 0, coordinates: int = 0, *, variant: VariantShape,
                       lane_uniform: Collection[int] = (), carried: Collection[int] = ()) -> int:
    """Registers per thread of `variant` of the kernel whose body is `body`.

    stored: body instructions whose values reach memory (and, in a loop
        kernel, the carried exit values), held until stored.
    scalar_loads: load instructions of scalar parameters (constant bank: no register).
    array_loads: how many arrays the kernel reads; broadcast_loads: how many of
        them are read through broadcast coordinates; coordinates: how many
        64-bit divisions and remainders compute those (`index_divisions`).
    lane_uniform: load instructions reading one element for all lanes of a
        vector (a broadcast operand constant along the innermost dim).
    carried: a loop kernel's loop-value loads (each iteration replaces them);
        its other loads are read by every iteration.
    """
    if not isinstance(variant, VariantShape):
        raise TypeError(f"estimate_registers: variant must be a VariantShape, not {type(variant).__name__}")
    plan = _BodyPlan(body, stored, scalar_loads, lane_uniform, carried if variant.loop else None)
    return _estimate(plan, array_loads, broadcast_loads, coordinates, variant)


def _estimate(plan: "_BodyPlan", array_loads: int, broadcast_loads: int, coordinates: int,
              variant: VariantShape, accumulators: int = 0, columnless: bool = False) -> int:
    # Broadcast coordinates come first, before any value is loaded: a floor under the body.
    floor = INDEX_SETUP_REGS + DIVISION_REGS * coordinates if broadcast_loads else 0
    stores = STORE_ADDRESS_REGS * len(plan.stores)
    if variant.multi_tensor:
        pointers = MULTI_TENSOR_POINTER_REGS * (array_loads + len(plan.stores))
        vector = VECTOR_BASE_REGS + _vector_pressure(plan, variant.elements)
        return _registers(MULTI_TENSOR_BASE_REGS + pointers + stores + max(vector, plan.walk(1, 1)))
    overhead = BASE_REGS + stores
    if variant.rows:
        overhead += ROW_REGS + ROW_ACCUMULATOR_REGS * accumulators
    if variant.columns and not (variant.column_finish and columnless):
        overhead += COLUMN_LOOP_REGS
    if variant.warp:
        overhead += WARP_ROW_REGS
    if variant.grid_stride:
        overhead += LOOP_REGS if variant.loop else GRID_STRIDE_REGS
    if variant.rows and variant.resident:  # the row held: its registers, beside a few for the loops
        return _registers(RESIDENT_BASE_REGS + stores + ROW_ACCUMULATOR_REGS * accumulators + variant.resident)
    if variant.rows:  # a vector a thread a pass: its registers, the body computed an element at a time
        vector = ROW_VECTOR_REGS if variant.elements > 1 else 0
        return _registers(overhead + vector + variant.resident + max(floor, plan.walk(1, 1)))
    if variant.elements == 1:
        return _registers(overhead + max(floor, plan.walk(1, 1)))
    packed = PACKED_STORE_REGS * sum(1 for n in plan.stores if plan.instrs[n].type.is_half)
    return _registers(overhead + VECTOR_BASE_REGS + packed + max(floor, _vector_pressure(plan, variant.elements)))


class KernelEstimate:
    """`estimate_registers` for each variant of a planned kernel (what build_kernel
    passes, derived from the Kernel): the body's schedule, and each walk over it,
    is computed once for all the variants asked about."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        load_of = {ins.attr: n for n, ins in enumerate(kernel.body.instrs) if ins.op == "load"}
        self.stored = [i for _, i in kernel.stores] + [exit_value for _, exit_value in kernel.carried]
        self.scalar_loads = {load_of[v] for v in kernel.scalars}
        self.lane_uniform = {load_of[a.value] for a in lane_uniform_loads(kernel.loads)}
        self.carried = {loop_value for loop_value, _ in kernel.carried}
        self.broadcast_loads = sum(1 for a in kernel.loads if not a.contiguous and any(a.present))
        self.coordinates = index_divisions(kernel.loads)
        body = kernel.body.instrs
        rows = any(ins.op in ROW_REDUCTIONS for ins in body)
        schedule = row_schedule(kernel) if rows else None
        # a pick at a per-row index is one load a row (codegen.emit), not an accumulator; but
        # not in a row kernel with column sums, which compares each element (cross-entropy's
        # row kernel: ptxas 20-24 registers where two accumulators more said 28-34)
        picks = indexed_picks(kernel, schedule) if rows and not kernel.column_sums else {}
        self.accumulators = sum(1 + (ins.op in ("row_pick", "row_lse")) for n, ins in enumerate(body)
                                if (ins.op in ROW_REDUCTIONS or ins.op in COLUMN_OPS) and n not in picks)
        # Whether ptxas unrolls the warp-per-row variant's loops (WARP_ROW_REGS): not where
        # every pass accumulates a log-sum-exp, whose update branches at each element, and
        # none stores the row (cross-entropy's: 24 registers, the block's 20, estimated 34 with them).
        self.unrolled = not rows or any(ins.op not in ("row_lse",) for n, ins in enumerate(body)
                                        if ins.op in ROW_REDUCTIONS and n not in picks) \
            or any(a.present[-1] for a, _ in kernel.stores)
        self._plans: dict[bool, _BodyPlan] = {}

    def __call__(self, variant: VariantShape) -> int:
        if not isinstance(variant, VariantShape):
            raise TypeError(f"estimate_kernel: variant must be a VariantShape, not {type(variant).__name__}")
        plan = self._plans.get(variant.loop)
        if plan is None:
            plan = self._plans[variant.loop] = _BodyPlan(
                self.kernel.body, self.stored, self.scalar_loads, self.lane_uniform,
                self.carried if variant.loop else None)
        if variant.warp and not self.unrolled:
            variant = replace(variant, warp=False)
        return _estimate(plan, len(self.kernel.loads), self.broadcast_loads, self.coordinates, variant,
                         self.accumulators, columnless=len(self.kernel.extents) == 1)


def estimate_kernel(kernel: Kernel, variant: VariantShape) -> int:
    """`estimate_registers` for `variant` of a planned kernel."""
    return KernelEstimate(kernel)(variant)


def index_divisions(loads: Iterable[Access]) -> int:
    """The 64-bit divisions and remainders that compute the broadcast
    coordinates of a kernel reading `loads` (as codegen.emit does: from the
    innermost collapsed dim outward, as far as the outermost one needed)."""
    loads = list(loads)
    needed = {j for a in loads if not a.contiguous and any(a.present) for j, p in enumerate(a.present) if p}
    if not needed:
        return 0
    inner = max(len(a.present) for a in loads) - 1
    # A remainder per needed coordinate but the outermost dim's, a quotient per dim crossed.
    return sum(1 for j in needed if j > 0) + inner - min(needed)


def lane_uniform_loads(loads: Iterable[Access]) -> list[Access]:
    """The loads the vector variant reads once for all its lanes: constant
    along the innermost collapsed dim (as codegen.emit reads them)."""
    return [a for a in loads if a.present and not a.present[-1]]


def _registers(estimate: float) -> int:
    """Whole registers: half a register (two 2-byte elements) rounds up."""
    return math.ceil(estimate)


def _vector_pressure(plan: "_BodyPlan", lanes: int) -> float:
    """The lanes one after the other, or each instruction for all lanes
    together: whichever holds fewer values."""
    return min(plan.walk(lanes, 1), plan.walk(lanes, lanes))


class _BodyPlan:
    """One lane of the body in the order a pressure-aware scheduler runs it:
    each stored value in turn, each value computed just before its first use.
    `steps` holds an instruction per step (None: a step that only stores)."""

    def __init__(self, body: Body, stored: list[int], scalar_loads: Collection[int], lane_uniform: Collection[int],
                 carried: Collection[int] | None):
        self.instrs = _modifiers_folded(body.instrs, stored)
        self.stores = list(dict.fromkeys(stored))
        # Constants are immediates and scalar parameters constant-bank operands: no register.
        self.free = {n for n, ins in enumerate(self.instrs) if ins.op == "const" or n in scalar_loads}
        self.loads = [n for n, ins in enumerate(self.instrs) if ins.op == "load" and n not in self.free]
        self.uniform = self.free | (set(lane_uniform) & set(self.loads))
        for n, ins in enumerate(self.instrs):  # computed from lane-uniform values only: once for all lanes
            if ins.op != "load" and ins.args and self.uniform.issuperset(ins.args):
                self.uniform.add(n)
        self.steps, self.stores_at = self._demand_order()
        self.last: dict[int, int] = {}       # step of each value's last read (an instruction or its store)
        self.last_lane: dict[int, int] = {}  # the same, by a lane-varying instruction or a store
        for p, n in enumerate(self.steps):
            if n is not None:
                args = dict.fromkeys(self.instrs[n].args, p)
                self.last.update(args)
                if n not in self.uniform:
                    self.last_lane.update(args)
            for s in self.stores_at.get(p, ()):
                self.last[s] = self.last_lane[s] = p
        if carried is not None:  # a loop: every iteration reads the loads it does not replace
            for n in self.loads:
                if n not in carried:
                    self.last[n] = self.last_lane[n] = len(self.steps)
        self._walks: dict[tuple[int, int], float] = {}
        self._lane_tables: dict[int, _LaneTable] = {}
        self._release_points: dict[bool, tuple[np.ndarray, ...]] = {}
        self._releases: dict[tuple[int, bool], np.ndarray] = {}
        # What the walks need of each instruction and step, for any number of lanes (as arrays: see _LaneTable).
        self.figures = np.array([_figures(ins.op, ins.type) for ins in self.instrs], dtype=float).reshape(-1, 5)
        self.is_uniform = np.zeros(len(self.instrs), dtype=bool)
        self.is_uniform[list(self.uniform)] = True
        self.is_load = np.array([ins.op == "load" for ins in self.instrs], dtype=bool)
        at = np.array([-1 if n is None else n for n in self.steps], dtype=np.intp)
        self.step_has = at >= 0  # the step computes a value (else it only stores)
        self.step_instr = np.where(self.step_has, at, 0)
        self.step_uniform = self.step_has & self.is_uniform[self.step_instr]
        self.step_dead = self.step_has & np.array([n not in self.last for n in self.steps], dtype=bool)

    def lane_table(self, lanes: int) -> "_LaneTable":
        """For `lanes` lanes: each value's registers (held once if lane-uniform, per
        lane), and per step the value it computes, whether it is lane-uniform,
        whether nothing reads it, its scratch, the lanes of the values it stores."""
        table = self._lane_tables.get(lanes)
        if table is None:
            table = self._lane_tables[lanes] = _LaneTable(self, lanes)
        return table

    def walk(self, lanes: int, group: int) -> float:
        """`_walk` of this body, remembered."""
        key = (lanes, group)
        if key not in self._walks:
            self._walks[key] = _walk(self, lanes, group)
        return self._walks[key]

    def _demand_order(self) -> tuple[list[int | None], dict[int, list[int]]]:
        steps: list[int | None] = []
        done = self.free | set(self.loads)
        stores_at: dict[int, list[int]] = {}
        instrs = self.instrs
        for root in self.stores:
            before = len(steps)
            stack = [(root, False)]
            while stack:
                n, expanded = stack.pop()
                if n in done:
                    continue
                if expanded:
                    done.add(n)
                    steps.append(n)
                else:
                    stack.append((n, True))
                    stack += [(a, False) for a in reversed(instrs[n].args) if a not in done]
            if len(steps) == before:  # computed already, or loaded: a step of its own
                steps.append(None)
            stores_at.setdefault(len(steps) - 1, []).append(root)
        return steps, stores_at


# A float's negation and absolute value are operand modifiers of the instruction that
# reads them (FADD, FMUL, FFMA, FSETP, MUFU: -R, |R|): no register of their own. Counted as
# values, they doubled the live values of fusion_hurts' kernels, where each input is read
# negated by one output and as it is by others (ptxas 48 registers, estimated 77 for six
# outputs; BENCHMARKS.md, the tenth session).
OPERAND_MODIFIERS = ("neg", "abs")


def _modifiers_folded(instrs: list[Instr], stored: Collection[int]) -> list[Instr]:
    """`instrs` with each read of a float negation or absolute value (not itself stored)
    reading its operand instead: the modifier's operand lives until the modifier's last use."""
    source: dict[int, int] = {}
    for n, ins in enumerate(instrs):
        if ins.op in OPERAND_MODIFIERS and ins.type.is_float and n not in stored:
            a = ins.args[0]
            if instrs[a].type == ins.type:  # not a conversion as well
                source[n] = source.get(a, a)
    if not source:
        return instrs
    return [replace(ins, args=tuple(source.get(a, a) for a in ins.args))
            if any(a in source for a in ins.args) else ins for ins in instrs]


def _value_regs(ins: Instr) -> int:
    return 0 if ins.op == "const" else ins.type.regs


def _lane_regs(ins: Instr, lanes: int) -> float:
    """Registers per element of a value moved as a vector of `lanes` elements."""
    if lanes == 1:
        return ins.type.regs
    return max(ins.type.itemsize / 4, BYTE_LANE_REGS)


@functools.cache
def _figures(op: str, type_) -> tuple[int, int, float, float, float]:
    """What the walk needs of an instruction, by its op and type: `_value_regs`,
    `_lane_regs` for one lane and for a vector, and the scratch registers of a
    math function or an integer division while it runs (one lane, each further lane)."""
    ins = Instr(op, (), type_)
    if type_.is_float:
        table = SCRATCH_F64 if type_.compute.bits == 64 else SCRATCH_F32
    else:
        table = SCRATCH_INT if type_.is_int else {}
    return (_value_regs(ins), _lane_regs(ins, 1), _lane_regs(ins, 2), *table.get(op, (0, 0)))


class _LaneTable:
    """`_BodyPlan.lane_table`: arrays, so that `_walk` steps through the body a
    lane group at a time, not an instruction at a time.

    Per instruction: `once` (registers a lane-uniform value holds for all lanes)
    and `per_lane` (those of any other value, for each lane). Per step: the
    registers of the value computed (`value_once`, `value_lane`; none where the
    step only stores), its scratch, and the lanes of the values stored at that
    step (`store_lanes`)."""

    def __init__(self, plan: "_BodyPlan", lanes: int):
        figures, at = plan.figures, plan.step_instr
        value_regs, lane_regs = figures[:, 0], figures[:, 1 if lanes == 1 else 2]
        self.once = np.where(plan.is_uniform, value_regs, 0.0)
        self.per_lane = np.where(plan.is_uniform, 0.0, np.where(plan.is_load, lane_regs, value_regs))
        self.value_once = np.where(plan.step_has, self.once[at], 0.0)
        self.value_lane = np.where(plan.step_has, self.per_lane[at], 0.0)
        # a lane-uniform instruction runs once, for one lane; the others' further lanes overlap in part
        runs_for = np.where(plan.step_uniform, 1, lanes)
        self.scratch = np.where(plan.step_has, figures[at, 3] + FURTHER_LANE_SCRATCH * figures[at, 4] * (runs_for - 1),
                                0.0)
        self.store_lanes = np.zeros(len(plan.steps))
        for p, stored in plan.stores_at.items():
            self.store_lanes[p] = sum(lane_regs[s] for s in stored)


def _walk(plan: _BodyPlan, lanes: int, group: int) -> float:
    """Peak registers of the body's values over `lanes` lanes, run `group` lanes
    at a time (each instruction for the group's lanes together); the loads are
    issued at the top.

    Each step of a lane group, in order: its value is computed (and dropped at
    once if nothing reads it), the stored values' lanes are held, the values it
    reads for the last time are released; after the last group's lanes, the
    vector stores issue. The peak is taken after each value is computed (with its
    scratch) and after each step. Every count is a whole or half register, so
    the running totals are exact in floating point, and summing a group's steps
    at once (np.cumsum) gives the same figures as adding them one by one."""
    table = plan.lane_table(lanes)
    groups = -(-lanes // group)
    releases = _release_table(plan, lanes, groups > 1)
    loads = np.array(plan.loads, dtype=np.intp)
    live = peak = float(np.sum(table.once[loads] + table.per_lane[loads] * lanes))
    if not plan.steps:
        return peak
    vector = lanes > 1
    deltas = np.zeros((len(plan.steps), 3))  # per step: computed, stored and released, vector stores issued
    for g in range(groups):
        count = min(group, lanes - g * group)
        last_group = g == groups - 1
        # a lane-uniform value is computed once, in the first group
        computed = plan.step_has if g == 0 else plan.step_has & ~plan.step_uniform
        held = table.value_once + table.value_lane * count
        # values read for the last time: (when the step runs, when it is skipped) x (every group, first, last)
        in_group = releases[:, :, 0] + (releases[:, :, 1] if g == 0 else 0) + (releases[:, :, 2] if last_group else 0)
        released = in_group[..., 0] + in_group[..., 1] * count
        deltas[:, 0] = np.where(computed, held, 0.0)
        deltas[:, 1] = -np.where(computed & plan.step_dead, held, 0.0) - np.where(computed, released[0], released[1])
        if vector:  # each stored value's lanes are held until its vector is whole
            deltas[:, 1] += table.store_lanes * count
        deltas[:, 2] = -table.store_lanes * lanes if vector and last_group else 0.0
        levels = (live + np.cumsum(deltas.ravel())).reshape(-1, 3)
        with_scratch = (levels[:, 0] + table.scratch)[computed]
        peak = max(peak, float(levels[:, 1].max()), float(with_scratch.max()) if with_scratch.size else peak)
        live = float(levels[-1, 2])
    return peak


def _release_table(plan: _BodyPlan, lanes: int, several_groups: bool) -> np.ndarray:
    """The registers released at each step, as [run or skipped, step, in every
    group / the first / the last, once or per lane] (`_release_points`; a
    lane-uniform value's step is skipped after the first group, but a value
    stored there is released all the same)."""
    key = (lanes, several_groups)
    if key not in plan._releases:
        if several_groups not in plan._release_points:
            points = _release_points(plan, 2 if several_groups else 1)
            plan._release_points[several_groups] = (
                np.array(list(points), dtype=np.intp),
                np.array([p for _, p in points.values()], dtype=np.intp),
                np.array([0 if g_at is None else 1 if g_at == 0 else 2 for g_at, _ in points.values()], dtype=np.intp),
                np.array([n in plan.stores_at.get(p, ()) for n, (_, p) in points.items()], dtype=bool))
        values, steps, which, stored_here = plan._release_points[several_groups]
        table = plan.lane_table(lanes)
        out = np.zeros((2, len(plan.steps), 3, 2))
        for skipped, chosen in ((0, slice(None)), (1, stored_here)):
            for k, regs in enumerate((table.once, table.per_lane)):
                np.add.at(out[skipped, :, :, k], (steps[chosen], which[chosen]), regs[values[chosen]])
        plan._releases[key] = out
    return plan._releases[key]


def _release_points(plan: _BodyPlan, groups: int) -> dict[int, tuple[int | None, int]]:
    """(group, step) at which each value is read for the last time (group None:
    in every group, for its own lanes). A lane-uniform value read by
    lane-varying code is held until the last group has read it."""
    out: dict[int, tuple[int | None, int]] = {}
    free, uniform, last_lane, steps = plan.free, plan.uniform, plan.last_lane, len(plan.steps)
    for n, p in plan.last.items():
        if n in free or p >= steps:
            continue  # no register; or read by every iteration of a loop
        if n not in uniform:
            out[n] = (None, p)
        elif n in last_lane and groups > 1:
            out[n] = (groups - 1, last_lane[n])
        else:
            out[n] = (0, p)
    return out
