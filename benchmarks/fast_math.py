"""Fast math on the device: each compute-bound pipeline accurate and with fast_math=True,
beside a copy of the same traffic, at 2^26 elements; results checked first.

    PYTHONPATH=. python3 benchmarks/fast_math.py [--op-costs]   (on the device)
    PYTHONPATH=. python3 benchmarks/fast_math.py --count        (no device: the MUFU counts and bounds alone)

Pipelines: the script's chain (five statements of sin, cos, exp, log, tanh,
sigmoid, exp2 and log2: twelve special-function operations an element with
fast math), a chain of ten f32 functions applied one after another (below),
a chain of ten whose functions each have a one-instruction fast form,
the transcendental example, and the GELU forms (tanh and erf) in f32 and bf16.
Prints µs, % of the copy, the largest difference from the accurate result;
the MUFU operations an element of each form and the time they take at the
special-function unit's rate (16 a clock an SM on sm_90: the CUDA C++
Programming Guide's throughput table), i.e. the most of the copy the row can
reach; and, per compute-bound row, what bounds it and the functions that do.
With --op-costs, then: what each function of the fast-math table
(fusec/target_data/sm_90.json's fast_op_ps_per_element, measured on the H200
by this option) costs an element, accurate and fast, by op_costs.py's method
(OP_K applications a pipeline, less the same pipeline without the function).

MUFU operations are counted in the SASS of the one-element variant of the
kernel (nvdisasm, where one is installed: PATH, CUDA_HOME, or NVIDIA's pip
package), else summed from FUNCTION_MUFU (the same count on one-function
kernels, NVRTC 13.5). They are a static count: a function that branches (the
accurate sigmoid's division, tanh) counts every path's, an upper bound.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

import fusec
from fusec.bench.harness import time_gpu

N = 2 ** 26
CHAIN = """pipeline chain(x: f32[n]) -> (y: f32[n]) {
    a = sin(x) + cos(x * 0.5);
    b = exp(a * 0.25) * log(abs(a) + 1.5);
    c = tanh(b) + sigmoid(a - b);
    d = exp2(c * 0.5) + log2(abs(c) + 1.25);
    y = sin(d) * cos(c) + exp(-abs(d));
}
"""
# A chain of ten f32 functions applied one after another, as a user writes "a
# chain of ten math functions": the ten that fusec's examples call most
# (examples/*.fz: tanh, exp, sin, rsqrt, sqrt, sigmoid, erf, atan2, log1p, cos;
# atan2 taken as atan, its one-argument form), ordered so that each gets
# values inside its domain with no arithmetic between them. Chosen from usage
# before measuring, not for fast math: log1p and atan have no fast form, and
# sigmoid takes two special-function operations.
CHAIN10 = """pipeline chain10(x: f32[n]) -> (y: f32[n]) {
    y = atan(sigmoid(cos(erf(tanh(rsqrt(log1p(sqrt(exp(sin(x))))))))));
}
"""
# A chain of ten f32 functions each of which has a fast form of one special-function
# instruction (abs none), as the probe chain must have been to reach 97 % of the copy:
# seven MUFU operations an element, 112 µs at the unit's rate against a copy of about 128.
# Measured beside the two above so that the record shows what each kind of chain reaches.
CHAIN10_FAST_FORMS = """pipeline chain10f(x: f32[n]) -> (y: f32[n]) {
    y = sqrt(abs(sin(exp(cos(log2(1.0 + abs(tanh(exp2(-abs(x))))))))));
}
"""
GELU_TANH = "pipeline g(x: {t}[n]) -> (y: {t}[n]) {{\n    y = 0.5 * x * (1.0 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));\n}}\n"
GELU_ERF = "pipeline g(x: {t}[n]) -> (y: {t}[n]) {{\n    y = 0.5 * x * (1.0 + erf(x * 0.7071067811865476));\n}}\n"

# MUFU operations of y = f(x) in f32, accurate and fast math: the one-element
# variant's SASS (NVRTC 13.5, sm_90, fusec's options), counted with nvdisasm.
FUNCTION_MUFU = {
    "sin": (0, 1), "cos": (0, 1), "tan": (1, 3), "exp": (1, 1), "exp2": (1, 1), "expm1": (0, 0), "log": (0, 1),
    "log2": (0, 1), "log10": (0, 1), "log1p": (0, 0), "sqrt": (2, 1), "rsqrt": (1, 1), "cbrt": (2, 2),
    "tanh": (2, 1), "sigmoid": (6, 2), "erf": (1, 1), "atan": (1, 1), "asin": (1, 1), "acos": (1, 1),
    "sinh": (2, 2), "cosh": (2, 2), "div": (3, 1), "pow": (1, 2), "atan2": (3, 3),
}
MUFU_PER_CLOCK = 16  # special-function results a clock an SM, compute capability 9.0
# Without a device: the H200's SMs and its highest SM clock.
SMS, CLOCK_HZ = 132, 1.98e9


def cases() -> list[tuple[str, str, str]]:
    out = [("chain of ten, as before (f32; five statements)", CHAIN, "f32"), ("chain of ten functions (f32)", CHAIN10, "f32"),
           ("chain of ten functions with one-instruction fast forms (f32)", CHAIN10_FAST_FORMS, "f32"),
           ("transcendental_chain (f32)", "examples/transcendental_chain.fz", "f32")]
    for t in ("f32", "bf16"):
        out += [(f"GELU tanh ({t})", GELU_TANH.format(t=t), t), (f"GELU erf ({t})", GELU_ERF.format(t=t), t)]
    return out


def nvdisasm() -> str | None:
    """An nvdisasm to read SASS with, or None."""
    found = shutil.which("nvdisasm")
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"] + sys.path
    for pattern in ("bin/nvdisasm", "nvidia/*/bin/nvdisasm", "nvidia/cuda_nvdisasm/bin/nvdisasm"):
        for root in filter(None, roots):
            found = found or next(iter(glob.glob(os.path.join(root, pattern))), None)
    if found and not os.access(found, os.X_OK):  # unpacked from a wheel by zipfile: no exec bit
        try:
            os.chmod(found, 0o755)
        except OSError:
            return None
    return found


def sass_mufu(cubin: bytes, tool: str) -> dict[str, int]:
    """MUFU instructions of each function of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    out: dict[str, int] = {}
    function = None
    for line in text.splitlines():
        if m := re.match(r"\s*\.text\.(\w+):", line):
            function = m.group(1)
            out[function] = 0
        elif function and "MUFU." in line:
            out[function] += 1
    return out


def functions_of(pipeline) -> Counter:
    """The math functions each element computes (divisions as "div")."""
    return Counter(ins.op for k in pipeline.compiled.interface.kernels for ins in k.kernel.body.instrs
                   if ins.op in FUNCTION_MUFU)


def mufu_per_element(pipeline, fast: bool, tool: str | None) -> tuple[float, str]:
    """MUFU operations an element of the pipeline's kernels, and where the count came from."""
    if tool:
        from fusec.runtime.backends.cuda import compile_module
        compiled = pipeline.compiled
        counts = sass_mufu(compile_module(compiled.cuda, compiled.interface.arch, native=True, fast_math=fast), tool)
        scalar = [next((v for v in k.variants if v.elements_per_thread == 1), None) for k in compiled.interface.kernels]
        if all(v is not None and v.name in counts for v in scalar):
            return sum(counts[v.name] for v in scalar), "SASS"
    return sum(n * FUNCTION_MUFU[f][fast] for f, n in functions_of(pipeline).items()), "table"


def bounding(pipeline, fast: bool, mufu_us: float, measured_us: float | None, copy_us: float) -> str:
    """What bounds a form, and the functions that make it: the copy; the
    special-function unit (`mufu_us`: the functions by their MUFU operations);
    or the rest of the arithmetic (the cost model's time from the op table of
    fusec/target_data, measured on the H200 for the accurate and the fast
    ones: the functions by their share of it), whichever takes longest."""
    from fusec.passes.cost import target_costs
    functions = functions_of(pipeline)
    arithmetic_us = sum(k.prediction.compute_us for k in pipeline.compiled.interface.kernels)
    if measured_us is not None and measured_us <= 1.05 * copy_us or \
            measured_us is None and copy_us >= max(mufu_us, arithmetic_us):
        return "memory"
    if mufu_us >= arithmetic_us:
        by = sorted(((n * FUNCTION_MUFU[f][fast], f) for f, n in functions.items() if FUNCTION_MUFU[f][fast]),
                    reverse=True)
        return f"MUFU ({mufu_us:.0f} µs): " + ", ".join(f"{f} {m}" for m, f in by)
    table = target_costs("sm_90", fast).op_ps["f32"]
    cost = {f: n * table.get(f, 0.0) for f, n in functions.items()}
    total = sum(cost.values()) or 1.0
    return f"arithmetic ({arithmetic_us:.0f} µs, the model): " + ", ".join(
        f"{f} {100 * c / total:.0f} %" for f, c in sorted(cost.items(), key=lambda x: -x[1]) if c / total >= 0.05)


def device_clock(cp) -> tuple[int, float]:
    """The device's SMs and its highest SM clock (Hz)."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    sms = props.get("multiProcessorCount", SMS)
    clock = props.get("clockRate", 0) * 1e3
    if not clock:
        try:
            mhz = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits",
                                  "-i", str(cp.cuda.Device().id)], capture_output=True, text=True, timeout=20).stdout
            clock = float(mhz.split()[0]) * 1e6
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            clock = CLOCK_HZ
    return sms, clock


# The functions fast math replaces (the cost model's fast table), and how many
# applications a pipeline of op_costs.py's method sums: more than its 32, so
# that the fast forms' arithmetic outlasts the copy it is measured against.
FAST_OPS = ("exp", "log", "log2", "log10", "sin", "cos", "tan", "pow", "div", "sigmoid", "tanh", "erf")
OP_K = 64
# Processes building the modules before anything is timed (NVRTC: the CPU's work).
BUILDERS = 4


def op_sources() -> list[str]:
    """op_costs.py's pipelines of OP_K applications: the sum alone, then each function of FAST_OPS."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import op_costs
    op_costs.K = OP_K
    return [op_costs.chain("add", "f32", True)] + [op_costs.chain(op, "f32", False) for op in FAST_OPS]


def build(job) -> None:
    """In a worker: one pipeline's module, accurate or fast, into fusec's disk cache."""
    source, fast, arch = job
    from fusec.runtime.backends.cuda import compile_module
    compile_module(fusec.jit(source, fast_math=fast, backend="numpy", arch=arch).compiled.cuda, arch, native=True,
                   fast_math=fast)


def build_all(sources: list[str], arch: str) -> None:
    """Every module the run loads, built in BUILDERS processes first."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(BUILDERS, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(build, [(source, fast, arch) for source in sources for fast in (False, True)]))


def fast_op_costs(cp) -> None:
    """op_costs.py's measurement of each function of FAST_OPS, accurate and fast (f32)."""
    import numpy as np

    from fusec.passes.cost import target_costs
    sources = op_sources()
    import op_costs
    x = cp.asarray((np.random.default_rng(0).random(op_costs.N) - 0.5).astype(np.float32))
    tables = [target_costs("sm_90", fast).op_ps["f32"] for fast in (False, True)]

    def timed(source, fast):
        f = fusec.jit(source, fast_math=fast)
        assert bool(cp.isfinite(f(x)).all()), "non-finite results"
        return time_gpu(cp, lambda: f(x))
    base = [timed(sources[0], fast) for fast in (False, True)]
    print(f"\n{OP_K} applications an element of 2^{op_costs.N.bit_length() - 1}, less the same sums without "
          f"the function ({base[0]:.1f} µs accurate, {base[1]:.1f} µs fast math):\n")
    print("| function | accurate µs | fast math µs | accurate ps an element | fast math ps an element | "
          "op table: accurate (measured), fast (measured) |\n|---|---|---|---|---|---|")
    for op, source in zip(FAST_OPS, sources[1:]):
        us = [timed(source, fast) for fast in (False, True)]
        ps = [max(0.0, (u - b) * 1e6 / (op_costs.N * OP_K)) for u, b in zip(us, base)]
        print(f"| {op} | {us[0]:.1f} | {us[1]:.1f} | {ps[0]:.4f} | {ps[1]:.4f} | {tables[0].get(op, 0):.4f}, "
              f"{tables[1].get(op, 0):.4f} |", flush=True)


def main() -> None:
    count_only = "--count" in sys.argv
    tool = nvdisasm()
    if count_only:
        cp, sms, clock = None, SMS, CLOCK_HZ
    else:
        import cupy as cp

        from fusec.runtime.backends.cuda import device_arch
        sms, clock = device_clock(cp)
        build_all([source for _, source, _ in cases()] + (op_sources() if "--op-costs" in sys.argv else []),
                  device_arch())
    mufu_us = N / (MUFU_PER_CLOCK * sms * clock) * 1e6  # one MUFU operation an element
    print(f"MUFU: {MUFU_PER_CLOCK} a clock an SM x {sms} SMs x {clock / 1e9:.2f} GHz: {mufu_us:.1f} µs for one an "
          f"element of 2^26; counted from {'SASS (' + tool + ')' if tool else 'FUNCTION_MUFU (no nvdisasm)'}\n")
    print("| pipeline | copy µs | accurate µs (% of copy) | fast math µs (% of copy) | largest difference | "
          "MUFU an element: accurate, fast | MUFU bound with fast math µs (most of the copy) | bound, accurate | "
          "bound, fast math |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, source, dtype in cases():
        backend = "numpy" if count_only else "auto"
        accurate, fast = fusec.jit(source, backend=backend), fusec.jit(source, fast_math=True, backend=backend)
        (m_acc, where), (m_fast, _) = mufu_per_element(accurate, False, tool), mufu_per_element(fast, True, tool)
        bound_fast = m_fast * mufu_us
        if count_only:  # the copy from the cost model's bandwidth: no measurement
            from fusec.passes.cost import target_costs
            (param,) = accurate.compiled.program.pipelines[0].params
            copy = 2 * N * param.type.itemsize / (target_costs("sm_90").copy_tb_per_s * 1e12) * 1e6
            ta = tf = None
            timed = f"| {name} | {copy:.1f} (model) | | | "
        else:
            (param,) = accurate.compiled.program.pipelines[0].params
            x = cp.random.default_rng(1).standard_normal(N, dtype=cp.float32).astype(param.type.numpy_dtype)
            a, f = accurate(x), fast(x)
            diff = float(cp.max(cp.abs(a.astype(cp.float32) - f.astype(cp.float32))))
            out = cp.empty_like(a)
            copy = time_gpu(cp, lambda: cp.copyto(out, x))
            ta, tf = time_gpu(cp, lambda: accurate(x)), time_gpu(cp, lambda: fast(x))
            timed = (f"| {name} | {copy:.1f} | {ta:.1f} ({100 * copy / ta:.0f} %) | {tf:.1f} ({100 * copy / tf:.0f} %) "
                     f"| {diff:.2g} ")
        print(timed + f"| {m_acc:g}, {m_fast:g} ({where}) | {bound_fast:.1f} ({min(100.0, 100 * copy / bound_fast) if bound_fast else 100:.0f} %) "
              f"| {bounding(accurate, False, m_acc * mufu_us, ta, copy)} | {bounding(fast, True, bound_fast, tf, copy)} |",
              flush=True)
    if "--op-costs" in sys.argv and not count_only:
        fast_op_costs(cp)


if __name__ == "__main__":
    main()
