"""The floor under a fusec call on the GPU: bare launches of fusec's own kernel
(CuPy's RawKernel; the driver's cuLaunchKernel through NVIDIA's CUDA Python
bindings with a prepacked argument buffer), the parts a call is made of, and
fusec's calls, each in host µs per call at 4096 f32 elements.

    PYTHONPATH=. python3 benchmarks/launch_floor.py [--allocators]

--allocators: only the output allocation, three ways (cupy.empty; cupy.ndarray(shape,
dtype), what cupy.empty calls and what fusec's replay now calls; the memory pool's
malloc and cupy.ndarray(memptr=...)), to decide whether a cheaper one is worth taking.
"""
from __future__ import annotations

import statistics
import sys
import time

import cupy as cp
import fusec

N = 4096


def per_call(fn, iters=20000, reps=5):
    for _ in range(200):
        fn()
    out = []
    for _ in range(reps):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        cp.cuda.Device().synchronize()
        out.append((time.perf_counter() - start) * 1e6 / iters)
    return statistics.median(out)


def row(what, us):
    print(f"| {what} | {us:.2f} |", flush=True)


def allocators():
    """Output allocation, three ways, at N f32 elements (each array freed to the pool at once)."""
    shape, dtype = (N,), cp.dtype(cp.float32)
    pool, ndarray = cp.get_default_memory_pool(), cp.ndarray
    nbytes = N * dtype.itemsize
    row("allocation: cupy.empty(shape, dtype)", per_call(lambda: cp.empty(shape, dtype)))
    row("allocation: cupy.ndarray(shape, dtype) (fusec's replay)", per_call(lambda: ndarray(shape, dtype)))
    row("allocation: pool.malloc + cupy.ndarray(shape, dtype, memptr)",
        per_call(lambda: ndarray(shape, dtype, pool.malloc(nbytes))))


def main():
    if "--allocators" in sys.argv:
        print("| what | host µs per call |\n|---|---|")
        allocators()
        return
    f = fusec.jit("examples/scale_bias_relu.fz", backend="cuda")
    x = cp.random.default_rng(1).standard_normal(N, dtype=cp.float32)
    y = f(x, 1.5, -0.25)
    runner = f._runner
    call = runner.binder.bind((x, 1.5, -0.25), {"out": y})
    values, sizes = runner._allocate(call)
    launched = []
    runner._launch_all(values, sizes, None, launched)
    index, variant, grid, block, shared, args = launched[0]
    kernel = runner.kernels[index]
    params = kernel.launch.params
    # CuPy takes arrays as they are and scalars as NumPy scalars of the C type
    cupy_args = [a if p.pack is None else p.pack.numpy_dtype.type(a) for p, a in zip(params, args)]
    plain = [a if pack is None else pack(a) for pack, a in zip(kernel.packers, args)]  # addresses, numbers
    print(f"variant {variant.name}, grid {grid}, block {block}, args {[type(a).__name__ for a in args]}")
    print("| what | host µs per call |\n|---|---|")

    raw = cp.RawKernel(f.cuda_source, variant.name, options=("-ftz=false",))
    row("cupy.RawKernel launch, prepared arguments", per_call(lambda: raw((grid,), (block,), cupy_args)))

    from cuda.bindings import __version__ as bindings_version
    from cuda.bindings import driver

    from fusec.runtime.packing import ArgumentBuffer
    print(f"cuda.bindings {bindings_version}")
    fn = runner.backend.functions[variant.name][0]  # the CUfunction fusec launches
    arguments = ArgumentBuffer(kernel.launch.params)
    params = arguments.fill(plain)
    stream0 = driver.CUstream(0)

    def bare():
        driver.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream0, params, 0)
    y2 = cp.zeros_like(y)
    plain2 = list(plain)
    plain2[[i for i, a in enumerate(args) if isinstance(a, cp.ndarray)][-1]] = y2.data.ptr
    arguments.fill(plain2)
    bare()
    cp.cuda.Device().synchronize()
    print("bare driver launch writes the same result:", bool((y2 == y).all()))
    row("driver cuLaunchKernel (cuda.bindings), prepacked buffer", per_call(bare))
    row("driver cuLaunchKernel, stream as int 0", per_call(
        lambda: driver.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, 0, params, 0)))
    row("ArgumentBuffer.fill (struct pack_into)", per_call(lambda: arguments.fill(plain2)))
    row("fill + driver launch", per_call(lambda: (arguments.fill(plain2), bare())))
    fire = runner.backend.launcher(variant.name, grid, block)
    row("fusec's fire(args): fill, current stream, driver launch", per_call(lambda: fire(plain2)))
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes, config.hStream, config.numAttrs = 0, stream0, 0
    row("driver cuLaunchKernelEx (cuda.bindings), prepacked buffer", per_call(
        lambda: driver.cuLaunchKernelEx(config, fn, params, 0)))
    row("cupy.empty(4096)", per_call(lambda: cp.empty(N, cp.float32)))
    allocators()
    row("cupy current stream .ptr", per_call(lambda: cp.cuda.get_current_stream().ptr))
    row("cupy runtime.getDevice()", per_call(cp.cuda.runtime.getDevice))
    row("fusec f(x, s, b) replayed", per_call(lambda: f(x, 1.5, -0.25)))
    row("fusec f(x, s, b, out=y) checked", per_call(lambda: f(x, 1.5, -0.25, out=y)))
    runner._calls.clear()
    runner._seen.clear()
    row("fusec f(x, s, b) checked (never replayed)", per_call(lambda: (runner._seen.clear(), f(x, 1.5, -0.25))))
    import cProfile
    import pstats
    cProfile.runctx("for _ in range(20000): f(x, 1.5, -0.25)", globals(), locals(), "/tmp/replay.prof")
    pstats.Stats("/tmp/replay.prof").sort_stats("tottime").print_stats(12)
    try:
        import torch
        t = torch.as_tensor(x, device="cuda")
        f(t, 1.5, -0.25), f(t, 1.5, -0.25)
        row("torch.empty(4096)", per_call(lambda: torch.empty(N, device="cuda")))
        row("fusec f(t, s, b), torch tensor, replayed", per_call(lambda: f(t, 1.5, -0.25)))
        compiled = torch.compile(lambda a: torch.relu(a * 1.5 + -0.25))
        compiled(t)
        row("torch.compile of the same, host per call", per_call(lambda: compiled(t), iters=5000))
    except ImportError:
        pass


if __name__ == "__main__":
    main()
