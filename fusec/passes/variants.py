"""The functions emitted for a kernel of each form, each with its own register estimate.

A variant's estimate describes that variant's code: the vector variant's
unrolled lanes, the grid-stride loop, a loop kernel's iterations.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from fusec.ir.kernels import Kernel, held_values, row_schedule
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
from fusec.target import (
    BLOCK_SIZE,
    CLUSTER_ARCH,
    CLUSTER_BLOCKS,
    CLUSTER_ELEMENTS,
    CLUSTER_FORM,
    CLUSTER_STREAM_THREADS,
    CLUSTER_THREADS,
    DEFAULT_ARCH,
    RESIDENT_BLOCK_BYTES,
    RESIDENT_ELEMENTS,
    RESIDENT_REGS,
    RESIDENT_THREADS,
    ROW_CACHE_BYTES,
    WARP_ROW_BYTES,
    REGISTER_FILE,
    WARP_ROWS_PER_BLOCK,
    arch_number,
)

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


def variant_for_rows(variants: tuple[Variant, ...], length: int) -> Variant:
    """The variant the runtime takes for rows of `length` elements, its arrays
    aligned (the runtime's order: the first whose needs hold); for a kernel
    that is not a row kernel, its first."""
    return next((v for v in variants if v.takes_rows(length)), variants[-1])


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
        case RowBlock(chunks) if chunks:
            return _chunk_variants(kernel, form, slot_of, estimate, observed)
        case RowBlock():
            clusters = arch_number(costs.arch if costs else DEFAULT_ARCH) >= CLUSTER_ARCH
            return _row_variants(kernel, form, slot_of, estimate, observed, clusters)
        case ColumnReduce(chunks, total):
            return (Variant(name, 1, ColumnGrid(chunks, total), regs(1)),)
        case MultiTensor():
            width = vector_width(kernel, estimate(variant_shape(Elementwise(), 1)))
            return (Variant(f"{name}_mt", width, WorkItemGrid(), regs(width), _alignment(kernel, width, slot_of)),)
        case _:
            unhandled(form)


# The row strategies offered, in the order the runtime tries them (tests and
# benchmarks narrow it to force one; "block" needs nothing and always stays).
ROW_STRATEGIES = ("resident", "cluster", "warp", "block")


def _row_variants(kernel: Kernel, form: RowBlock, slot_of, estimate: KernelEstimate, observed: dict,
                  clusters: bool) -> tuple:
    """The row kernel's variants, each for the rows it serves best:
    - the row held in registers (`row_resident` vectors a thread, loaded in one
      burst by the first pass, read by the later ones from registers), a warp a
      row for short rows, a block of more threads a row for longer, each up to
      the row its vectors hold (with nothing read again, the same loops: the
      burst of loads, and the same order of reduction as the fused kernels);
    - a warp per row up to WARP_ROW_BYTES of its widest array (later passes
      read again from L1 and L2);
    - a block per row, keeping the row in shared memory where it fits, or
      reading it again from memory;
    each first as 16-byte vectors of the row's widest array (the row's length a
    multiple of the vector, its arrays aligned), then one element a thread."""
    name = kernel.name
    varying = [a.type.itemsize for a in kernel.accesses if a.present[-1]]
    width = VECTOR_BYTES // max(varying) if varying else 1
    cached = row_schedule(kernel).cached_loads(kernel)
    cache = sum(a.type.itemsize for a in cached)
    # bytes of registers an element of the row takes held: narrower types are kept
    # converted to 32 bits (ptxas holds the f32 of a bf16 that later passes read)
    kept = sum(max(a.type.itemsize, 4) for a in cached)
    narrow = any(a.type.itemsize < 4 for a in cached)  # a row kept converted to 32 bits
    # values kept between passes (a narrow row's conversion to 32 bits among them)
    effective, keeps = held_values(kernel.body.instrs, row_schedule(kernel))
    kept_between = sum(len(kept_here) for kept_here in keeps)
    # Nothing of the row kept between passes (each array read in one pass, no value kept, no
    # log-sum-exp, which keeps its inputs for the sum after the max): the unrolled vectors are
    # each used as they come (`_unheld_registers`).
    holds = bool(cached) or kept_between > 0 or any(ins.op == "row_lse" for ins in kernel.body.instrs)
    # the registers of one vector of each array the row's stores pass reads (none where it reduces only)
    element_pass = effective[-1] if any(a.present[-1] for a, _ in kernel.stores) else frozenset()
    streamed = {kernel.body.instrs[i].attr for i in element_pass if kernel.body.instrs[i].op == "load"}
    streamed = sum(a.type.itemsize for a in kernel.loads if a.present[-1] and a.value in streamed) * width / 4
    # A streaming cluster loads its array of whole rows ahead (one read once too, as cross-entropy's
    # logits), its next row's vectors as they are in memory (bf16 packed; whether they fit is judged
    # with them at 32 bits an element, the margin ptxas needs); an
    # exponential's or logarithm's passes take a 32-bit copy of the row besides (ptxas, sm_90, the
    # examples' streaming functions against their resident ones: softmax, log-softmax and
    # cross-entropy f32 +67 to +70, bf16 +38 to +45; RMSNorm f32 +50, bf16 +23). One such array, and
    # at most one array along the row broadcast over the rows (ptxas issues their loads together:
    # add-RMSNorm's x and residual in bf16 spilled 96 bytes estimated at 89; LayerNorm's
    # normalisation, x with w and b, 8 bytes estimated within 20 % of 128).
    rows_read = [a for a in kernel.loads if a.contiguous and all(a.present)]
    columns = sum(1 for a in kernel.loads if a.present[-1] and not all(a.present))
    packed, widened = sum(a.type.itemsize for a in rows_read), sum(max(a.type.itemsize, 4) for a in rows_read)
    transcendental = any(ins.op in ("exp", "log", "row_lse") for ins in kernel.body.instrs)
    out = []
    for w in dict.fromkeys((width, 1)):
        def regs(warp: bool, resident: int = 0) -> int:
            # The guard observes a kernel's first variant by its elements a thread; a
            # resident variant's registers are mostly its row's: its own estimate.
            shape = replace(variant_shape(form, w), warp=warp, resident=resident)
            return (None if resident else observed.get(w)) or estimate(shape)
        vector = {"whole_rows": True, "alignment": _alignment(kernel, w, slot_of)} if w > 1 else {}
        suffix = f"_v{w}" if w > 1 else ""
        if "resident" in ROW_STRATEGIES and w > 1:
            longest, peak = 0, _resident_peak(kernel, cached)
            shapes = [(1, threads) for threads in RESIDENT_THREADS]
            if clusters and "cluster" in ROW_STRATEGIES:
                shapes += sorted(((blocks, threads) for blocks in CLUSTER_BLOCKS for threads in CLUSTER_THREADS),
                                 key=lambda shape: (shape[0] * shape[1], shape[1]))
            for blocks, threads in shapes:
                count = _resident_vectors(threads, w, VECTOR_BYTES // w, blocks > 1)
                held = count * w * kept // 4  # 32-bit registers the kept row takes a thread, at most
                if held > RESIDENT_REGS or blocks * count * threads * w <= longest:
                    continue
                longest = blocks * count * threads * w
                warp = threads <= 32 and blocks == 1  # a warp, or part of one (several rows a warp): shuffles alone
                grid = RowGrid(BLOCK_SIZE // threads) if warp else RowGrid(1, threads, blocks if blocks > 1 else 0)
                # a block of 512 may take 128 registers a thread (__launch_bounds__(512, 1)):
                # ptxas then keeps about 8 more (measured on the examples)
                roomy = RESIDENT_ROOMY_REGS if threads == 512 else 0
                cluster = f"_c{blocks}" if blocks > 1 else ""
                registers = regs(warp, round(count * w * peak) + roomy) if holds else \
                    _unheld_registers(estimate, variant_shape(form, w), threads, count, count * w * peak, streamed)
                if threads < 32:  # several rows a warp: each group's row, lane and whether its row is live
                    registers += SUBWARP_ROW_REGS
                # streaming (target.CLUSTER_FORM): the next row's kept vectors beside this one's,
                # where its block can still have them all; not a narrow row converted and kept
                # beside another value kept between passes (ptxas, sm_90: bf16 softmax's c4_r256,
                # x and exp(x - m) kept, spilled 72 bytes at 128 registers, estimated 89;
                # bf16 log-softmax's, x alone, took 101)
                extra = CLUSTER_LOOP_REGS + (count * w if transcendental else 0)
                ahead = count * w * packed // 4 + extra
                streaming = blocks > 1 and CLUSTER_FORM == "streaming" and bool(rows_read) and \
                    _cluster_streams(threads, registers + count * w * widened // 4 + extra,
                                     narrow and kept_between > 1, len(rows_read), columns)
                if streaming:
                    grid, registers = replace(grid, persistent=True), registers + ahead
                out.append(Variant(f"{name}{cluster}_r{threads}{suffix}", w, grid, registers,
                                   max_row=longest, row_resident=count, prefetch=streaming, **vector))
        # Rows held in registers up to `longest` elements: a variant with the same needs
        # (whole vectors, aligned) that takes no longer rows would never run.
        held_up_to = longest if "resident" in ROW_STRATEGIES and w > 1 else 0
        warp_max = WARP_ROW_BYTES // max(varying, default=1)
        if "warp" in ROW_STRATEGIES and warp_max > held_up_to:
            out.append(Variant(f"{name}_warp{suffix}", w, RowGrid(WARP_ROWS_PER_BLOCK), regs(True),
                               max_row=warp_max, **vector))
        if cached and ROW_CACHE_BYTES // cache > held_up_to:  # the plain variant's code, loads kept in shared memory
            out.append(Variant(f"{name}_cached{suffix}", w, RowGrid(), regs(False), row_cache=cache, **vector))
        out.append(Variant(f"{name}{suffix}", w, RowGrid(), regs(False), **vector))
    # The runtime takes the first whose needs hold: the registers' shortest rows first,
    # then a warp a row, then the shared memory; a vector variant before its element one.
    return tuple(sorted(out, key=lambda v: (v.row_resident == 0, v.max_row is None, v.max_row or 0,
                                            v.row_cache == 0, v.elements_per_thread == 1)))


def _chunk_variants(kernel: Kernel, form: RowBlock, slot_of, estimate: KernelEstimate, observed: dict) -> tuple:
    """A row kernel with column sums (RowBlock.chunks blocks in all): each block
    takes its run of rows CHUNK_GROUPS at a time, a group of threads a row,
    holding it in registers (16-byte vectors; the shortest rows' first); with
    several rows at a time the values summed go through a tile in shared
    memory, from which each column's thread adds them up in the rows' order.
    Last, a block a row (its own columns' sums kept in their array), first as
    vectors, then one element a thread."""
    name, chunks = kernel.name, form.chunks
    sums = [kernel.body.instrs[at] for _, at in kernel.column_sums]
    sum_bytes = sum(ins.type.compute.itemsize for ins in sums)
    summed = {a for a, _ in kernel.column_sums}
    varying = [a.type.itemsize for a in kernel.accesses if a.present[-1] and a not in summed]
    width = VECTOR_BYTES // max(varying) if varying else 1
    cached = row_schedule(kernel).cached_loads(kernel)
    kept = sum(max(a.type.itemsize, 4) for a in cached)
    peak = _resident_peak(kernel, cached)
    out = []
    for w in dict.fromkeys((width, 1)):
        vector = {"whole_rows": True, "alignment": _alignment(kernel, w, slot_of)} if w > 1 else {}
        suffix = f"_v{w}" if w > 1 else ""
        longest = 0
        for group, rows, prefetch in CHUNK_GROUPS if w > 1 else ():
            count = _resident_vectors(group, w, VECTOR_BYTES // w)
            share = ""
            if rows == 1 and group < CHUNK_ROW_THREADS:  # the same row over more warps, each thread its share
                count, group = max(1, count * group // CHUNK_ROW_THREADS), CHUNK_ROW_THREADS
                share = f"h{count}"
            capacity = count * group * w  # the longest row a group holds
            if count * w * kept // 4 > RESIDENT_REGS or capacity <= longest:
                continue
            if rows > 1 and rows * capacity * sum_bytes > CHUNK_TILE_BYTES:
                continue
            longest = capacity
            block = group * rows
            # a block a row keeps its columns' sums beside its row; else each thread its columns'
            sums_held = count * w * len(sums) if rows == 1 else -(-capacity // block) * len(sums)
            # prefetching: the next row's kept vectors beside this one's
            ahead = count * w * kept // 4 if prefetch else 0
            shape = replace(variant_shape(form, w), warp=group <= 32,
                            resident=round(count * w * peak) + sums_held + ahead)
            registers = estimate(shape) + CHUNK_LOOP_REGS
            if registers > REGISTER_FILE // block:  # would spill: its block cannot have them all
                continue
            out.append(Variant(f"{name}_r{group}x{rows}{'p' if prefetch else ''}{share}{suffix}", w,
                               RowGrid(rows, block, 0, chunks), registers, max_row=capacity, row_resident=count,
                               prefetch=prefetch, **vector))
        # its sums' vector of each array read, added to and written each pass, and the loop over the run of rows
        registers = estimate(variant_shape(form, w)) + w * len(sums) + CHUNK_LOOP_REGS
        out.append(Variant(f"{name}{suffix}", w, RowGrid(1, CHUNK_BLOCK, 0, chunks), observed.get(w) or registers,
                           **vector))
    return tuple(sorted(out, key=lambda v: (v.row_resident == 0, v.max_row or 0, v.elements_per_thread == 1)))


def _unheld_registers(estimate: KernelEstimate, shape, threads: int, count: int, loaded: float,
                      streamed: float) -> int:
    """A row "held" in registers of which nothing is kept between passes (LayerNorm's
    normalisation after its statistics kernel, RMSNorm's backward statistics, a lone
    row_max or row_sum): each unrolled vector is used as it is loaded, and ptxas keeps
    at most UNHELD_LOADS_REGS of them in flight, not the `loaded` registers of all the
    thread's vectors the row's peak says (ptxas, sm_90, 3 arrays read once: 29-40
    registers for 16 and 32 elements a thread where that said 40-66). Under
    __launch_bounds__(threads, 1) (blocks of more than BLOCK_SIZE) ptxas issues the
    loads of the pass that stores the row for all its vectors at once (`streamed`: one
    vector of each array that pass reads), up to the registers a thread may have: f32
    LayerNorm's normalisation (x, w, b), 64 for 4 vectors a thread of 512 and of 1024
    (its cap), 96 for 8; in bf16 about half as many (40: estimated 64, over). A pass
    that only reduces keeps no more (RMSNorm's backward statistics, 26)."""
    in_flight = min(loaded, UNHELD_LOADS_REGS)
    if threads > BLOCK_SIZE and streamed:
        in_flight = max(in_flight, count * streamed)
    return min(REGISTER_FILE // threads, estimate(replace(shape, resident=max(1, round(in_flight)))))


# The registers of loads in flight in a row held in registers of which nothing is kept
# between passes: the unfused row_max/row_sum/row_mean kernels (one array read once) took
# 24 registers for 16 elements a thread and 30-32 for 32 (8 and 16 of loads, the
# row's estimate); three arrays read once, 29-40 for either.
UNHELD_LOADS_REGS = 16


# A streaming cluster kernel's registers beyond the resident one's and its next
# row's vectors: the loop over its rows and the next row's addresses (ptxas, sm_90,
# the examples' streaming functions: within 10 % over, bf16 LayerNorm's statistics
# under max_regs 64 24 % under).
CLUSTER_LOOP_REGS = 12


def _cluster_streams(threads: int, registers: int, narrow_kept: bool, rows_read: int, columns: int) -> bool:
    """Whether a cluster kernel of blocks of `threads`, estimated at `registers`
    with its next row's vectors, streams its rows: within the registers of
    target.CLUSTER_STREAM_THREADS a multiprocessor, its blocks smaller, not a row
    of a narrow type beside values kept between passes (`narrow_kept`), one array
    of whole rows read and at most one broadcast over the rows (`columns`)."""
    return threads < CLUSTER_STREAM_THREADS and not narrow_kept and rows_read == 1 and columns <= 1 and \
        registers <= REGISTER_FILE // CLUSTER_STREAM_THREADS


# A row kernel with column sums: (threads a row, rows at a time, whether the next
# rows are loaded while these are computed) of its blocks, the shortest rows'
# first. COLUMN_CHUNKS blocks in all are all the work a kernel has, so each keeps
# several rows in flight.
CHUNK_GROUPS = ((8, 32, True), (16, 16, True), (32, 8, True), (64, 4, True), (128, 2, True), (256, 2, False),
                (256, 1, True), (512, 1, True), (1024, 1, False))
# A block of one row at a time takes at least this many threads, each holding its
# share of the row: COLUMN_CHUNKS blocks are one a multiprocessor, so its block is
# all the warps an SM has behind its loads. Measured on the H200 (BENCHMARKS.md,
# the eighth session), RMSNorm's backward at 4 Ki f32: 256 threads a row, one at a
# time, prefetched, 287 µs; 512, 223 µs (2 rows at a time of 256: 221). LayerNorm's
# (two column sums: 2 rows at a time do not fit the tile) took 256 threads a row:
# 274 µs, 70 % of the copy.
CHUNK_ROW_THREADS = 512
# The threads of the block a row that reads its row again in each pass (rows longer
# than a group holds): all the warps a multiprocessor can have behind its loads.
CHUNK_BLOCK = 1024
# Its registers beyond a row kernel's: the loop over the run of rows and its
# bounds (ptxas, sm_90, on tests/programs/columns.fz's norm_grads and
# tests/test_row_columns_sim.py's program: the block-a-row variants 31-56 where
# the row kernel's terms and the sums' vectors said 24-44; the groups' 59-161
# where their terms said 62-133, 11-24 % under for the larger).
CHUNK_LOOP_REGS = 8
# Shared memory for the tile of the values a block's rows add to its columns' sums.
CHUNK_TILE_BYTES = 32 * 1024


# A row held in registers: the registers its elements take, per element a thread
# holds, for each value live in a pass (calibrated on the examples' resident
# functions, tests/estimate_corpus.py): a value computed and kept between passes,
# one; an array kept, its bytes / 4 (bf16 stays packed), a log-sum-exp's input
# one (converted); a load of an array read once, half of that (ptxas does not keep them all);
# in a later pass, beside what the thread holds, the first such array half a
# register, the others one.
RESIDENT_ONCE = 0.5
RESIDENT_ROOMY_REGS = 8
# A row held by a group of fewer than 32 lanes (8 or 16: several rows a warp): ptxas,
# sm_90, 2-9 registers more than the warp a row of the same kernel (median 5: softmax
# 40 against 31, RMSNorm 39 against 34, bf16 LayerNorm's normalisation 37 against 32).
SUBWARP_ROW_REGS = 4


def _resident_peak(kernel: Kernel, cached: list) -> float:
    """The registers an element of a thread's part of its row takes at the busiest
    pass: the arrays read again (kept), the values kept between passes, and the
    arrays read once in that pass; a log-sum-exp keeps its inputs whole."""
    body = kernel.body.instrs
    schedule = row_schedule(kernel)
    roots = schedule.roots
    effective, keeps = held_values(body, schedule)
    kept = {a.value for a in cached}
    lse_inputs = {ins.args[0] for ins in body if ins.op == "row_lse"}
    peak = 0.0
    for p, values in enumerate(effective):
        read = {body[i].attr for i in values if body[i].op == "load"}
        # a log-sum-exp keeps its inputs converted to its accumulation type (through a cast)
        inputs = {body[i].args[0] if body[i].op == "cast" else i for i in lse_inputs & set(roots[p])}
        whole = {body[i].attr for i in inputs if body[i].op == "load"}
        live = float(sum(1 for q in range(p) for i in keeps[q] if i in values))
        once = 0
        for a in kernel.loads:
            if not a.present[-1] or a.value not in read:
                continue
            if a.value in whole:
                live += max(1.0, a.type.itemsize / 4)
            elif a.value in kept:
                live += a.type.itemsize / 4
            elif p > 0:  # read once beside what the thread holds: converted, all but the first whole
                live += RESIDENT_ONCE if once == 0 else 1.0
                once += 1
            else:
                live += RESIDENT_ONCE * a.type.itemsize / 4
        peak = max(peak, live)
    return peak


def _resident_vectors(threads: int, width: int, itemsize: int, cluster: bool = False) -> int:
    """The vectors of `width` elements a thread of `threads` keeps of its row:
    RESIDENT_ELEMENTS, or in a block of 128 to 512 threads RESIDENT_BLOCK_BYTES
    (more elements of a narrow type: bytes in flight a thread; 1,024 threads keep
    to 64 registers a thread); in a cluster's block, CLUSTER_ELEMENTS."""
    if cluster:
        return max(1, CLUSTER_ELEMENTS // width)
    if 128 <= threads <= 512:
        return max(1, RESIDENT_BLOCK_BYTES // (width * itemsize))
    return max(1, RESIDENT_ELEMENTS // width)


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
