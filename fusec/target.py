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
# alone, no barrier) for rows of at most WARP_ROW_MAX elements, a block per row
# beyond. A stated default, not yet measured on the H200: `fusec bench
# --row-length N` times whichever the runtime takes at N, and
# benchmarks/rows_device.sh the lengths either side.
WARP_ROW_MAX = 1024
WARP_ROWS_PER_BLOCK = BLOCK_SIZE // 32

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


def default_max_regs(arch: str = DEFAULT_ARCH) -> int:
    """The budget that keeps half occupancy on `arch`: enough loads in flight for
    a memory-bound kernel (65,536 registers / 1,024 threads = 64 on sm_90)."""
    number = int(_ARCH.fullmatch(check_arch(arch)).group(1))
    threads = MAX_THREADS_PER_SM.get(number, 2048)
    return min(MAX_REGS, REGISTER_FILE // (threads // 2) // 8 * 8)
