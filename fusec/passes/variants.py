"""The functions emitted for a kernel of each form, each with its own register estimate.

A variant's estimate describes that variant's code: the vector variant's
unrolled lanes, the grid-stride loop, a loop kernel's iterations.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from fusec.ir.kernels import Kernel, row_schedule
from fusec.ir.launch import (
    ColumnGrid,
    ColumnReduce,
    DeviceFillGrid,
    ElementGrid,
    Elementwise,
    Form,
    GridStride,
    MultiTensor,
    RegisterLoop,
    RowGrid,
    RowBlock,
    Variant,
    WorkItemGrid,
    unhandled,
)
from fusec.passes.cost import NOMINAL_ELEMENTS, TargetCosts, predict
from fusec.passes.regs import KernelEstimate, estimate_kernel, variant_shape
from fusec.target import WARP_ROW_MAX, WARP_ROWS_PER_BLOCK

# Each thread of the vector variant moves one 16-byte vector of its widest
# array (float4, 8 halves, 2 doubles): the widest load an SM issues, worth
# 1.6x over 4-byte accesses for the seed's chain on the H200 (PERF.md). Where
# a narrower array would then move less than 16 bytes a thread, a light kernel
# (estimated at WIDE_VECTOR_REGS or fewer per element, so that its unrolled
# body stays well inside the register budget) takes up to 32 bytes of the
# widest: quantize (f32 in, i8 and bool out) reaches 90 % of the copy with 4
# elements a thread and 103 % with 8, while arrays of one width lose 1-8 % with
# 32 bytes a thread (benchmarks/vector_width.py, BENCHMARKS.md).
VECTOR_BYTES = 16
WIDE_VECTOR_REGS = 16


def kernel_registers(kernel: Kernel, form: Form = Elementwise(), elements_per_thread: int = 1) -> int:
    """The register estimate of `kernel`'s code in `form` with `elements_per_thread`
    (passes.regs: calibrated against ptxas per variant)."""
    return estimate_kernel(kernel, variant_shape(form, elements_per_thread))


def vector_width(kernel: Kernel, scalar_regs: int) -> int:
    """Elements a thread of the vector variant takes: 16 bytes of the widest array
    it moves, up to 32 where a light kernel's narrow arrays would move less."""
    sizes = [a.type.itemsize for a in kernel.loads if a.contiguous] + [a.type.itemsize for a, _ in kernel.stores]
    if not sizes:
        return 1
    width = VECTOR_BYTES // max(sizes)
    if scalar_regs <= WIDE_VECTOR_REGS:
        width = min(VECTOR_BYTES // min(sizes), 2 * width)
    return width


def plan_variants(kernel: Kernel, form: Form, slot_of: Callable[[str], int],
                  costs: TargetCosts | None = None, observed: dict[int, int] | None = None) -> tuple[Variant, ...]:
    """The variants of `kernel` in `form`, in the order the runtime tries them.
    `slot_of(buffer)` numbers the arrays as the call signature does. With
    `costs`, the vector variant takes the width the cost model predicts fastest
    (a narrower vector keeps fewer registers live: more warps per SM).
    `observed`: elements per thread -> the registers a compiled variant really
    needed (passes.guard), in place of the estimate."""
    name = kernel.name
    observed = observed or {}
    estimate = KernelEstimate(kernel)

    def regs(width: int) -> int:
        return observed.get(width) or estimate(variant_shape(form, width))
    match form:
        case Elementwise():
            scalar_regs = regs(1)
            scalar = Variant(name, 1, ElementGrid(), scalar_regs)
            widest = vector_width(kernel, estimate(variant_shape(Elementwise(), 1)))
            options = [Variant(f"{name}_v{w}", w, ElementGrid(), regs(w),
                               _alignment(kernel, w, slot_of), whole_rows=kernel.needs_coordinates)
                       for w in _widths(widest)]
            if costs is not None and options:
                options = [_narrowest_needed(kernel, options + [scalar], costs)]
                options = [v for v in options if v is not scalar]
            return (*options[:1], scalar)
        case GridStride() | RegisterLoop():
            return (Variant(name, 1, DeviceFillGrid(), regs(1)),)
        case RowBlock():
            return _row_variants(kernel, form, slot_of, estimate, observed)
        case ColumnReduce(chunks):
            return (Variant(name, 1, ColumnGrid(chunks), regs(1)),)
        case MultiTensor():
            width = vector_width(kernel, estimate(variant_shape(Elementwise(), 1)))
            return (Variant(f"{name}_mt", width, WorkItemGrid(), regs(width), _alignment(kernel, width, slot_of)),)
        case _:
            unhandled(form)


def _row_variants(kernel: Kernel, form: RowBlock, slot_of, estimate: KernelEstimate, observed: dict) -> tuple:
    """Short rows a warp each (their passes read again from L1 and L2), longer a
    block each, keeping the row in shared memory where it fits; each first as
    16-byte vectors of the row's widest array (the row's length a multiple of
    the vector, its arrays aligned), then one element a thread."""
    name = kernel.name
    varying = [a.type.itemsize for a in kernel.accesses if a.present[-1]]
    width = VECTOR_BYTES // max(varying) if varying else 1
    cached = row_schedule(kernel).cached_loads(kernel)
    cache = sum(a.type.itemsize for a in cached)
    out = []
    for w in dict.fromkeys((width, 1)):
        def regs(warp: bool) -> int:
            return observed.get(w) or estimate(replace(variant_shape(form, w), warp=warp))
        vector = {"whole_rows": True, "alignment": _alignment(kernel, w, slot_of)} if w > 1 else {}
        suffix = f"_v{w}" if w > 1 else ""
        out.append(Variant(f"{name}_warp{suffix}", w, RowGrid(WARP_ROWS_PER_BLOCK), regs(True),
                           max_row=WARP_ROW_MAX, **vector))
        if cached:  # the plain variant's code with some loads from shared memory
            out.append(Variant(f"{name}_cached{suffix}", w, RowGrid(), regs(False), row_cache=cache, **vector))
        out.append(Variant(f"{name}{suffix}", w, RowGrid(), regs(False), **vector))
    # The runtime takes the first whose needs hold: a vector variant before its element one.
    return tuple(sorted(out, key=lambda v: (v.max_row is None, v.row_cache == 0, v.elements_per_thread == 1)))


# A narrower vector (or none) is taken only where the cost model predicts it at
# least this much faster than the wider one: the model's resolution, not noise.
NARROWER_MARGIN = 0.05


def _narrowest_needed(kernel: Kernel, options: list[Variant], costs: TargetCosts) -> Variant:
    """The widest variant, unless a narrower one is predicted clearly faster."""
    chosen = options[0]
    chosen_us = predict(kernel, chosen, NOMINAL_ELEMENTS, costs).us
    for variant in options[1:]:
        us = predict(kernel, variant, NOMINAL_ELEMENTS, costs).us
        if us < chosen_us * (1 - NARROWER_MARGIN):
            chosen, chosen_us = variant, us
    return chosen


def _widths(widest: int) -> list[int]:
    """The vector widths to consider, widest first: halving down to 2."""
    out = []
    while widest > 1:
        out.append(widest)
        widest //= 2
    return out


def _alignment(kernel: Kernel, width: int, slot_of: Callable[[str], int]) -> tuple[tuple[int, int], ...]:
    """(slot, bytes) for every array a thread moves as one vector of `width` elements:
    those that vary along the innermost collapsed dim (a broadcast one that does not
    is read once per vector)."""
    out: dict[int, int] = {}
    for access in kernel.accesses:
        if access.contiguous or access.present[-1]:
            out[slot_of(access.buffer)] = width * access.type.itemsize
    return tuple(out.items())
