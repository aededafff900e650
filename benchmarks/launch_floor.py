"""Host µs per call at 4096 f32 elements (examples/scale_bias_relu.fz), every row of issue 13
in one run: the floor (a bare CuPy RawKernel launch of fusec's own kernel; the driver's
cuLaunchKernel and cuLaunchKernelEx through NVIDIA's cuda.bindings with a prepacked argument
buffer), the same RawKernel launch allocating its output each call as a call that allocates
must (cupy.empty; on torch tensors, torch.empty), the parts a call is made of (the stream,
the device, each way to allocate an output), fusec's calls (replayed with the result
dropped, so its arrays are reused, and held, so it allocates; out=; a torch tensor's; a new
signature, checked in full), torch.compile of the same, and the issue's targets against
them, with where each µs of a replayed call goes.

    PYTHONPATH=. python3 benchmarks/launch_floor.py [--profile]

--profile: a cProfile listing of the replayed call too. The table's arithmetic (`summary`)
is tested on the CPU (tests/test_launch_floor.py); fusec's own Python per call is measured
there by benchmarks/host_path_cpu.py.
"""
from __future__ import annotations

import collections
import itertools
import statistics
import sys
import time

N = 4096


def per_call(fn, sync, iters=20000, reps=5):
    """Median over `reps` runs of µs per call of fn(), the device idle before and after each run."""
    for _ in range(200):
        fn()
    out = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        out.append((time.perf_counter() - start) * 1e6 / iters)
    return statistics.median(out)


def summary(t: dict[str, float]) -> list[str]:
    """Where a call's µs go, and the issue's targets, from the measured rows (keys as `main` names them)."""
    raw, plain, ex = t["raw"], t["driver"], t["driver_ex"]
    floor = ex  # fusec's entry point (cuda.LAUNCH_ENTRY "ex"; its rows through cuLaunchKernel are above)
    lines = ["", "| where a replayed call's µs go | µs |", "|---|---:|",
             f"| driver launch through cuda.bindings (cuLaunchKernelEx, fusec's) | {floor:.2f} |",
             f"| stream handle (CuPy's current stream .ptr) | {t['stream']:.2f} |",
             f"| current device (runtime.getDevice) | {t['device']:.2f} |",
             f"| the rest: key, look-up, scalar checks, reuse check, packing, lock | "
             f"{t['replayed'] - floor - t['stream'] - t['device']:.2f} |",
             f"| an output allocated (result held, nothing to reuse), on top | {t['held'] - t['replayed']:.2f} |"]
    if "torch" in t:
        lines.append(f"| a torch tensor's call, on top of CuPy's (tensor key, new_empty_strided, torch's stream) | "
                     f"{t['torch'] - t['replayed']:.2f} |")
    lines += ["", "| target (issue 13) | measured | met |", "|---|---|---|"]

    def target(what: str, value: float, limit: float, text: str) -> None:
        lines.append(f"| {what} {text} | {value:.2f} µs | {'yes' if value <= limit else '**no**'} |")
    calls = (("replayed", "a replayed call (its output reused)"),
             ("held", "a call with its output allocated (replayed, nothing to reuse)"),
             ("fresh", "a checked call: new input arrays each call (key, device, alignment checked)"),
             ("out", "an out= call"), ("torch", "a torch-tensor call"))
    for key, what in calls:
        if key in t:
            target(what, t[key], raw, f"<= 1.0x RawKernel ({raw:.2f}): {t[key] / raw:.2f}x,")
    # A call that allocates against the same launch allocating as it must: its output from
    # cupy.empty (CuPy arrays), from torch.empty (torch tensors, their addresses read each call).
    for key, floor_key, what, text in (
            ("held", "raw_alloc", calls[1][1], "with its output from cupy.empty each call"),
            ("torch", "raw_torch", calls[4][1], "on torch tensors, with its output from torch.empty each call")):
        if key in t and floor_key in t:
            floor_alloc = t[floor_key]
            target(what, t[key], floor_alloc,
                   f"<= 1.0x RawKernel {text} ({floor_alloc:.2f}): {t[key] / floor_alloc:.2f}x,")
    for key, what, limit in (*((key, what, 1) for key, what in calls[:2]), (*calls[2], 3)):
        target(what, t[key], plain + limit,
               f"within {limit} µs of cuLaunchKernel ({plain:.2f}): {t[key] - plain:+.2f},")
    lines.append(f"| (a call of shapes never seen, checked in full by the binder: {t['checked']:.2f} µs) | | |")
    if "compiled" in t and "torch" in t:
        ratio = t["compiled"] / t["torch"]
        lines.append(f"| torch.compile's host time >= 4x fusec's (torch tensors) | {ratio:.2f}x | "
                     f"{'yes' if ratio >= 4 else '**no**'} |")
    return lines


def main():
    import cupy as cp
    from cuda.bindings import __version__ as bindings_version
    from cuda.bindings import driver

    import fusec
    from fusec.runtime.backends import cuda
    from fusec.runtime.packing import ArgumentBuffer
    sync = cp.cuda.Device().synchronize
    t: dict[str, float] = {}

    def row(key, what, fn, **kw):
        t[key] = per_call(fn, sync, **kw)
        print(f"| {what} | {t[key]:.2f} |", flush=True)
    f = fusec.jit("examples/scale_bias_relu.fz", backend="cuda")
    x = cp.random.default_rng(1).standard_normal(N, dtype=cp.float32)
    y = f(x, 1.5, -0.25)
    runner = f._runner
    launched = []
    call = runner.binder.bind((x, 1.5, -0.25), {"out": y})
    runner._launch_all(*runner._allocate(call), None, launched)
    index, variant, grid, block, shared, args = launched[0]
    kernel = runner.kernels[index]
    params = kernel.launch.params
    print(f"cupy {cp.__version__}, cuda.bindings {bindings_version}, {cp.cuda.runtime.getDeviceProperties(0)['name']}; "
          f"variant {variant.name}, grid {grid}, block {block}")
    print("| what | host µs per call |\n|---|---:|")
    # The floor: the same kernel, arguments prepared. CuPy takes scalars as NumPy scalars of the C type.
    raw = cp.RawKernel(f.cuda_source, variant.name, options=("-ftz=false",))
    raw_args = [a if p.pack is None else p.pack.numpy_dtype.type(a) for p, a in zip(params, args)]
    row("raw", "cupy.RawKernel launch, prepared arguments", lambda: raw((grid,), (block,), raw_args))
    function = runner.backend.functions[variant.name][0]  # the CUfunction fusec launches
    y2 = cp.zeros_like(y)  # the bare launches write here: addresses and numbers, as fusec packs them
    plain = [y2.data.ptr if a is y else a if pack is None else pack(a) for pack, a in zip(kernel.packers, args)]
    buffer = ArgumentBuffer(params)
    kernel_params = buffer.fill(plain)
    stream = driver.CUstream(cp.cuda.get_current_stream().ptr)
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes, config.hStream, config.numAttrs = 0, stream, 0
    for launch in (lambda: driver.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, kernel_params, 0),
                   lambda: driver.cuLaunchKernelEx(config, function, kernel_params, 0)):
        y2[...] = 0
        assert launch()[0] == 0
        sync()
        assert bool((y2 == y).all()), "a bare launch does not write what fusec's call wrote"
    row("driver", "driver cuLaunchKernel (cuda.bindings), prepacked buffer",
        lambda: driver.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, kernel_params, 0))
    handle = int(stream)
    row("driver_int", "driver cuLaunchKernel, stream as an int",
        lambda: driver.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, handle, kernel_params, 0))
    row("driver_ex", "driver cuLaunchKernelEx (cuda.bindings), prepacked buffer, configuration built once",
        lambda: driver.cuLaunchKernelEx(config, function, kernel_params, 0))
    row("fill", "ArgumentBuffer.fill (struct pack_into of the arguments)", lambda: buffer.fill(plain))
    row("stream", "CuPy's current stream .ptr", lambda: cp.cuda.get_current_stream().ptr)
    row("device", "cupy runtime.getDevice()", cp.cuda.runtime.getDevice)
    shape, dtype, pool, nbytes = (N,), cp.dtype(cp.float32), cp.get_default_memory_pool(), N * 4
    row("empty", "allocation: cupy.empty(shape, dtype)", lambda: cp.empty(shape, dtype))
    row("ndarray", "allocation: cupy.ndarray(shape, dtype) (fusec's, where nothing is reused)",
        lambda: cp.ndarray(shape, dtype))
    row("malloc", "allocation: pool.malloc + cupy.ndarray(shape, dtype, memptr)",
        lambda: cp.ndarray(shape, dtype, pool.malloc(nbytes)))
    row("alloc", "allocation: cupy.cuda.alloc (the current allocator) + cupy.ndarray(memptr)",
        lambda: cp.ndarray(shape, dtype, cp.cuda.alloc(nbytes)))
    # The floor of a call that allocates: the RawKernel launch with its output new each call.
    out_at = next(j for j, a in enumerate(args) if a is y)  # the output among the kernel's arguments
    raw_new = list(raw_args)

    def raw_allocating():
        raw_new[out_at] = cp.empty(y.shape, y.dtype)
        raw((grid,), (block,), raw_new)
    raw_allocating()
    sync()
    assert bool((raw_new[out_at] == y).all()), "the allocating RawKernel launch does not write what fusec's call wrote"
    row("raw_alloc", "cupy.RawKernel launch, prepared arguments, its output from cupy.empty each call", raw_allocating)
    inputs = itertools.cycle([cp.ones(N, cp.float32) for _ in range(512)])  # more than the keys a runner keeps
    for entry in ("plain", "ex"):  # fusec launching through each entry point (the last is the default)
        cuda.LAUNCH_ENTRY = entry
        g = fusec.jit("examples/scale_bias_relu.fz", backend="cuda")
        g(x, 1.5, -0.25), g(x, 1.5, -0.25)
        reused = g(x, 1.5, -0.25).data.ptr == g(x, 1.5, -0.25).data.ptr
        held = collections.deque(maxlen=3)
        suffix = "" if entry == "ex" else " (cuLaunchKernel)"
        row("replayed" + suffix, f"fusec f(x, s, b) replayed, result dropped (its output reused: {reused}){suffix}",
            lambda: g(x, 1.5, -0.25))
        row("held" + suffix, f"fusec f(x, s, b) replayed, the last three results held (allocates){suffix}",
            lambda: held.append(g(x, 1.5, -0.25)))
        row("out" + suffix, f"fusec f(x, s, b, out=y) replayed{suffix}", lambda: g(x, 1.5, -0.25, out=y))
        row("fresh" + suffix, f"fusec f(x_k, s, b), another input array each call (512 in turn){suffix}",
            lambda: g(next(inputs), 1.5, -0.25))
    g_runner = g._runner
    row("checked", "fusec f(x, s, b), a signature never seen (checked in full, each call)",
        lambda: (g_runner.forget(), g(x, 1.5, -0.25)), iters=5000)
    if "--profile" in sys.argv:
        import cProfile
        import pstats
        cProfile.runctx("for _ in range(20000): g(x, 1.5, -0.25)", globals(), locals(), "/tmp/replay.prof")
        pstats.Stats("/tmp/replay.prof").sort_stats("tottime").print_stats(15)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        tx = torch.as_tensor(x, device="cuda")
        for _ in range(3):
            g(tx, 1.5, -0.25)
        device = torch.device("cuda", tx.get_device())
        row("torch_empty", "torch.empty(shape, dtype=, device=)",
            lambda: torch.empty(shape, dtype=torch.float32, device=device))
        row("torch_strided", "torch.empty_strided(shape, strides, dtype=, device=)",
            lambda: torch.empty_strided(shape, (1,), dtype=torch.float32, device=device))
        template = torch.empty(0, dtype=torch.float32, device=device)
        row("torch_new_strided", "an empty tensor's new_empty_strided(shape, strides) (fusec's)",
            lambda: template.new_empty_strided(shape, (1,)))
        # The floor of a torch-tensor call: the RawKernel launch on tensors, the input's address and
        # a new output's (torch.empty, as a torch user allocates one) read each call.
        in_at = next(j for j, a in enumerate(args) if a is x)
        raw_torch_args = list(raw_args)

        def raw_on_tensors():
            out = torch.empty(shape, dtype=torch.float32, device=device)
            raw_torch_args[in_at], raw_torch_args[out_at] = tx.data_ptr(), out.data_ptr()
            raw((grid,), (block,), raw_torch_args)
            return out
        written = raw_on_tensors()
        sync()
        assert torch.equal(written, torch.as_tensor(y, device=device)), \
            "the RawKernel launch on tensors does not write what fusec's call wrote"
        row("raw_torch", "cupy.RawKernel launch on torch tensors, its output from torch.empty each call",
            raw_on_tensors)
        row("torch_stream", "torch._C._cuda_getCurrentRawStream(device)",
            lambda: torch._C._cuda_getCurrentRawStream(device.index))
        row("torch", "fusec f(t, s, b), torch tensor, replayed", lambda: g(tx, 1.5, -0.25))
        compiled = torch.compile(lambda a: torch.relu(a * 1.5 + -0.25))
        compiled(tx)
        row("compiled", "torch.compile of the same, host per call", lambda: compiled(tx), iters=5000)
    print("\n".join(summary(t)))


if __name__ == "__main__":
    main()
