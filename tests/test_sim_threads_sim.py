"""The sim runs kernels whose threads synchronize (fusec_sim.h's cooperative
launches, which run each block's threads as fibers): __syncthreads, static and
dynamic __shared__ memory, warp shuffles and __syncwarp. Hand-written CUDA C,
compiled as the sim compiles a module (its flags, its shim, its launcher
template), with exact results; misuse is an error, not a hang. Sim tier (g++)."""
import ctypes
import os
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

import fusec
from fusec.codegen.emit import environment
from fusec.compiler import compile_pipeline
from fusec.runtime.backends.sim import CXXFLAGS, SHIM, SimBackend, cuda_include_dir
from fusec.runtime.executor import Executor
from fusec.runtime.host_compiler import compile_shared_library

pytestmark = pytest.mark.sim

CTYPES = {"long long": ctypes.c_longlong, "int": ctypes.c_int, "unsigned": ctypes.c_uint}


class Module:
    """A CUDA C module and its launchers, from the sim's template: `kernels` maps a
    kernel's name to (its parameters' C types, its dynamic shared memory in bytes
    (a C expression of the launcher's parameters), or None for fz_sim_grid[, its
    blocks a cluster])."""

    def __init__(self, cuda: str, kernels: dict, defines=()):
        self.params = {name: spec[0] for name, spec in kernels.items()}
        # The launchers read their arguments as the driver's kernelParams: one pointer per parameter.
        launchers = [{"name": name, "params": [f"{t} a{j} = *({t}*)params[{j}];" for j, t in enumerate(types)],
                      "args": [f"a{j}" for j in range(len(types))],
                      "cooperative": shared is not None, "shared_bytes": shared, "cluster": cluster[0] if cluster else 1}
                     for name, (types, shared, *cluster) in kernels.items()]
        launch = environment().get_template("sim_launcher.cpp.j2").render(module="module.cu", kernels=launchers)
        include = cuda_include_dir()
        flags = [*CXXFLAGS, *(f"-D{d}" for d in defines), "-include", str(SHIM)] + ([f"-I{include}"] if include else [])
        self.lib = ctypes.CDLL(str(compile_shared_library({"module.cu": cuda, "launch.cpp": launch},
                                                          key_parts=[SHIM.read_text()], flags=flags)))

    def __call__(self, name: str, grid: int, block: int, *args):
        """Launches `name`; a RuntimeError with the sim's message if it found a misuse."""
        fn = getattr(self.lib, f"fz_launch_{name}")
        fn.restype = ctypes.c_char_p
        fn.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
        values = [ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray) else CTYPES[t](a)
                  for t, a in zip(self.params[name], args)]
        params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        error = fn(grid, block, params)
        if error is not None:
            raise RuntimeError(error.decode())


BLOCKS = r"""
// A block's sum by a tree in static shared memory (blockDim.x a power of 2).
extern "C" __global__ void tree_sum(const float* __restrict__ x, float* __restrict__ out)
{
    __shared__ float s[1024];
    const unsigned t = threadIdx.x;
    s[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

// Only warp 0 computes; every thread reads its result after the barrier, which
// must hold the other warps while warp 0 passes its five shuffles.
extern "C" __global__ void warp0_then_all(const float* __restrict__ x, float* __restrict__ out)
{
    __shared__ float total;
    if (threadIdx.x < 32) {
        float v = x[blockIdx.x * 32 + threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) total = v;
    }
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = total;
}

template <typename Op>
__device__ float block_reduce(float v, Op op, float* partial)
{
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    v = partial[0];
    for (unsigned w = 1; w < blockDim.x / 32; ++w) v = op(v, partial[w]);
    __syncthreads();
    return v;
}
struct max_op { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct sum_op { __device__ float operator()(float a, float b) const { return a + b; } };

// One row per block, in two phases: the row's max and its sum, then each element
// normalized by them. Base 2, so that every step is exact for integer inputs.
extern "C" __global__ void softmax2(const float* __restrict__ x, float* __restrict__ y, const long long cols)
{
    __shared__ float partial[32];
    const float* row = x + blockIdx.x * cols;
    float m = -INFINITY;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = block_reduce(m, max_op(), partial);
    float s = 0.0f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += exp2f(row[c] - m);
    s = block_reduce(s, sum_op(), partial);
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) y[blockIdx.x * cols + c] = exp2f(row[c] - m) / s;
}

// Dynamic shared memory as any type: doubles in fz_smem (the name the sim defines).
extern __shared__ __align__(16) unsigned char fz_smem[];
extern "C" __global__ void dynamic_sum(const double* __restrict__ x, double* __restrict__ out)
{
    double* s = reinterpret_cast<double*>(fz_smem);
    const unsigned t = threadIdx.x;
    s[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    if (t == 0) {
        double total = 0;
        for (unsigned i = 0; i < blockDim.x; ++i) total += s[i];
        out[blockIdx.x] = total;
    }
}

// 48 KiB of each thread's stack, alive across barriers.
extern "C" __global__ void deep_stack(int* __restrict__ out)
{
    volatile int local[12 * 1024];
    for (int i = 0; i < 12 * 1024; ++i) local[i] = threadIdx.x + i;
    __syncthreads();
    __syncthreads();
    int bad = 0;
    for (int i = 0; i < 12 * 1024; ++i) bad += local[i] != (int)threadIdx.x + i;
    out[blockIdx.x * blockDim.x + threadIdx.x] = bad;
}

// Misuse: threads 16 and up return; the others reach the barrier.
extern "C" __global__ void early_return(float* __restrict__ out)
{
    __shared__ float s[64];
    if (threadIdx.x >= 16) return;
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[15 - threadIdx.x];
}
"""
BLOCKS_KERNELS = {
    "tree_sum": (["const float*", "float*"], "0"),
    "tree_sum_sequential": (["const float*", "float*"], None),  # fz_sim_grid
    "warp0_then_all": (["const float*", "float*"], "0"),
    "softmax2": (["const float*", "float*", "long long"], "0"),
    "dynamic_sum": (["const double*", "double*"], "block * 8u"),
    "deep_stack": (["int*"], "0"),
    "early_return": (["float*"], "0"),
}


def blocks_module(defines=()) -> Module:
    cuda = BLOCKS + "extern \"C\" void tree_sum_sequential(const float* x, float* out) { tree_sum(x, out); }\n"
    return Module(cuda, BLOCKS_KERNELS, defines)


@pytest.fixture(scope="module")
def blocks():
    return blocks_module()


def integers(shape, low=-50, high=50, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


@pytest.mark.parametrize("block", [1, 32, 64, 1024])
def test_a_tree_sum_in_shared_memory(blocks, block):
    x = integers((5, block))
    out = np.zeros(5, np.float32)
    for _ in range(2):  # the second launch finds the first one's values in shared memory
        out[:] = 0
        blocks("tree_sum", 5, block, x, out)
        np.testing.assert_array_equal(out, x.sum(axis=1))


def test_a_barrier_holds_the_block_until_one_warp_has_passed_its_shuffles(blocks):
    x = integers((3, 32))
    out = np.zeros((3, 256), np.float32)
    blocks("warp0_then_all", 3, 256, x, out)
    np.testing.assert_array_equal(out, np.repeat(x.sum(axis=1, keepdims=True), 256, axis=1))


@pytest.mark.parametrize("block, cols", [(32, 7), (128, 300), (1024, 1000)])
def test_a_two_phase_softmax_one_row_per_block(blocks, block, cols):
    x = integers((6, cols), -9, 1)
    y = np.zeros_like(x)
    blocks("softmax2", 6, block, x, y, cols)
    e = np.exp2(x - x.max(axis=1, keepdims=True))  # powers of 2; their sums are exact in float32
    np.testing.assert_array_equal(y, e / e.sum(axis=1, keepdims=True, dtype=np.float32))


def test_dynamic_shared_memory_of_any_type_and_several_blocks(blocks):
    x = integers((4, 96), dtype=np.float64) + 2.0 ** -30  # not a float: all 8 bytes must pass
    out = np.zeros(4)
    blocks("dynamic_sum", 4, 96, x, out)
    np.testing.assert_array_equal(out, x.sum(axis=1))


def test_fiber_stacks_hold_48_kib_across_barriers(blocks):
    out = np.full((2, 64), -1, np.int32)
    blocks("deep_stack", 2, 64, out)
    assert not out.any()


def test_fiber_stacks_are_freed():
    """Each launch of 1024 threads maps 1024 stacks (68 MiB); 30 launches must not keep them."""
    statm = Path("/proc/self/statm")
    if not statm.exists():
        pytest.skip("needs /proc")

    def mapped():
        return int(statm.read_text().split()[0]) * os.sysconf("SC_PAGESIZE")

    module = blocks_module()
    x, out = integers((1, 1024)), np.zeros(1, np.float32)
    module("tree_sum", 1, 1024, x, out)
    before = mapped()
    for _ in range(30):
        module("tree_sum", 1, 1024, x, out)
    assert mapped() - before < 256 << 20, (before, mapped())
    assert out[0] == x.sum()


def test_the_ucontext_fibers_give_the_same_results():
    """FZ_SIM_UCONTEXT: the portable fibers the sim uses where it has no hand-written switch (not x86-64)."""
    module = blocks_module(defines=["FZ_SIM_UCONTEXT"])
    x = integers((3, 1024))
    out = np.zeros(3, np.float32)
    module("tree_sum", 3, 1024, x, out)
    np.testing.assert_array_equal(out, x.sum(axis=1))
    x = integers((2, 300), -9, 1)
    y = np.zeros_like(x)
    module("softmax2", 2, 128, x, y, 300)
    e = np.exp2(x - x.max(axis=1, keepdims=True))
    np.testing.assert_array_equal(y, e / e.sum(axis=1, keepdims=True, dtype=np.float32))


# ---- warp operations ----------------------------------------------------------

TYPES = {"float": np.float32, "double": np.float64, "int": np.int32, "unsigned": np.uint32,
         "long long": np.int64}

WARPS = r"""
#define FULL 0xffffffffu
extern "C" __global__ void xor_sum_{N}(const {T}* __restrict__ x, {T}* __restrict__ out)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    {T} v = x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    out[i] = v;
}
extern "C" __global__ void down_sum_{N}(const {T}* __restrict__ x, {T}* __restrict__ out)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    {T} v = x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(FULL, v, o);
    out[i] = v;
}
extern "C" __global__ void up_scan_{N}(const {T}* __restrict__ x, {T}* __restrict__ out)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    {T} v = x[i];
    for (int d = 1; d < 32; d <<= 1) {
        const {T} u = __shfl_up_sync(FULL, v, d);
        if (threadIdx.x % 32 >= (unsigned)d) v += u;
    }
    out[i] = v;
}
extern "C" __global__ void rotate_{N}(const {T}* __restrict__ x, {T}* __restrict__ out)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __shfl_sync(FULL, x[i], threadIdx.x + 1);
}
"""
SHARED = r"""
// Every shuffle with every width: mode 0 up, 1 down, 2 xor, 3 index.
extern "C" __global__ void shuffle(const int* __restrict__ x, int* __restrict__ out, int mode, int b, int width)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    const int v = x[i];
    out[i] = mode == 0 ? __shfl_up_sync(FULL, v, b, width) : mode == 1 ? __shfl_down_sync(FULL, v, b, width)
           : mode == 2 ? __shfl_xor_sync(FULL, v, b, width) : __shfl_sync(FULL, v, b, width);
}

// A block whose size is not a multiple of 32: its last warp's lanes are what
// __activemask() gives. The careful sum reads no lane beyond the block; the
// naive one does, and gets the sim's poison there (all bits set).
extern "C" __global__ void careful_sum(const int* __restrict__ x, int* __restrict__ out)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x, mask = __activemask();
    const unsigned lanes = __builtin_popcount(mask), lane = threadIdx.x % 32;
    int v = x[i];
    for (unsigned o = 16; o > 0; o >>= 1) {
        const int u = __shfl_down_sync(mask, v, o);
        if (lane + o < lanes) v += u;
    }
    out[i] = v;
}
extern "C" __global__ void naive_sum_float(const float* __restrict__ x, float* __restrict__ out)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(__activemask(), v, o);
    out[i] = v;
}
extern "C" __global__ void naive_sum_int(const int* __restrict__ x, int* __restrict__ out)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(__activemask(), v, o);
    out[i] = v;
}
extern "C" __global__ void warp_sync(int* __restrict__ out)
{
    __shared__ int s[32];
    s[threadIdx.x % 32] = threadIdx.x;
    __syncwarp();
    out[threadIdx.x] = s[31 - threadIdx.x % 32];
}

// Misuse.
extern "C" __global__ void mixed_ops(int* __restrict__ out)
{
    int v = threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_xor_sync(FULL, v, 1); else __syncwarp();
    out[threadIdx.x] = v;
}
extern "C" __global__ void lane_returns(int* __restrict__ out)
{
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = __shfl_xor_sync(FULL, (int)threadIdx.x, 1);
}
extern "C" __global__ void lane_at_barrier(int* __restrict__ out)
{
    if (threadIdx.x == 3) __syncthreads();
    else out[threadIdx.x] = __shfl_xor_sync(FULL, (int)threadIdx.x, 1);
}
extern "C" __global__ void half_mask(int* __restrict__ out)
{
    out[threadIdx.x] = __shfl_xor_sync(0xffffu, (int)threadIdx.x, 1);
}
"""


def name(c_type: str) -> str:
    return c_type.replace(" ", "_")


@pytest.fixture(scope="module")
def warps():
    cuda = "".join(WARPS.replace("{T}", t).replace("{N}", name(t)) for t in TYPES) + SHARED
    kernels = {f"{k}_{name(t)}": ([f"const {t}*", f"{t}*"], "0")
               for t in TYPES for k in ("xor_sum", "down_sum", "up_scan", "rotate")}
    kernels.update({"shuffle": (["const int*", "int*", "int", "int", "int"], "0"),
                    "careful_sum": (["const int*", "int*"], "0"),
                    "naive_sum_float": (["const float*", "float*"], "0"),
                    "naive_sum_int": (["const int*", "int*"], "0"),
                    **{k: (["int*"], "0") for k in ("warp_sync", "mixed_ops", "lane_returns", "lane_at_barrier",
                                                     "half_mask")},
                    "xor_sum_sequential": (["const int*", "int*"], None)})
    cuda += "extern \"C\" void xor_sum_sequential(const int* x, int* out) { xor_sum_int(x, out); }\n"
    return Module(cuda, kernels)


def values(c_type: str, shape) -> np.ndarray:
    """Values whose sums are exact, and that fill all of each type's bytes."""
    rng = np.random.default_rng(1)
    match c_type:
        case "float":
            return rng.integers(-1000, 1000, shape).astype(np.float32)
        case "double":
            return rng.integers(-1000, 1000, shape) + 2.0 ** -40 * rng.integers(0, 8, shape)
        case "unsigned":
            return rng.integers(0, 2 ** 32, shape, dtype=np.uint32)  # the sums wrap
        case "long long":
            return rng.integers(-2 ** 40, 2 ** 40, shape)
        case _:
            return rng.integers(-2 ** 20, 2 ** 20, shape).astype(np.int32)


def down_model(x: np.ndarray, threads: int | None = None) -> np.ndarray:
    """Each thread's value after v += shfl_down(v, o) for o = 16 ... 1, by CUDA's
    rule: a lane whose source is past lane 31 gets its own value. `threads`: the
    block's, where not a multiple of 32: a lane beyond it reads as all bits set."""
    size = -(-x.size // 32) * 32
    v = np.zeros(size, x.dtype)
    v[:x.size] = x.reshape(-1)
    thread = np.arange(size)
    poison = np.frombuffer(b"\xff" * x.itemsize, x.dtype)[0]
    for o in (16, 8, 4, 2, 1):
        src = np.where(thread % 32 + o < 32, thread + o, thread)
        with np.errstate(over="ignore", invalid="ignore"):
            v = v + np.where(src < (threads or size), v[np.minimum(src, size - 1)], poison)
    return v[:x.size].reshape(x.shape)


@pytest.mark.parametrize("c_type", list(TYPES))
def test_warp_sums_by_xor_and_down_shuffles_and_a_scan_by_up(warps, c_type):
    x = values(c_type, (3, 128))
    warp_sums = x.reshape(-1, 32).sum(axis=1, dtype=x.dtype)
    out = np.zeros_like(x)
    warps(f"xor_sum_{name(c_type)}", 3, 128, x, out)
    np.testing.assert_array_equal(out.reshape(-1, 32), np.repeat(warp_sums[:, None], 32, axis=1))
    warps(f"down_sum_{name(c_type)}", 3, 128, x, out)
    np.testing.assert_array_equal(out.reshape(-1, 32)[:, 0], warp_sums)
    np.testing.assert_array_equal(out, down_model(x))
    warps(f"up_scan_{name(c_type)}", 3, 128, x, out)
    np.testing.assert_array_equal(out.reshape(-1, 32), np.cumsum(x.reshape(-1, 32), axis=1, dtype=x.dtype))
    warps(f"rotate_{name(c_type)}", 3, 128, x, out)
    np.testing.assert_array_equal(out.reshape(-1, 32), np.roll(x.reshape(-1, 32), -1, axis=1))


def shuffle_model(x: np.ndarray, mode: int, b: int, width: int) -> np.ndarray:
    """CUDA's rules (the Programming Guide's warp shuffle functions): lanes in
    segments of `width`; up/down read b lanes away within the segment, else their
    own value; xor reads lane ^ b in its segment or an earlier one, else its own
    value; index reads lane b % width of its segment."""
    lane = np.arange(len(x)) % 32
    base = np.arange(len(x)) - lane  # each warp's first thread
    first = lane // width * width
    match mode:
        case 0:
            src = np.where(lane - first >= b, lane - b, lane)
        case 1:
            src = np.where(lane - first + b < width, lane + b, lane)
        case 2:
            src = np.where((lane ^ b) < first + width, lane ^ b, lane)
        case _:
            src = first + b % width
    return x[base + src]


@pytest.mark.parametrize("mode, b", [(0, 1), (0, 3), (1, 1), (1, 5), (2, 1), (2, 6), (2, 17), (3, 0), (3, 7),
                                     (3, 37)])
@pytest.mark.parametrize("width", [32, 16, 8, 4, 1])
def test_every_shuffle_by_cudas_rules(warps, mode, b, width):
    x = np.arange(1000, 1064, dtype=np.int32)
    out = np.zeros_like(x)
    warps("shuffle", 1, 64, x, out, mode, b, width)
    np.testing.assert_array_equal(out, shuffle_model(x, mode, b, width))


@pytest.mark.parametrize("block", [48, 100])
def test_a_block_that_is_not_a_multiple_of_32(warps, block):
    x = np.arange(1, block + 1, dtype=np.int32) * 3
    out = np.zeros_like(x)
    warps("careful_sum", 1, block, x, out)
    starts = np.arange(0, block, 32)
    np.testing.assert_array_equal(out[starts], np.add.reduceat(x, starts))
    # The naive sum's last warp reads lanes the block does not have: they read as all bits set.
    naive = np.zeros_like(x)
    warps("naive_sum_int", 1, block, x, naive)
    np.testing.assert_array_equal(naive, down_model(x, block))
    xf, naive_f = x.astype(np.float32), np.zeros(block, np.float32)
    warps("naive_sum_float", 1, block, xf, naive_f)
    np.testing.assert_array_equal(naive_f, down_model(xf, block))
    assert np.isnan(naive_f[block // 32 * 32])  # lane 0 of the last warp: NaN
    # A full mask names lanes the last warp does not have.
    last = (block - 1) // 32
    with pytest.raises(RuntimeError, match=rf"warp {last}: __shfl_xor_sync with mask 0xffffffff; the sim needs the "
                                           rf"mask of every lane the warp has, 0x{(1 << block % 32) - 1:08x}"):
        warps("xor_sum_int", 1, block, x, out)


def test_syncwarp(warps):
    out = np.zeros(32, np.int32)
    warps("warp_sync", 1, 32, out)
    np.testing.assert_array_equal(out, np.arange(31, -1, -1))


# ---- dynamic shared memory ------------------------------------------------------

DYNAMIC = r"""
extern __shared__ float fz_smem[];
// Reverses each block's elements through dynamic shared memory.
extern "C" __global__ void reverse(const float* __restrict__ x, float* __restrict__ out)
{
    fz_smem[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = fz_smem[blockDim.x - 1 - threadIdx.x];
}
// Reads before it writes: each block's dynamic shared memory starts all bits set.
extern "C" __global__ void unwritten(float* __restrict__ out)
{
    out[blockIdx.x * blockDim.x + threadIdx.x] = fz_smem[threadIdx.x];
    __syncthreads();
    fz_smem[threadIdx.x] = 1.0f;
}
extern "C" __global__ void overrun(float* __restrict__ out)
{
    fz_smem[threadIdx.x + 1] = 0.0f;
}
"""


@pytest.fixture(scope="module")
def dynamic():
    cuda = DYNAMIC + "extern \"C\" void too_much(float* out) { overrun(out); }\n"
    return Module(cuda, {"reverse": (["const float*", "float*"], "block * 4u"),
                         "unwritten": (["float*"], "block * 4u"),
                         "overrun": (["float*"], "block * 4u"),
                         "too_much": (["float*"], "232449u")})


def test_dynamic_shared_memory_sized_per_launch(dynamic):
    for block in (1, 40, 1024):
        x = integers((3, block))
        out = np.zeros_like(x)
        dynamic("reverse", 3, block, x, out)
        np.testing.assert_array_equal(out, x[:, ::-1])


def test_dynamic_shared_memory_starts_each_block_all_bits_set(dynamic):
    out = np.zeros((2, 64), np.float32)
    dynamic("unwritten", 2, 64, out)
    assert (out.view(np.uint32) == 0xFFFFFFFF).all()


def test_a_write_past_the_dynamic_shared_memory_fails(dynamic):
    out = np.zeros(64, np.float32)
    with pytest.raises(RuntimeError, match="block 0 wrote past its 256 bytes of dynamic shared memory"):
        dynamic("overrun", 1, 64, out)
    with pytest.raises(RuntimeError, match="232449 bytes of dynamic shared memory: a block may have at most 232448"):
        dynamic("too_much", 1, 64, out)


# ---- misuse: an error, not a hang or a wrong answer ---------------------------------


def test_a_barrier_that_some_threads_return_before_fails(blocks):
    out = np.zeros(48, np.float32)
    with pytest.raises(RuntimeError, match=re.escape("block 0: __syncthreads() reached by 16 of its 48 threads; "
                                                     "the others returned without reaching it (thread 16 did)")):
        blocks("early_return", 1, 48, out)
    x, sums = integers((2, 64)), np.zeros(2, np.float32)
    blocks("tree_sum", 2, 64, x, sums)  # the next launch is not disturbed
    np.testing.assert_array_equal(sums, x.sum(axis=1))


@pytest.mark.parametrize("kernel, message", [
    ("mixed_ops", ("block 0, warp 0: lanes at different warp operations: lane 0 at __shfl_xor_sync (4 bytes), "
                   "lane 31 at __syncwarp() (4 bytes)")),
    ("lane_returns", ("block 0, warp 0: __shfl_xor_sync reached by 31 of its 32 lanes; lane 5 returned without "
                      "reaching it")),
    ("lane_at_barrier", ("block 0, warp 0: __shfl_xor_sync reached by 31 of its 32 lanes; lane 3 waits at "
                         "__syncthreads()")),
    ("half_mask", "block 0, warp 0: __shfl_xor_sync with mask 0x0000ffff; the sim needs the mask of every lane"),
])
def test_warp_operations_that_not_every_lane_reaches_alike_fail(warps, kernel, message):
    out = np.zeros(64, np.int32)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        warps(kernel, 1, 64 if kernel == "lane_returns" else 32, out)


def test_a_barrier_in_a_sequential_launch_fails(blocks, warps):
    with pytest.raises(RuntimeError, match=re.escape("__syncthreads() in a kernel launched with fz_sim_grid")):
        blocks("tree_sum_sequential", 1, 32, integers((1, 32)), np.zeros(1, np.float32))
    with pytest.raises(RuntimeError, match="__shfl_xor_sync in a kernel launched with fz_sim_grid"):
        warps("xor_sum_sequential", 1, 32, np.zeros(32, np.int32), np.zeros(32, np.int32))


def test_the_sim_backend_raises_the_sims_error():
    """Through SimBackend: the launcher's error is a RuntimeError naming the variant."""
    program = fusec.frontend.load(str(ROOT / "examples/scale_bias_relu.fz"))
    compiled = compile_pipeline(program, "scale_bias_relu")
    cuda = compiled.cuda.replace("    y[i] = v3;", "    __syncthreads();\n    y[i] = v3;")
    assert cuda != compiled.cuda
    run = Executor(compiled.interface, SimBackend(cuda, compiled.interface))
    x = np.ones(14, np.float32)[1:]  # 4 bytes into its buffer: the one-element variant runs
    with pytest.raises(RuntimeError, match=r"the sim's scale_bias_relu_k0: __syncthreads\(\) in a kernel "
                                           r"launched with fz_sim_grid.*\(a fusec bug\)"):
        run(x, 2.0, 0.0)
