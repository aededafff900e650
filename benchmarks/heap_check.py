"""Which step of a process overwrites CPython's shared one-byte b" " (the heap damage that
made `import torch` fail with "annotate(strtag)" after benchmarks/launch_floor.py): each
step, then the same sanity checks. Under a minute on one GPU.

    PYTHONPATH=. python3 benchmarks/heap_check.py [N]

Steps: the device's NVRTC log sizes (native cubin with ptxas's report, and PTX), read into
buffers of our own; NVRTC's log written into `b" " * size` as fusec did before (in a process
of its own); fusec's compile and N replayed calls (default 20,000) through each launch entry
point ("plain", "ex"), with its outputs reused and not, on two streams in turn; a pipeline
compiled for sm_80 (PTX, NVRTC's log empty); then `import torch` and torch's parse of the
schema that failed. A fresh fusec cache, so that NVRTC runs.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

os.environ["FUSEC_CACHE_DIR"] = tempfile.mkdtemp(prefix="fusec-heap-check-")
SOURCE = "examples/scale_bias_relu.fz"


def intact() -> str:
    """'ok', or what is overwritten: b" " and bytes([32]); a one-space f-string compiled
    from source (3.12's tokenizer reads its middle through a one-byte bytes); " " itself."""
    bad = []
    if list(b" ") != [32] or list(bytes([32])) != [32]:
        bad.append(f"b' ' reads {list(b' ')}")
    made = eval(compile('f"{a} {b}"', "<heap_check>", "eval"), {"a": "str", "b": "tag"})
    if made != "str tag":
        bad.append(f"f'{{a}} {{b}}' makes {made!r}")
    if ord(" ") != 32 or " ".join("ab") != "a\x20b":
        bad.append("the str ' ' is overwritten")
    return "ok" if not bad else "OVERWRITTEN: " + "; ".join(bad)


def step(what: str, fn=None) -> None:
    start = time.perf_counter()
    note = fn() if fn is not None else None
    print(f"| {what} | {time.perf_counter() - start:.1f} s | {intact()} |" + (f" {note}" if note else ""), flush=True)


def call(f, x) -> None:
    f(x, 1.5, -0.25)


OLD_PATTERN = """
from cuda.bindings import nvrtc
from fusec.runtime.backends import cuda
import fusec
import sys
source, arch = fusec.jit("examples/scale_bias_relu.fz", backend="numpy").cuda_source, sys.argv[1]
for native in (True, False):
    options = cuda._options(arch, native, False) + (("-Xptxas=-v",) if native else ()) + \
        tuple(f"-I{d}" for d in cuda.include_dirs())
    program = nvrtc.nvrtcCreateProgram(source.encode(), b"m.cu", 0, [], [])[1]
    error, = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
    size = nvrtc.nvrtcGetProgramLogSize(program)[1]
    log = b" " * size  # fusec's nvrtc_compile before the fix
    nvrtc.nvrtcGetProgramLog(program, log)
    print(f"native={native}: compiled ({int(error)}), log {size} bytes, b' ' then reads {list(b' ')}")
"""


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    import cupy as cp
    from cuda.bindings import __version__ as bindings
    from cuda.bindings import nvrtc

    import fusec
    from fusec.runtime import executor
    from fusec.runtime.backends import cuda
    arch = cuda.device_arch()
    print(f"Python {sys.version.split()[0]}, cupy {cp.__version__}, cuda.bindings {bindings}, "
          f"NVRTC {cuda.nvrtc_version()}, {arch}; fusec cache {os.environ['FUSEC_CACHE_DIR']}")
    print("| step | time | b' ', one-space f-string, ' ' |\n|---|---:|---|")
    step("start")
    source = fusec.jit(SOURCE, backend="numpy").cuda_source

    def log_sizes():
        sizes = []
        for native in (True, False):
            options = cuda._options(arch, native, False) + (("-Xptxas=-v",) if native else ()) + \
                tuple(f"-I{d}" for d in cuda.include_dirs())
            program = cuda.nvrtc_checked(nvrtc.nvrtcCreateProgram(source.encode(), b"m.cu", 0, [], []))
            error, = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
            sizes.append(f"{cuda.nvrtc_checked(nvrtc.nvrtcGetProgramLogSize(program))} (compiled: {int(error)})")
            nvrtc.nvrtcDestroyProgram(program)
        return f"NVRTC log bytes: native (with -Xptxas=-v) {sizes[0]}, PTX {sizes[1]} (1: empty)"
    step("NVRTC's log sizes, read into buffers of our own", log_sizes)

    def old_pattern():
        result = subprocess.run([sys.executable, "-c", OLD_PATTERN, arch], capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        return "in a process of its own: " + " / ".join((result.stdout + result.stderr[-300:]).split("\n")).strip(" /")
    step("fusec's old `b\" \" * size` log buffer", old_pattern)

    x = cp.random.default_rng(1).standard_normal(4096, dtype=cp.float32)
    streams = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
    f = fusec.jit(SOURCE, backend="cuda")
    step("fusec.jit + a first call (NVRTC, cubin, load)", lambda: call(f, x))
    recycle = executor.RECYCLE_BYTES
    for entry in ("plain", "ex"):
        for reuse in (True, False):
            cuda.LAUNCH_ENTRY, executor.RECYCLE_BYTES = entry, recycle if reuse else 0
            g = fusec.jit(SOURCE, backend="cuda")

            def replays():
                for k in range(n):
                    with streams[(k // 64) % 2]:
                        g(x, 1.5, -0.25)
                cp.cuda.Device().synchronize()
                y = g(x, 1.5, -0.25)
                expected = cp.maximum(x * cp.float32(1.5) + cp.float32(-0.25), 0)
                return f"results right: {bool(cp.allclose(y, expected, rtol=1e-5, atol=1e-6))}"
            step(f"{n} replays, LAUNCH_ENTRY={entry!r}, outputs reused: {reuse}, two streams", replays)
    executor.RECYCLE_BYTES = recycle
    import gc
    step("gc.collect()", lambda: f"{gc.collect()} objects collected")
    pinned = fusec.jit(SOURCE, backend="cuda", arch="sm_80")
    step("fusec.jit(arch='sm_80') + a call (NVRTC, PTX: an empty log)", lambda: call(pinned, x))

    def torch_import():
        import torch
        torch._C.parse_schema("annotate(str tag) -> ()")
        return f"torch {torch.__version__} imported, its schema parsed"
    try:
        step("import torch", torch_import)
    except Exception as exc:
        print(f"| import torch | | {intact()} | FAILED: {type(exc).__name__}: {str(exc).splitlines()[0:2]}")


if __name__ == "__main__":
    main()
