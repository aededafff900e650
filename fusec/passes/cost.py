"""The cost model: a predicted time for a kernel on the target, from what it moves and computes.

For one kernel over N elements, running the variant that runs (the first in
the launch order; arrays are assumed aligned):

    memory  = bytes(N) / BW(KiB of loads in flight per SM)
    compute = N * sum(op costs) * op_scale / min(1, warps per SM / alu_full_warps)
    compute *= 1 + min(code_max, code_per_kib * max(0, code KiB - code_free_kib))
    time    = launch + max(memory, compute) + overlap * min(memory, compute)

- occupancy: warps per SM from the variant's register estimate (registers are
  allocated per warp in units of 256; 8-warp blocks; at most 64 warps);
- BW(x) = copy * (1 - exp(-x / x0)): Little's law saturating at the copy
  bandwidth, with x the bytes a thread's loads keep in flight (elements per
  thread times the widths of its arrays) times the threads per SM. Fitted on
  the H200 to benchmarks/occupancy_bandwidth.py (bytes in flight against
  bandwidth, 8 to 64 warps, 4 to 32 bytes a thread);
- op costs: benchmarks/op_costs.py (each op, f32 and f64, in fusec's own
  emitted code with the whole GPU busy), in picoseconds per element;
- arithmetic throughput falls in proportion to the warps per SM below
  alu_full_warps (too few warps to hide the latency of libdevice's dependent
  chains): on the H200 a wide transcendental kernel at 32 warps ran 1.22x the
  time of the same work at 40 (the decision-quality run; op_scale, overlap and
  alu_full_warps are fitted to its 2058 timed partitions);
- machine code beyond the instruction caches: on the H200 a deep chain's time
  a stage grows with its SASS past about 64 KiB (f32 +4 % at 91 KiB, bf16 +8 %
  at 176 KiB: the probe of benchmarks/decision_quality.py, BENCHMARKS.md); the
  code is estimated before compiling as code_bytes_per_ps bytes per picosecond
  of arithmetic an element, times the elements a thread computes;
- a register estimate beyond 255 spills: each register beyond is a store and
  a load of 4 bytes an element through local memory.

The parameters of each architecture are data (fusec/target_data/ARCH.json):
measured for sm_90; another architecture uses sm_90's, with its own limit of
threads per SM (stated defaults, not measurements).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from fusec.ir.kernels import Kernel
from fusec.ir.launch import ColumnGrid, Prediction, RowGrid, Variant
from fusec.ir.program import Shape
from fusec.target import MAX_THREADS_PER_SM

DATA = Path(__file__).resolve().parent.parent / "target_data"

# Nominal size at which partitions are compared when the sizes are not known
# (compile time): large enough that bandwidth, not launches, decides.
NOMINAL_ELEMENTS = 2 ** 26



def nominal_dims(shapes: Iterable[Shape], elements: int = NOMINAL_ELEMENTS) -> dict[str, float]:
    """Sizes for named dims where only a total is known: the iteration space of
    most named dims (then most dims) holds `elements`, shared equally among its
    named dims (a literal dim is its own size); a name it lacks gets the same
    share. Named dims first: a row's result [rows, 1] beside the rows
    [rows, vocab] is not the widest space (taken for it, rows alone held all
    the elements and [rows, vocab] their square)."""
    shapes = list(shapes)
    widest = max(shapes, key=lambda s: (sum(isinstance(d, str) for d in s), len(s)), default=())
    named = [d for d in widest if isinstance(d, str)]
    literal = math.prod(d for d in widest if isinstance(d, int))
    share = max(1.0, elements / max(literal, 1)) ** (1 / len(named)) if named else 1.0
    return {d: share for shape in shapes for d in shape if isinstance(d, str)}


def nominal_row(kernel: Kernel, dims: dict[str, float]) -> int:
    """The length of a row kernel's rows with the named dims' sizes from
    `nominal_dims` (its variant for that length is the one priced)."""
    last = kernel.shape[-1] if kernel.shape else 1
    return max(1, round(last if isinstance(last, int) else dims.get(last, 1)))


def nominal_elements(shape: Shape, dims: dict[str, float]) -> int:
    """Elements of `shape` with the named dims' sizes from `nominal_dims`."""
    return max(1, round(math.prod(d if isinstance(d, int) else dims[d] for d in shape)))


# Threads per block (fusec launches 256) and the warps of one block.
BLOCK_WARPS = 8
REGISTER_UNIT = 256  # registers are allocated to a warp in units of 256
MAX_REGS = 255


@dataclass(frozen=True, slots=True)
class TargetCosts:
    arch: str
    sms: int
    registers_per_sm: int
    max_warps_per_sm: int
    copy_tb_per_s: float         # a 16-byte copy at full occupancy: the memory system's limit
    in_flight_kib: float         # x0 of BW(x): KiB in flight per SM for 63 % of the copy bandwidth
    launch_us: float             # one kernel's launch and tail on the device
    overlap: float               # the share of the shorter of memory and compute that does not overlap
    alu_full_warps: float        # warps per SM from which arithmetic runs at its full rate
    op_scale: float              # the op table's figures in a fused kernel (fitted)
    code_bytes_per_ps: float     # SASS bytes per picosecond of arithmetic an element a thread computes
    code_free_kib: float         # machine code that runs at full speed
    code_per_kib: float          # arithmetic's slowdown per KiB of code beyond
    code_max: float              # the largest slowdown (beyond the probe's range)
    op_ps: dict                  # {"f32"|"f64": {op: picoseconds per element}}
    default_op_ps: float         # an op not in the table (a compare, a select, a cast)
    measured: str

    def op_cost(self, op: str, bits64: bool) -> float:
        table = self.op_ps["f64" if bits64 else "f32"]
        return table.get(op, self.default_op_ps * (2 if bits64 else 1))


@functools.cache
def target_costs(arch: str, fast_math: bool = False) -> TargetCosts:
    path = DATA / f"{arch.removesuffix('a')}.json"
    stated = not path.exists()
    data = json.loads((DATA / "sm_90.json" if stated else path).read_text())
    # Another architecture: sm_90's figures, but its own occupancy limit (threads per SM).
    warps = MAX_THREADS_PER_SM.get(int(arch.split("_")[1].rstrip("a")), 2048) // 32 if stated else \
        data["max_warps_per_sm"]
    costs = TargetCosts(
        arch=arch, sms=data["sms"], registers_per_sm=data["registers_per_sm"],
        max_warps_per_sm=warps, copy_tb_per_s=data["model"]["copy_tb_per_s"],
        in_flight_kib=data["model"]["in_flight_kib"], launch_us=data["model"]["launch_us"],
        overlap=data["model"]["overlap"], alu_full_warps=data["model"]["alu_full_warps"],
        op_scale=data["model"]["op_scale"], code_bytes_per_ps=data["model"]["code_bytes_per_ps"],
        code_free_kib=data["model"]["code_free_kib"], code_per_kib=data["model"]["code_per_kib"],
        code_max=data["model"]["code_max"],
        op_ps=_op_table(data, fast_math), default_op_ps=data["model"]["default_op_ps"],
        measured=data["measured"] if not stated else f"sm_90's figures (no measurement for {arch})")
    return costs


def warps_per_sm(regs: int, costs: TargetCosts) -> int:
    """Resident warps per SM for a kernel of `regs` registers a thread in 8-warp blocks."""
    per_warp = math.ceil(min(regs, MAX_REGS) * 32 / REGISTER_UNIT) * REGISTER_UNIT
    blocks = min(costs.max_warps_per_sm // BLOCK_WARPS, costs.registers_per_sm // (per_warp * BLOCK_WARPS))
    return max(1, blocks) * BLOCK_WARPS


# The last kernel body `compute_ps` priced and its figure: the fusion pass prices
# several variants of one kernel in a row, each asking twice (body, costs, picoseconds).
_last_compute: tuple = (None, None, 0.0)


def compute_ps(kernel: Kernel, costs: TargetCosts) -> float:
    """Picoseconds of arithmetic per element with the whole GPU busy (loads and constants are free)."""
    global _last_compute
    body, priced_costs, ps = _last_compute
    if body is kernel.body and priced_costs is costs:
        return ps
    ps = _compute_ps(kernel, costs)
    _last_compute = (kernel.body, costs, ps)
    return ps


def _compute_ps(kernel: Kernel, costs: TargetCosts) -> float:
    total = 0.0
    for ins in kernel.body.instrs:
        if ins.op in ("load", "const"):
            continue
        bits64 = ins.type.compute.bits == 64
        total += costs.op_cost(ins.op, bits64)
        if ins.op == "row_lse":  # an exp an element, beside the add and compare
            total += costs.op_cost("exp", bits64)
    return total * costs.op_scale


def code_slowdown(kernel: Kernel, variant: Variant, costs: TargetCosts) -> float:
    """The factor on a kernel's arithmetic time for machine code past the instruction caches."""
    kib = costs.code_bytes_per_ps * compute_ps(kernel, costs) * variant.elements_per_thread / 1024
    return 1 + min(costs.code_max, costs.code_per_kib * max(0.0, kib - costs.code_free_kib))


def predict(kernel: Kernel, variant: Variant, elements: int, costs: TargetCosts, iterations: int = 1) -> Prediction:
    """The predicted time of `variant` of `kernel` over `elements` elements (a
    loop kernel computing its body `iterations` times in registers)."""
    warps = warps_per_sm(variant.est_regs, costs)
    grid = variant.grid
    if isinstance(grid, RowGrid) and grid.chunks:  # a row kernel of a block a run of rows: that many blocks in all
        warps = max(1, min(warps, round(grid.chunks * (grid.threads or BLOCK_WARPS * 32) / 32 / costs.sms)))
    if isinstance(grid, ColumnGrid) and grid.total:  # one block of a thread a run: its warps, on one SM of them all
        warps = max(1, min(warps, round(grid.chunks / 32 / costs.sms)))
    # a row kernel's column sums are stored once a run of rows, and its per-row values once a
    # row (cross-entropy's lse and pick were priced as 8 bytes an element: 199 µs against 84
    # measured on the H200, BENCHMARKS.md, the tenth session), not an element
    per_row = isinstance(grid, RowGrid)
    moved = sum(a.type.itemsize for a in kernel.loads if a.contiguous) + \
        sum(a.type.itemsize for a, at in kernel.stores
            if (a, at) not in kernel.column_sums and not (per_row and not a.present[-1]))
    # a row held in registers: its vectors loaded in one burst (the next row's too, prefetching)
    held = max(1, variant.row_resident) * (2 if variant.prefetch else 1)
    loaded_per_thread = variant.elements_per_thread * held * \
        sum(a.type.itemsize for a in kernel.loads if a.contiguous)
    spilled = max(0, variant.est_regs - MAX_REGS)
    moved_total = moved + 8 * spilled  # each spilled register: a 4-byte store and load an element
    in_flight_kib = warps * 32 * max(loaded_per_thread, 1) / 1024
    bandwidth = costs.copy_tb_per_s * (1 - math.exp(-in_flight_kib / costs.in_flight_kib))
    memory_us = elements * moved_total / (bandwidth * 1e12) * 1e6
    # a thread holding its row computes its vectors' elements independently: as many warps' worth of latency hidden
    efficiency = min(1.0, warps * max(1, variant.row_resident) / costs.alu_full_warps)
    compute_us = elements * iterations * compute_ps(kernel, costs) * 1e-12 / efficiency * 1e6 * \
        code_slowdown(kernel, variant, costs)
    us = costs.launch_us + max(memory_us, compute_us) + costs.overlap * min(memory_us, compute_us)
    return Prediction(us, memory_us, compute_us, warps, moved)


def _op_table(data: dict, fast_math: bool) -> dict:
    """The op table; with fast math, the approximated f32 functions at their cost."""
    if not fast_math:
        return data["op_ps_per_element"]
    fast = {op: ps for op, ps in data["fast_op_ps_per_element"].items() if op != "note"}
    return {**data["op_ps_per_element"], "f32": {**data["op_ps_per_element"]["f32"], **fast}}
