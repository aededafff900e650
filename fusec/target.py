"""Target policy: what fusec assumes about the GPU it compiles for.

One place for the numbers that depend on the architecture, read by the CLI,
`fusec.jit` and `fusec bench` alike, so that the same program and options give
the same kernels from every entry point.
"""
from __future__ import annotations

import re

DEFAULT_ARCH = "sm_90"

# Registers per SM (64 Ki 32-bit registers on every arch since sm_50) and the
# most threads an SM runs, per compute capability (CUDA Programming Guide,
# "Compute Capabilities" table).
REGISTER_FILE = 65536
MAX_THREADS_PER_SM = {75: 1024, 80: 2048, 86: 1536, 87: 1536, 89: 1536, 90: 2048, 100: 2048, 120: 1536}

# Threads per block: 256 is the usual choice for memory-bound elementwise
# kernels (8 warps; 8 blocks fill an H200 SM's 2,048 threads); measured best on
# the H200 (BENCHMARKS.md, "Launch configuration").
BLOCK_SIZE = 256

# A foreach work item's elements at most: 8 Ki, a few vectors per thread of a
# block. Measured on the H200 (benchmarks/foreach_profile.py, one Adam step over
# ~51 M values): 8 Ki items 367 µs, 16 Ki 381, 64 Ki 385, 256 Ki 442 (too few
# items to balance 132 SMs).
FOREACH_CHUNK = 8192
# A row kernel that passes over its row more than once keeps the row's inputs
# in shared memory from the first pass where a row's worth fits in this much:
# the 48 KiB a block gets without opting in, less 1 KiB for the kernel's static
# shared memory (a partial per warp of each accumulation type: at most 512 B),
# which counts against the same 48 KiB; longer rows are read again from global
# memory (L2) in each pass. Not yet measured on the H200.
ROW_CACHE_BYTES = 47 * 1024

# Row kernels: a warp per row (eight rows a block of 256, combined by shuffles
# alone, no barrier) for rows of at most WARP_ROW_BYTES of their widest array,
# a block per row beyond. Measured on the H200 (benchmarks/row_strategy.py,
# BENCHMARKS.md, 2^26 elements, each strategy forced, 16-byte vectors): a warp
# a row was the faster for softmax up to 1,024 f32 and 2,048 bf16 elements (4
# KiB) and a block from 2,048 and 4,096 (8 KiB); RMSNorm the same in bf16, in
# f32 the block from 1,024 (3.55 against 3.30 TB/s).
WARP_ROW_BYTES = 4096
WARP_ROWS_PER_BLOCK = BLOCK_SIZE // 32
# Rows held in registers: each thread of a row keeps RESIDENT_ELEMENTS of it
# (of each array a later pass reads again), as 16-byte vectors loaded in one
# burst by the first pass, so the row is read once; 8 or 16 lanes of a warp a
# row for rows of up to 128 or 256 elements (more bytes in flight a lane than
# a whole warp on a short row), a warp a row up to 512, then a block of 64,
# 128, ... 1,024 threads a row, each for rows up to 16 elements a thread. Measured on the H200
# (benchmarks/row_strategy.py, BENCHMARKS.md): with 16 elements a thread
# softmax and RMSNorm reached 4.0 TB/s (96 % of the copy) at 256-512 elements a
# warp and 4,096 a block of 256; with 32 and 64 elements a thread the kernels
# fell to 3.4 and 2.6 (softmax f32 at 8 Ki and 16 Ki) and bf16 softmax to 1.4
# (64 elements a lane at 1 Ki and 2 Ki). At most RESIDENT_REGS 32-bit registers
# a thread hold the row (a bf16 element takes one: ptxas keeps it as f32).
RESIDENT_ELEMENTS = 16
# In a block of 128 to 512 threads a thread keeps 64 bytes of its row (32 bf16
# elements): measured on the H200, bf16 softmax at 4, 8 and 16 Ki elements
# reached 2.86, 2.67 and 2.15 TB/s with 32 elements a thread against 2.63,
# 2.24 and 1.23 with 16 (LayerNorm 3.56, 3.29, 2.15 against 3.27, 2.63, 1.81);
# at 1 Ki and shorter, 16 were the faster.
RESIDENT_BLOCK_BYTES = 64
RESIDENT_THREADS = (8, 16, 32, 64, 128, 256, 512, 1024)
RESIDENT_REGS = 64
# Rows longer than a block holds: a thread-block cluster a row (sm_90), each of
# its blocks holding its part in registers as above and combining the row's
# reductions through the others' shared memory (distributed shared memory), so
# the row is still read once. Clusters of 2 to 16 blocks (16 is beyond CUDA's
# portable 8, which the H100 and H200 allow) of 256 threads, or 512 where 16
# blocks of 256 cannot hold the row, each thread holding CLUSTER_ELEMENTS.
# Measured on the H200 (benchmarks/cluster_shapes.sh, BENCHMARKS.md, 2^26
# elements, 32 Ki-256 Ki a row): blocks of 256 beat 512 and 1,024 (f32 softmax
# at 64 Ki: 2.86 TB/s against 2.30 and 2.14; 128 no better than 256), and 32
# elements a thread beat 16 in f32 (softmax 2.99 against 2.86, RMSNorm 3.54
# against 3.31 at 64 Ki) and 64 in bf16 (softmax 2.06 against 1.32: 96
# registers a thread).
CLUSTER_BLOCKS = (2, 4, 8, 16)
CLUSTER_THREADS = (256, 512)
CLUSTER_ELEMENTS = 32
# A cluster's blocks exchange each reduction's values by writing them into every
# other block's shared memory (push: one cluster barrier a reduction, none at
# exit) in clusters of up to CLUSTER_PUSH_BLOCKS; in larger ones each block
# reads the others' (pull: a barrier before exit too). Measured on the H200
# (2^26 elements, results checked): push took f32 log-softmax at 32 Ki from 76
# to 89 % of the copy, RMSNorm at 64 Ki from 84 to 85 %, bf16 softmax at 64 Ki
# from 51 to 54 %, but clusters of 16 fell (f32 softmax at 128 Ki from 66 to
# 50 %, RMSNorm from 79 to 67 %).
CLUSTER_PUSH_BLOCKS = 8
# The cluster kernels' form: "streaming", a persistent grid of as many clusters as
# the device runs at once (cuOccupancyMaxActiveClusters), each taking every
# clusters-th row and issuing its next row's loads (into a second set of
# registers) before this row's reductions and cluster barriers, so that loads
# are in flight while it reduces; "resident", a cluster a row (one burst of
# loads, then the reductions with none in flight: 50-88 % of the copy at 64 Ki,
# 30-74 % at 256 Ki on the H200, BENCHMARKS.md's seventh session). Each row's
# order of reduction is the same in both (the same bits). Measured on the H200
# (benchmarks/rows_table.py --cluster-form resident|streaming, 2^26 elements,
# 32-128 Ki rows, BENCHMARKS.md's tenth session): streaming was slower everywhere
# it applied (its 104-124 registers halve the clusters at once: f32 softmax 62-73 %
# of the copy against 75-88 %, f32 RMSNorm 75-85 against 81-89, bf16 cross-entropy
# 19-21 against 35-40), so clusters hold one row each.
CLUSTER_FORM = "resident"
# A streaming cluster kernel's blocks keep at least this many threads an SM
# (__launch_bounds__: 2 blocks of 256, 128 registers a thread); a kernel estimated
# beyond that, or of blocks this large (ptxas spilled bf16 softmax's c16_r512 at
# 128 registers), stays resident.
CLUSTER_STREAM_THREADS = 512
CLUSTER_ARCH = 90  # the first architecture with clusters

# The register budget a fused kernel may not exceed is a number of 32-bit
# registers per thread; ptxas allocates at most this many.
MIN_REGS, MAX_REGS = 16, 255

_ARCH = re.compile(r"sm_(\d{2,3})a?")


def check_arch(arch: str) -> str:
    """`arch` if it names an architecture like sm_90 (or sm_90a), else ValueError."""
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise ValueError(f"expected an architecture like sm_90, got {arch!r}")
    return arch


def check_max_regs(value) -> int:
    """A register budget given by a user, or ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_REGS <= value <= MAX_REGS:
        raise ValueError(f"expected a register count from {MIN_REGS} to {MAX_REGS}, got {value!r}")
    return value


def arch_number(arch: str) -> int:
    """90 for sm_90 (and sm_90a)."""
    return int(_ARCH.fullmatch(check_arch(arch)).group(1))


def default_max_regs(arch: str = DEFAULT_ARCH) -> int:
    """The budget that keeps half occupancy on `arch`: enough loads in flight for
    a memory-bound kernel (65,536 registers / 1,024 threads = 64 on sm_90)."""
    threads = MAX_THREADS_PER_SM.get(arch_number(arch), 2048)
    return min(MAX_REGS, REGISTER_FILE // (threads // 2) // 8 * 8)
