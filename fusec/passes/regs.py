"""The register estimate: 32-bit registers per thread of a kernel body.

Walks the body in emission order (loads first, then the computation, stores
at the end), keeping the number of live values by width; the peak, plus the
scratch registers that expanding a math function needs while it runs, plus a
fixed overhead for the index, the bound check and address arithmetic, is the
estimate. The constants were fitted to ptxas (CUDA 13.0, sm_90, -O3) on the
example kernels; `tests/test_nvcc.py` holds the estimate to within
max(4, 25 %) of ptxas on every one of them.
"""
from __future__ import annotations

from fusec.ir.program import Body, Instr

# The 64-bit index, its bound check and the first address: what a copy kernel needs.
BASE_REGS = 6
# Each stored array keeps a 64-bit address to the end of the kernel...
STORE_ADDRESS_REGS = 2
# ...and loads beyond the second keep some address arithmetic live too.
EXTRA_LOAD_REGS = 1
# A broadcast operand is indexed by coordinates from 64-bit division and
# remainder: each coordinate, and each broadcast operand's offset, is 64-bit.
INDEX_SETUP_REGS = 2
COORDINATE_REGS = 2
OFFSET_REGS = 2
# A persistent kernel's grid-stride loop keeps a 64-bit stride and bound...
STRIDE_REGS = 8
# ...and a loop kernel also its iteration counter, while ptxas unrolls the
# iteration loop (its count is unknown), overlapping the work of iterations.
LOOP_REGS = 8
# Scratch registers that libdevice's expansion of a function keeps live (non-fast-math).
SCRATCH = {
    "exp": 2, "exp2": 1, "expm1": 4, "log": 3, "log2": 2, "log10": 3, "log1p": 4, "sqrt": 2, "rsqrt": 1,
    "cbrt": 4, "sin": 8, "cos": 8, "tan": 8, "asin": 4, "acos": 4, "atan": 4, "atan2": 5,
    "sinh": 4, "cosh": 3, "tanh": 3, "sigmoid": 3, "erf": 4, "pow": 10, "div": 3, "mod": 1, "fma": 0,
}
# f64 math functions keep two registers for every one of the f32 expansion.
F64_SCRATCH_FACTOR = 2


def _width(ins: Instr) -> int:
    if ins.op == "const":
        return 0  # an immediate operand
    return ins.type.regs


def estimate_registers(body: Body, stored: list[int], scalar_loads: set[int], array_loads: int,
                       broadcast_loads: int = 0, coordinates: int = 0, loop: bool = False,
                       persistent: bool = False) -> int:
    """Peak live registers of `body` in order; `stored` instructions stay live to the end."""
    end = len(body.instrs)
    last_use = {i: -1 for i in range(end)}
    for idx, ins in enumerate(body.instrs):
        for a in ins.args:
            last_use[a] = idx
    for s in stored:
        last_use[s] = end
    live = peak = 0
    for idx, ins in enumerate(body.instrs):
        width = 0 if idx in scalar_loads else _width(ins)
        scratch = SCRATCH.get(ins.op, 0) if ins.type.is_float or ins.op in ("div", "mod") else 0
        if ins.type.compute.bits == 64:
            scratch *= F64_SCRATCH_FACTOR
        peak = max(peak, live + width + scratch)
        live += width
        for a in set(ins.args):
            if last_use[a] == idx:
                live -= 0 if a in scalar_loads else _width(body.instrs[a])
        if last_use[idx] == -1:  # dead: freed at once
            live -= width
    extra = 0
    if broadcast_loads:
        extra = INDEX_SETUP_REGS + COORDINATE_REGS * coordinates + OFFSET_REGS * (broadcast_loads - 1)
    addresses = STORE_ADDRESS_REGS * len(stored) + EXTRA_LOAD_REGS * max(0, array_loads - 2)
    return BASE_REGS + addresses + extra + peak + (LOOP_REGS if loop else STRIDE_REGS if persistent else 0)
