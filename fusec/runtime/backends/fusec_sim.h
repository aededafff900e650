// fusec_sim.h: what emitted CUDA C needs to compile, unchanged, as host C++
// (the sim backend). Every thread of the grid runs in turn, one after another;
// in a cooperative launch, a block's threads run as fibers that meet at barriers.
#pragma once
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)  /* a hint to ptxas: nothing on the host */
// Shared memory, one copy per OS thread: thread_local implies static at block
// scope and, unlike static, also combines with `extern` (dynamic shared memory,
// below). A block's threads run as fibers of one OS thread and blocks run one
// after another, so this is one copy per block, shared by its threads. Like
// threadIdx and the rest (plain globals), it relies on one launch at a time
// per process. Defined before the CUDA headers, which keep a __shared__ already defined.
#define __shared__ thread_local
#if __has_include(<cuda_fp16.h>)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

using std::isinf;
using std::isnan;

struct fz_uint3 { unsigned x, y, z; };
inline fz_uint3 threadIdx, blockIdx, blockDim, gridDim;

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
// Fast math's intrinsics: the sim computes them accurately (the GPU approximates;
// the README gives each one's error there).
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, sizeof f); return f; }
// Additions rounded once (the host compiler does not contract: -ffp-contract=off).
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, sizeof d); return d; }

// Runs kernel(...) for every thread of a 1-D grid.
template <typename F>
void fz_sim_grid(unsigned grid, unsigned block, F kernel)
{
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < block; ++t) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            kernel();
        }
}

// ---- Misuse: an error the launcher returns, not a hang or a crash -----------

// What the sim found wrong; fz_sim_launch returns it (sim.py raises it).
inline char fz_sim_error[512];
struct fz_sim_misuse {};

[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fz_sim_fail(const char* format, ...)
{
    va_list args;
    va_start(args, format);
    std::vsnprintf(fz_sim_error, sizeof fz_sim_error, format, args);
    va_end(args);
    throw fz_sim_misuse{};
}

// Runs one launch: nullptr, or the message of the misuse that stopped it.
template <typename L>
const char* fz_sim_launch(L launch)
{
    try {
        launch();
        return nullptr;
    } catch (const fz_sim_misuse&) {
        return fz_sim_error;
    }
}

// ---- Cooperative launches: __syncthreads, shared memory, warp shuffles ------
//
// fz_sim_grid_cooperative runs each block's threads as fibers (a stack each)
// on this OS thread; blocks still run one after another. A thread runs until it
// reaches a barrier, then the next thread that can run does; a barrier lets its
// threads go on once all have reached it: the block's for __syncthreads, the
// warp's lanes for __syncwarp and the shuffles (which also exchange a value per
// lane). Between barriers the threads run in thread order: deterministic.
//
// Where CUDA leaves things undefined, the sim defines them:
// - A barrier some threads never reach (they returned, or wait at another
//   barrier), lanes of a warp at different warp operations, and any barrier or
//   shuffle in a kernel launched with fz_sim_grid are errors.
// - A warp operation's mask must name exactly the lanes its warp has:
//   0xffffffff, or in the last warp of a block whose size is not a multiple of
//   32, that warp's lanes (what __activemask() returns: the sim's warps never
//   diverge). A shuffle that reads a lane beyond the block (which CUDA leaves
//   undefined) gets all bits set: NaN for float and double, -1, ~0u.
// - Dynamic shared memory is `extern __shared__ T fz_smem[]` (that name: the
//   sim defines it; any one T per module, as nvcc requires); each block's starts
//   with all bits set, and a write past its shared_bytes is an error. Static
//   __shared__ arrays start zeroed and keep the previous block's values.

#ifndef warpSize
constexpr int warpSize = 32;
#endif
#define FZ_SIM_SHARED_CAPACITY 232448  // bytes: 227 KiB, the most an H100 or H200 block may have
#define FZ_SIM_SHARED_GUARD 256        // bytes after the block's dynamic shared memory, checked
constexpr unsigned char FZ_SIM_GUARD_FILL = 0xA5;
constexpr size_t FZ_SIM_STACK_BYTES = 64 << 10;      // per thread; a guard page below each

#define FZ_SIM_STR_(x) #x
#define FZ_SIM_STR(x) FZ_SIM_STR_(x)
// fz_smem in assembly, so that kernels may declare it with any element type;
// fz_sim_dynamic_shared is the same bytes for the launcher. A COMDAT group: one
// definition however many translation units include this.
asm(".pushsection .tbss.fz_sim_dynamic_shared,\"awTG\",@nobits,fz_sim_dynamic_shared,comdat\n"
    ".p2align 6\n"
    ".globl fz_smem\n.hidden fz_smem\n.type fz_smem,@object\n"
    ".size fz_smem, " FZ_SIM_STR(FZ_SIM_SHARED_CAPACITY + FZ_SIM_SHARED_GUARD) "\n"
    ".globl fz_sim_dynamic_shared\n.hidden fz_sim_dynamic_shared\n.type fz_sim_dynamic_shared,@object\n"
    ".size fz_sim_dynamic_shared, " FZ_SIM_STR(FZ_SIM_SHARED_CAPACITY + FZ_SIM_SHARED_GUARD) "\n"
    "fz_smem:\nfz_sim_dynamic_shared:\n.zero " FZ_SIM_STR(FZ_SIM_SHARED_CAPACITY + FZ_SIM_SHARED_GUARD) "\n"
    ".popsection\n");
extern __thread unsigned char fz_sim_dynamic_shared[];

#if defined(__x86_64__) && !defined(FZ_SIM_UCONTEXT)
// Fibers switched by hand: swapcontext makes a system call each time (it sets
// the signal mask), measured at 530 ns a switch against 30 ns for this. It
// saves the callee-saved registers on the old stack and restores them from the
// new one; not MXCSR or the x87 control word, which kernels never change.
extern "C" void fz_sim_switch(void** save_sp, void* load_sp);
asm(".pushsection .text.fz_sim_switch,\"axG\",@progbits,fz_sim_switch,comdat\n"
    ".globl fz_sim_switch\n.hidden fz_sim_switch\n.type fz_sim_switch,@function\n"
    "fz_sim_switch:\n"
    "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
    "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
    "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\n"
    "ret\n"
    ".size fz_sim_switch, .-fz_sim_switch\n"
    ".popsection\n");
struct fz_sim_context { void* sp; };
inline void fz_sim_swap(fz_sim_context& from, const fz_sim_context& to) { fz_sim_switch(&from.sp, to.sp); }
// A context whose first switch "returns" into entry, as if called (the stack
// 16-byte aligned at the call), with a null return address that ends unwinding.
inline void fz_sim_make(fz_sim_context& c, char* stack, size_t bytes, void (*entry)())
{
    void** sp = reinterpret_cast<void**>(stack + bytes) - 8;
    for (int i = 0; i < 6; ++i) sp[i] = nullptr;  // r15 ... rbp
    sp[6] = reinterpret_cast<void*>(entry);
    sp[7] = nullptr;
    c.sp = sp;
}
#else
#include <ucontext.h>
struct fz_sim_context { ucontext_t uc; };
inline void fz_sim_swap(fz_sim_context& from, const fz_sim_context& to) { swapcontext(&from.uc, &to.uc); }
inline void fz_sim_make(fz_sim_context& c, char* stack, size_t bytes, void (*entry)())
{
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = bytes;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

enum fz_sim_state : unsigned char { FZ_SIM_READY, FZ_SIM_AT_BARRIER, FZ_SIM_AT_WARP_OP, FZ_SIM_AT_CLUSTER,
                                     FZ_SIM_RETURNED };
constexpr unsigned FZ_SIM_BEYOND = 32;  // a shuffle's source: a lane the block does not have

struct fz_sim_thread {
    fz_sim_context context;
    fz_sim_state state;
    unsigned char size;        // bytes a warp operation exchanges
    unsigned src;              // the lane a shuffle reads
    const char* op;            // the barrier or warp operation it waits at
    unsigned long long value;  // its value at a shuffle; then the value it gets
    bool cluster_arrived;      // arrived at the cluster's barrier, not yet waited
};

// One block's threads, while a cooperative launch runs it.
struct fz_sim_block {
    fz_sim_thread* threads;
    unsigned n, current, arrived, returned, cluster_waiting;
    unsigned warp_arrived[32];
    fz_sim_context launcher;
    void (*body)(void*);
    void* kernel;
    bool failed;
};
inline fz_sim_block* fz_sim_running = nullptr;  // null: no cooperative launch (fz_sim_grid's threads)

[[noreturn]] inline void fz_sim_fail_uncooperative(const char* op)
{
    fz_sim_fail("%s in a kernel launched with fz_sim_grid: a kernel whose threads synchronize needs "
                "fz_sim_grid_cooperative (mark it cooperative in the sim launcher)", op);
}

// Every thread waits and none can run: says why.
[[noreturn]] inline void fz_sim_fail_stuck(const fz_sim_block& r)
{
    unsigned waiting = 0, gone = r.n;
    for (unsigned i = 0; i < r.n; ++i) {
        waiting += r.threads[i].state == FZ_SIM_AT_BARRIER;
        if (r.threads[i].state == FZ_SIM_RETURNED && gone == r.n) gone = i;
    }
    if (waiting && gone < r.n)
        fz_sim_fail("block %u: __syncthreads() reached by %u of its %u threads; the others returned without "
                    "reaching it (thread %u did), which CUDA leaves undefined", blockIdx.x, waiting, r.n, gone);
    for (unsigned w = 0; w * 32 < r.n; ++w) {
        const fz_sim_thread* lane = r.threads + w * 32;
        unsigned lanes = r.n - w * 32 < 32 ? r.n - w * 32 : 32, at = 0, first = 32, other = 32;
        for (unsigned i = 0; i < lanes; ++i) {
            if (lane[i].state == FZ_SIM_AT_WARP_OP) at++, first = first < 32 ? first : i;
            else if (other == 32) other = i;
        }
        if (at && other < 32)
            fz_sim_fail("block %u, warp %u: %s reached by %u of its %u lanes; lane %u %s", blockIdx.x, w,
                        lane[first].op, at, lanes, other,
                        lane[other].state == FZ_SIM_RETURNED ? "returned without reaching it"
                                                             : "waits at __syncthreads()");
    }
    if (r.cluster_waiting && gone < r.n)
        fz_sim_fail("block %u: the cluster's barrier reached by %u of its %u threads; the others returned without "
                    "reaching it (thread %u did)", blockIdx.x, r.cluster_waiting, r.n, gone);
    fz_sim_fail("block %u: its threads wait at barriers that none can pass", blockIdx.x);
}

// Switches to the next thread, in order, that can run; returns when this one runs again.
inline void fz_sim_yield(fz_sim_block& r)
{
    unsigned me = r.current, i = me;
    do {
        i = i + 1 == r.n ? 0 : i + 1;
        if (r.threads[i].state == FZ_SIM_READY) {
            if (i != me) {
                r.current = i;
                threadIdx = {i, 0, 0};
                fz_sim_swap(r.threads[me].context, r.threads[i].context);
            }
            return;
        }
    } while (i != me);
    if (r.cluster_waiting == r.n) {  // the whole block waits at its cluster's barrier:
        fz_sim_swap(r.threads[me].context, r.launcher);  // back when every block of the cluster has arrived
        return;
    }
    fz_sim_fail_stuck(r);
}

// Where each fiber starts: runs the kernel for its thread, then lets the others
// finish; the last to return (or one that found a misuse) goes back to the launcher.
inline void fz_sim_thread_main()
{
    fz_sim_block& r = *fz_sim_running;
    try {
        r.body(r.kernel);
        r.threads[r.current].state = FZ_SIM_RETURNED;
        if (++r.returned < r.n) fz_sim_yield(r);  // never returns: this thread cannot run again
    } catch (const fz_sim_misuse&) {
        r.failed = true;
    } catch (...) {
        std::snprintf(fz_sim_error, sizeof fz_sim_error, "block %u: an exception left the kernel", blockIdx.x);
        r.failed = true;
    }
    fz_sim_swap(r.threads[r.current].context, r.launcher);  // outside the handlers: the exception is done
}

inline void __syncthreads()
{
    fz_sim_block* r = fz_sim_running;
    if (!r) fz_sim_fail_uncooperative("__syncthreads()");
    fz_sim_thread& t = r->threads[r->current];
    t.state = FZ_SIM_AT_BARRIER;
    t.op = "__syncthreads()";
    if (++r->arrived == r->n) {  // the last to arrive lets every thread go on
        r->arrived = 0;
        for (unsigned i = 0; i < r->n; ++i) r->threads[i].state = FZ_SIM_READY;
    }
    fz_sim_yield(*r);
}

// ---- Thread-block clusters (sm_90): a barrier across blocks, their shared memory
//
// A cluster's blocks each run on an OS thread of their own (each its own copy
// of shared memory, which is thread_local), one at a time: a block runs until
// all its threads wait at the cluster's barrier (or return), then the next
// block of the cluster runs; when all wait, all go on, lowest rank first.
// Deterministic like the rest. A block that returns while others wait at the
// barrier, and a cluster intrinsic in a launch without clusters, are errors.

struct fz_sim_cluster_state {
    pthread_mutex_t mutex;
    pthread_cond_t changed;
    unsigned blocks, grid;
    unsigned turn;                // the block (of the grid) whose thread runs; grid: none; ~0u: not yet
    unsigned registered;          // blocks' threads that have set their anchor
    unsigned char status[16];     // each block of the current cluster: FZ_SIM_READY, _AT_CLUSTER, _RETURNED
    unsigned char* anchor[16];    // each block's thread's fz_sim_dynamic_shared: its shared memory's place
    bool started[16];             // each block of the current cluster has begun running
    bool failed;
};
inline fz_sim_cluster_state* fz_sim_cluster = nullptr;  // null: a launch without clusters

inline fz_sim_cluster_state& fz_sim_cluster_of(const char* op)
{
    if (!fz_sim_running) fz_sim_fail_uncooperative(op);
    if (!fz_sim_cluster) fz_sim_fail("block %u: %s in a kernel launched without clusters", blockIdx.x, op);
    return *fz_sim_cluster;
}

inline unsigned __clusterRelativeBlockRank()
{
    return blockIdx.x % fz_sim_cluster_of("__clusterRelativeBlockRank()").blocks;
}

inline void __cluster_barrier_arrive()
{
    fz_sim_cluster_of("__cluster_barrier_arrive()");
    fz_sim_thread& t = fz_sim_running->threads[fz_sim_running->current];
    if (t.cluster_arrived)
        fz_sim_fail("block %u, thread %u: __cluster_barrier_arrive() twice without a wait", blockIdx.x, threadIdx.x);
    t.cluster_arrived = true;
}

inline void __cluster_barrier_arrive_relaxed() { __cluster_barrier_arrive(); }  // the sim orders every access

inline void __cluster_barrier_wait()
{
    fz_sim_cluster_of("__cluster_barrier_wait()");
    fz_sim_block& r = *fz_sim_running;
    fz_sim_thread& t = r.threads[r.current];
    if (!t.cluster_arrived)
        fz_sim_fail("block %u, thread %u: __cluster_barrier_wait() without __cluster_barrier_arrive()", blockIdx.x,
                    threadIdx.x);
    t.state = FZ_SIM_AT_CLUSTER;
    t.op = "__cluster_barrier_wait()";
    ++r.cluster_waiting;
    fz_sim_yield(r);
    t.cluster_arrived = false;
}

// The address in block `rank`'s shared memory of what `p` is in the caller's.
inline void* __cluster_map_shared_rank(void* p, unsigned rank)
{
    fz_sim_cluster_state& c = fz_sim_cluster_of("__cluster_map_shared_rank()");
    if (rank >= c.blocks)
        fz_sim_fail("block %u: __cluster_map_shared_rank() to rank %u of a cluster of %u", blockIdx.x, rank, c.blocks);
    if (!c.started[rank])  // CUDA asks for a barrier of the cluster's blocks before their shared memory is used
        fz_sim_fail("block %u: __cluster_map_shared_rank() to block %u of its cluster, which has not started "
                    "(no cluster barrier since the kernel began)", blockIdx.x, blockIdx.x - blockIdx.x % c.blocks + rank);
    if (c.status[rank] == FZ_SIM_RETURNED)  // its shared memory is gone (CUDA leaves the access undefined)
        fz_sim_fail("block %u: __cluster_map_shared_rank() to block %u of its cluster, which has returned",
                    blockIdx.x, blockIdx.x - blockIdx.x % c.blocks + rank);
    return static_cast<unsigned char*>(p) - c.anchor[blockIdx.x % c.blocks] + c.anchor[rank];
}

// The lanes of the calling thread's warp that exist in the block.
inline unsigned __activemask()
{
    unsigned lanes = blockDim.x - (threadIdx.x & ~31u);
    return lanes >= 32 ? 0xffffffffu : (1u << lanes) - 1;
}

// A barrier among the warp's lanes at which each lane leaves `value` and gets
// the value of lane `src` (FZ_SIM_BEYOND: all bits set).
template <typename T>
inline T fz_sim_warp_op(const char* op, unsigned mask, T value, unsigned src)
{
    static_assert(sizeof(T) <= sizeof(unsigned long long), "a warp operation exchanges at most 8 bytes");
    fz_sim_block* r = fz_sim_running;
    if (!r) fz_sim_fail_uncooperative(op);
    const unsigned tid = r->current, warp = tid / 32, lanes_mask = __activemask();
    if (mask != lanes_mask)
        fz_sim_fail("block %u, warp %u: %s with mask 0x%08x; the sim needs the mask of every lane the warp has, "
                    "0x%08x (__activemask(); the block has %u threads)", blockIdx.x, warp, op, mask, lanes_mask,
                    r->n);
    fz_sim_thread& t = r->threads[tid];
    t.state = FZ_SIM_AT_WARP_OP;
    t.op = op;
    t.size = sizeof(T);
    t.src = src;
    t.value = 0;
    std::memcpy(&t.value, &value, sizeof(T));
    const unsigned lanes = __builtin_popcount(lanes_mask);
    if (++r->warp_arrived[warp] == lanes) {  // the last lane to arrive exchanges for all
        r->warp_arrived[warp] = 0;
        fz_sim_thread* lane = r->threads + warp * 32;
        unsigned long long got[32];
        for (unsigned i = 0; i < lanes; ++i) {
            if (std::strcmp(lane[i].op, op) != 0 || lane[i].size != t.size)
                fz_sim_fail("block %u, warp %u: lanes at different warp operations: lane %u at %s (%u bytes), "
                            "lane %u at %s (%u bytes)", blockIdx.x, warp, i, lane[i].op, lane[i].size,
                            tid % 32, op, t.size);
            got[i] = lane[i].src < lanes ? lane[lane[i].src].value : ~0ull;
        }
        for (unsigned i = 0; i < lanes; ++i) {
            lane[i].value = got[i];
            lane[i].state = FZ_SIM_READY;
        }
    }
    fz_sim_yield(*r);
    T out;
    std::memcpy(&out, &t.value, sizeof(T));
    return out;
}

inline void __syncwarp(unsigned mask = 0xffffffffu) { fz_sim_warp_op("__syncwarp()", mask, 0, threadIdx.x % 32); }

// The lane a shuffle reads, by PTX's shfl.sync (CUDA's width w is its c
// operand: segment mask 32 - w, clamp w - 1, or 0 for up): a source outside
// the caller's w-lane segment (later segments, for xor) is the caller itself.
enum fz_sim_shfl_mode { FZ_SIM_SHFL_UP, FZ_SIM_SHFL_DOWN, FZ_SIM_SHFL_XOR, FZ_SIM_SHFL_IDX };
inline unsigned fz_sim_shfl_src(fz_sim_shfl_mode mode, const char* op, unsigned b, int width)
{
    if (width < 1 || width > 32 || (width & (width - 1)))
        fz_sim_fail("block %u: %s with width %d, not a power of 2 up to 32", blockIdx.x, op, width);
    const int lane = threadIdx.x % 32, b5 = b & 31, segment = (32 - width) & 31;
    const int first = lane & segment, last = first | (mode == FZ_SIM_SHFL_UP ? 0 : 31 & ~segment);
    int j;
    bool in;
    switch (mode) {
    case FZ_SIM_SHFL_UP: j = lane - b5; in = j >= last; break;
    case FZ_SIM_SHFL_DOWN: j = lane + b5; in = j <= last; break;
    case FZ_SIM_SHFL_XOR: j = lane ^ b5; in = j <= last; break;
    default: j = first | (b5 & ~segment); in = j <= last; break;
    }
    const unsigned src = in ? j : lane;
    return src < __builtin_popcount(__activemask()) ? src : FZ_SIM_BEYOND;
}

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize)
{
    return fz_sim_warp_op("__shfl_sync", mask, var,
                          fz_sim_shfl_src(FZ_SIM_SHFL_IDX, "__shfl_sync", srcLane, width));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize)
{
    return fz_sim_warp_op("__shfl_up_sync", mask, var,
                          fz_sim_shfl_src(FZ_SIM_SHFL_UP, "__shfl_up_sync", delta, width));
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize)
{
    return fz_sim_warp_op("__shfl_down_sync", mask, var,
                          fz_sim_shfl_src(FZ_SIM_SHFL_DOWN, "__shfl_down_sync", delta, width));
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize)
{
    return fz_sim_warp_op("__shfl_xor_sync", mask, var,
                          fz_sim_shfl_src(FZ_SIM_SHFL_XOR, "__shfl_xor_sync", laneMask, width));
}

// The fibers' stacks, for one launch: FZ_SIM_STACK_BYTES each above a guard
// page, so that an overflow faults rather than corrupting the next stack.
struct fz_sim_stacks {
    char* base;
    size_t page, stride, bytes;
    explicit fz_sim_stacks(unsigned n)
    {
        page = sysconf(_SC_PAGESIZE);
        stride = page + (FZ_SIM_STACK_BYTES + page - 1) / page * page;
        bytes = stride * n;
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fz_sim_fail("could not map %u fiber stacks of %zu bytes", n, stride);
        base = static_cast<char*>(p);
        for (unsigned i = 0; i < n; ++i) mprotect(base + i * stride, page, PROT_NONE);
    }
    ~fz_sim_stacks() { munmap(base, bytes); }
    char* stack(unsigned i) const { return base + i * stride + page; }
    size_t stack_bytes() const { return stride - page; }
};

// One block's fibers, run from this OS thread (the block's launcher context).
struct fz_sim_block_runner {
    fz_sim_stacks stacks;
    fz_sim_thread* threads;
    fz_sim_block r{};
    unsigned shared_bytes;

    template <typename F>
    fz_sim_block_runner(unsigned block, unsigned shared, F& kernel)
        : stacks(block), threads(new fz_sim_thread[block]), shared_bytes(shared)
    {
        r.threads = threads;
        r.n = block;
        r.body = [](void* k) { (*static_cast<F*>(k))(); };
        r.kernel = &kernel;
    }
    ~fz_sim_block_runner() { delete[] threads; }

    // Block b's threads made ready to start; its dynamic shared memory filled.
    void start(unsigned b)
    {
        std::memset(fz_sim_dynamic_shared, 0xFF, shared_bytes);
        std::memset(fz_sim_dynamic_shared + shared_bytes, FZ_SIM_GUARD_FILL, FZ_SIM_SHARED_GUARD);
        r.current = r.arrived = r.returned = r.cluster_waiting = 0;
        r.failed = false;
        std::memset(r.warp_arrived, 0, sizeof r.warp_arrived);
        for (unsigned t = 0; t < r.n; ++t) {
            r.threads[t].state = FZ_SIM_READY;
            r.threads[t].cluster_arrived = false;
            fz_sim_make(r.threads[t].context, stacks.stack(t), stacks.stack_bytes(), fz_sim_thread_main);
        }
        blockIdx = {b, 0, 0};
    }
    // Runs the block's threads until all return, one fails, or all wait at the cluster's barrier.
    void resume()
    {
        fz_sim_running = &r;
        threadIdx = {r.current, 0, 0};
        fz_sim_swap(r.launcher, r.threads[r.current].context);
        if (r.failed) throw fz_sim_misuse{};
    }
    bool returned() const { return r.returned == r.n; }
    // After every block of the cluster arrived at its barrier: its threads go on.
    void release()
    {
        r.cluster_waiting = 0;
        for (unsigned t = 0; t < r.n; ++t) r.threads[t].state = FZ_SIM_READY;
    }
    void check_guard(unsigned b) const
    {
        for (unsigned i = 0; i < FZ_SIM_SHARED_GUARD; ++i)
            if (fz_sim_dynamic_shared[shared_bytes + i] != FZ_SIM_GUARD_FILL)
                fz_sim_fail("block %u wrote past its %u bytes of dynamic shared memory", b, shared_bytes);
    }
};

struct fz_sim_cluster_worker {
    fz_sim_cluster_state* c;
    unsigned rank, block, shared_bytes;
    void* kernel;
    void (*run)(fz_sim_cluster_worker&);
};

// Waits, holding the cluster's mutex, for block b's turn; false if the launch failed.
inline bool fz_sim_cluster_wait_turn(fz_sim_cluster_state& c, unsigned b)
{
    while (c.turn != b && !c.failed) pthread_cond_wait(&c.changed, &c.mutex);
    return !c.failed;
}

// The turn after block `rank` of cluster `first / blocks` stopped (returned, or
// waits at the barrier): the next block of the cluster that can run; else all go
// on past the barrier; else the next cluster. Called holding the mutex.
inline void fz_sim_cluster_next(fz_sim_cluster_state& c, unsigned first, unsigned rank)
{
    unsigned waiting = 0, returned = 0, gone = 0;
    for (unsigned i = 1; i <= c.blocks; ++i) {
        const unsigned q = (rank + i) % c.blocks;
        if (c.status[q] == FZ_SIM_READY) {
            c.turn = first + q;
            return;
        }
        waiting += c.status[q] == FZ_SIM_AT_CLUSTER;
        if (c.status[q] == FZ_SIM_RETURNED) returned++, gone = q;
    }
    if (waiting && returned) {
        std::snprintf(fz_sim_error, sizeof fz_sim_error, "cluster of blocks %u-%u: the cluster's barrier reached by %u of "
                      "its %u blocks; block %u returned without reaching it", first, first + c.blocks - 1, waiting,
                      c.blocks, first + gone);
        c.failed = true;
        return;
    }
    std::memset(c.status, FZ_SIM_READY, sizeof c.status);  // all go on, or the next cluster starts
    if (!waiting) std::memset(c.started, 0, sizeof c.started);
    c.turn = waiting ? first : first + c.blocks < c.grid ? first + c.blocks : c.grid;
}

template <typename F>
void fz_sim_cluster_run(fz_sim_cluster_worker& w)
{
    fz_sim_cluster_state& c = *w.c;
    pthread_mutex_lock(&c.mutex);
    try {
        c.anchor[w.rank] = fz_sim_dynamic_shared;
        if (++c.registered == c.blocks) {  // every block's shared memory has its place: the first may run
            c.turn = 0;
            pthread_cond_broadcast(&c.changed);
        }
        fz_sim_block_runner runner(w.block, w.shared_bytes, *static_cast<F*>(w.kernel));
        for (unsigned first = 0; first < c.grid; first += c.blocks) {
            const unsigned b = first + w.rank;
            if (!fz_sim_cluster_wait_turn(c, b)) break;
            runner.start(b);
            c.started[w.rank] = true;
            for (;;) {
                blockIdx = {b, 0, 0};
                runner.resume();
                const bool done = runner.returned();
                if (done) runner.check_guard(b);
                c.status[w.rank] = done ? FZ_SIM_RETURNED : FZ_SIM_AT_CLUSTER;
                fz_sim_cluster_next(c, first, w.rank);
                pthread_cond_broadcast(&c.changed);
                if (done || !fz_sim_cluster_wait_turn(c, b)) break;
                runner.release();
            }
            if (c.failed) break;
        }
    } catch (const fz_sim_misuse&) {
        c.failed = true;
        pthread_cond_broadcast(&c.changed);
    }
    pthread_mutex_unlock(&c.mutex);
}

// Runs kernel(...) for every thread of a 1-D grid, a block's threads as fibers
// so that they can meet at barriers; shared_bytes: the block's dynamic shared
// memory; cluster: blocks a thread-block cluster (1: none).
template <typename F>
void fz_sim_grid_cooperative(unsigned grid, unsigned block, unsigned shared_bytes, F kernel, unsigned cluster = 1)
{
    if (block < 1 || block > 1024) fz_sim_fail("a block of %u threads (CUDA's blocks have 1 to 1024)", block);
    if (shared_bytes > FZ_SIM_SHARED_CAPACITY)
        fz_sim_fail("%u bytes of dynamic shared memory: a block may have at most %u", shared_bytes,
                    FZ_SIM_SHARED_CAPACITY);
    if (cluster < 1 || cluster > 16 || grid % cluster)
        fz_sim_fail("a grid of %u blocks in clusters of %u (CUDA's clusters have 1 to 16 blocks and divide the grid)",
                    grid, cluster);
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    struct running_t {
        ~running_t() { fz_sim_running = nullptr, fz_sim_cluster = nullptr; }
    } running;
    if (cluster > 1) {
        fz_sim_cluster_state c{};
        pthread_mutex_init(&c.mutex, nullptr);
        pthread_cond_init(&c.changed, nullptr);
        c.blocks = cluster;
        c.grid = grid;
        c.turn = ~0u;
        fz_sim_cluster = &c;
        fz_sim_cluster_worker workers[16];
        pthread_t threads[16];
        unsigned started = 0;
        for (; started < cluster; ++started) {
            workers[started] = {&c, started, block, shared_bytes, &kernel, fz_sim_cluster_run<F>};
            auto entry = [](void* w) -> void* {
                auto& worker = *static_cast<fz_sim_cluster_worker*>(w);
                worker.run(worker);
                return nullptr;
            };
            if (pthread_create(&threads[started], nullptr, entry, &workers[started])) {
                pthread_mutex_lock(&c.mutex);
                std::snprintf(fz_sim_error, sizeof fz_sim_error, "could not start a thread for a cluster's block");
                c.failed = true;
                pthread_cond_broadcast(&c.changed);
                pthread_mutex_unlock(&c.mutex);
                break;
            }
        }
        for (unsigned i = 0; i < started; ++i) pthread_join(threads[i], nullptr);
        pthread_cond_destroy(&c.changed);
        pthread_mutex_destroy(&c.mutex);
        if (c.failed) throw fz_sim_misuse{};
        return;
    }
    fz_sim_block_runner runner(block, shared_bytes, kernel);
    for (unsigned b = 0; b < grid; ++b) {
        runner.start(b);
        runner.resume();
        if (!runner.returned()) fz_sim_fail_stuck(runner.r);  // waits at a cluster's barrier: there is none
        runner.check_guard(b);
    }
}
