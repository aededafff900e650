"""How much bandwidth a memory-bound kernel gets from the bytes it keeps in flight.

    python3 benchmarks/occupancy_bandwidth.py [--json OUT.json]

A copy kernel moving B bytes per thread (4, 16, 32 or 64: one float, one to
four float4s) runs with its occupancy capped by dynamic shared memory at 1 to
8 blocks of 256 threads per SM (8 to 64 warps), at 2^28 bytes copied each way.
Little's law says bandwidth grows with the bytes in flight per SM until the
memory system saturates; the cost model (fusec/passes/cost.py) uses this
curve for what a kernel's register count (its occupancy) and vector width do
to its memory time.
"""
from __future__ import annotations

import json
import statistics
import sys

import cupy as cp

SOURCE = r'''
template <int V>
__device__ __forceinline__ void copy_body(const float4* __restrict__ s, float4* __restrict__ d, long long n)
{
    extern __shared__ char pad[];  // only to cap the blocks per SM
    const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i + V <= n) {
        float4 r[V];
#pragma unroll
        for (int k = 0; k < V; ++k) r[k] = s[i + k];
#pragma unroll
        for (int k = 0; k < V; ++k) d[i + k] = r[k];
    }
    if (threadIdx.x == 1023) pad[0] = 0;  // never true: keeps the shared array
}
extern "C" __global__ void copy_v1(const float4* s, float4* d, long long n) { copy_body<1>(s, d, n); }
extern "C" __global__ void copy_v2(const float4* s, float4* d, long long n) { copy_body<2>(s, d, n); }
extern "C" __global__ void copy_v4(const float4* s, float4* d, long long n) { copy_body<4>(s, d, n); }
extern "C" __global__ void copy_f1(const float* __restrict__ s, float* __restrict__ d, long long n)
{
    extern __shared__ char pad[];
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = s[i];
    if (threadIdx.x == 1023) pad[0] = 0;
}
'''
BYTES = 2 ** 28
BLOCK = 256


def time_us(fn, reps=7, iters=20) -> float:
    fn()
    cp.cuda.Device().synchronize()
    samples = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        samples.append(cp.cuda.get_elapsed_time(a, b) * 1000 / iters)
    return statistics.median(samples)


def main() -> None:
    device = cp.cuda.Device()
    smem_per_sm = device.attributes["MaxSharedMemoryPerMultiprocessor"]
    sms = device.attributes["MultiProcessorCount"]
    src = cp.ones(BYTES // 4, cp.float32)
    dst = cp.empty_like(src)
    rows = []
    print("| bytes/thread | blocks/SM | warps/SM | KiB in flight/SM | TB/s |\n|---|---|---|---|---|")
    for name, per_thread in (("copy_f1", 4), ("copy_v1", 16), ("copy_v2", 32), ("copy_v4", 64)):
        kernel = cp.RawKernel(SOURCE, name, options=("-std=c++17",))
        kernel.max_dynamic_shared_size_bytes = smem_per_sm - 1024
        items = BYTES // (16 if name != "copy_f1" else 4)
        threads = BYTES // per_thread
        grid = (-(-threads // BLOCK),)
        for blocks in (1, 2, 3, 4, 6, 8):
            smem = (smem_per_sm - 1024 * blocks) // blocks  # 1 KiB a block is reserved by the system
            us = time_us(lambda: kernel(grid, (BLOCK,), (src, dst, cp.int64(items)), shared_mem=smem))
            try:
                active = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, BLOCK, smem)
            except AttributeError:
                active = blocks
            tbps = 2 * BYTES / (us * 1e-6) / 1e12
            rows.append({"bytes_per_thread": per_thread, "blocks_per_sm": active, "warps_per_sm": active * BLOCK // 32,
                         "bytes_in_flight_per_sm": active * BLOCK * per_thread, "us": us, "tb_per_s": tbps})
            print(f"| {per_thread} | {active} | {active * BLOCK // 32} | {active * BLOCK * per_thread / 1024:.0f} "
                  f"| {tbps:.2f} |", flush=True)
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as out:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "sms": sms,
                       "bytes": BYTES, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
