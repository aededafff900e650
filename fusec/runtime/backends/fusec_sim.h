// fusec_sim.h: what emitted CUDA C needs to compile, unchanged, as host C++
// (the sim backend). Every thread of the grid runs in turn, one after another.
#pragma once
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#if __has_include(<cuda_fp16.h>)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif
#include <cmath>
#include <cstring>

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
