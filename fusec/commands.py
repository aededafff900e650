"""The commands of the `fusec` command line: their arguments and what they do."""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from fusec import cache
from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import Diagnostic, FzError, Loc, Source
from fusec.frontend import check_source
from fusec.frontend.parser import decode_source, read_source
from fusec.ir.program import Program
from fusec.passes.fusion import FUSE_MODES
from fusec.target import DEFAULT_ARCH, check_arch, check_max_regs

EXIT_OK, EXIT_PROGRAM, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
STDIN = "-"  # as a FILE: read the program from standard input


class UsageError(Exception):
    """A usage error found after the arguments were parsed (exit 2): an output file that cannot be written."""


def read_input(name: str) -> Source:
    """A .fz file, or standard input for "-" (named <stdin> in messages)."""
    if name != STDIN:
        return read_source(name)
    try:
        data = sys.stdin.buffer.read()
    except (AttributeError, OSError) as exc:  # no stdin at all (closed), or one that cannot be read
        reason = getattr(exc, "strerror", None) or "it is closed"
        raise FzError(Diagnostic(Loc(), f"cannot read standard input: {reason}"), Source("<stdin>", "")) from None
    return decode_source(data, "<stdin>")


def _output_file(option: str, name: str | None) -> None:
    """Checks, before any work, that an output file can be created. Like cc and
    nvcc, fusec does not create a missing folder: a typo in it is an error."""
    if name is None:
        return
    path = Path(name)
    if path.is_dir():
        raise UsageError(f"{option} {name}: is a directory; give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise UsageError(f"{option} {name}: the folder {folder} does not exist (fusec does not create folders)")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{option} {name}: permission denied")


def _write(option: str, name: str, write) -> None:
    """Runs `write(path)`; a file system's refusal is a usage error, not a crash."""
    try:
        write(Path(name))
    except OSError as exc:
        raise UsageError(f"{option} {name}: cannot write: {exc.strerror or exc}") from None


# ---- fusec check

def add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE.fz", help="files to check; - reads standard input")


def run_check(args) -> int:
    """Checks every file, reporting each; exit 1 if any has an error."""
    code = EXIT_OK
    for name in args.files:
        try:
            program = check_source(read_input(name))
        except FzError as exc:
            print(exc, file=sys.stderr)
            code = EXIT_PROGRAM
            continue
        names = ", ".join(p.name for p in program.pipelines)
        print(f"{program.source.name}: ok ({len(program.stages)} stages; pipelines: {names})")
    return code


# ---- fusec compile



def _arch(text: str) -> str:
    try:
        return check_arch(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _regs(text: str) -> int:
    try:
        return check_max_regs(int(text) if text.isdigit() else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_compile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE.fz", help="the program; - reads standard input")
    p.add_argument("-o", dest="output", metavar="OUT.cu",
                   help="write to this file, in an existing folder (default: stdout)")
    p.add_argument("--pipeline", metavar="NAME", help="compile only this pipeline (default: all)")
    p.add_argument("--fuse", choices=FUSE_MODES, default="auto",
                   help="auto: the cost model decides (default); all: every stage that may fuse, fused, "
                        "ignoring the budget; none: one kernel per stage")
    p.add_argument("--unfused", action="store_const", dest="fuse", const="none", help="the same as --fuse none")
    p.add_argument("--fast-math", action="store_true",
                   help="f32 functions as their hardware approximations (__expf, __sinf, ...), denormals flushed")
    p.add_argument("--persistent", action="store_true",
                   help="every kernel in grid-stride form over a grid that just fills the device")
    p.add_argument("--emit", choices=("cuda", "ir", "report", "fz"), default="cuda",
                   help="CUDA C (default), the stage graph and partition, the JSON report, or the .fz compiled "
                        "(with --grad: the derived backward)")
    p.add_argument("--grad", action="store_true",
                   help="compile each pipeline's backward (PIPELINE_grad: the gradients of its float array "
                        "parameters from those of its outputs), derived from the source")
    p.add_argument("--arch", type=_arch, default=DEFAULT_ARCH, help=f"target architecture (default {DEFAULT_ARCH})")
    p.add_argument("--max-regs", type=_regs, metavar="N",
                   help="register budget per thread for fused kernels (default: half occupancy on --arch)")
    p.add_argument("--report", action="store_true", help="print a table of kernels and traffic to stderr")


def run_compile(args) -> int:
    _output_file("-o", args.output)
    if args.output and args.file != STDIN and Path(args.output).resolve() == Path(args.file).resolve():
        raise UsageError(f"-o {args.output}: is the program itself; give another file name")
    program = check_source(read_input(args.file))
    names = [p.name for p in program.pipelines]
    if args.pipeline is not None and args.pipeline not in names:
        raise FzError(Diagnostic(Loc(), f"no pipeline named '{args.pipeline}' (pipelines: {', '.join(names)})"),
                      program.source)
    selected = [args.pipeline] if args.pipeline else names
    if args.grad:  # each backward in the form the cost model chose (said in its .fz and by --report)
        from fusec.frontend.grad import backward_program, choose_backward
        chosen = CompileOptions(max_regs=args.max_regs, arch=args.arch, fast_math=args.fast_math)
        forward, program = program, backward_program(program, *selected, options=chosen)
        if args.report:
            for name in selected:
                print(f"backward: {choose_backward(forward, name, chosen).describe()}", file=sys.stderr)
        selected = [f"{name}_grad" for name in selected]
    if args.emit == "fz":
        text = program.source.text
        if args.output:
            _write("-o", args.output, lambda path: path.write_text(text))
        else:
            sys.stdout.write(text)
        return 0
    options = CompileOptions(fuse=args.fuse, max_regs=args.max_regs, arch=args.arch, persistent=args.persistent,
                             fast_math=args.fast_math)
    compiled = [compile_pipeline(program, name, options) for name in selected]
    from fusec import report
    if args.emit == "cuda":
        text = "\n".join(c.cuda for c in compiled)
    elif args.emit == "ir":
        text = "\n".join(report.format_ir(c) for c in compiled)
    else:
        text = json.dumps([k for c in compiled for k in report.report(c.interface)], indent=2) + "\n"
    if args.report:
        for name in selected:
            fused = compile_pipeline(program, name, replace(options, fuse="auto" if args.fuse == "none" else args.fuse,
                                                            persistent=False))
            unfused = compile_pipeline(program, name, replace(options, fuse=False, persistent=False))
            print(report.table(fused.interface, unfused.interface), file=sys.stderr)
    if args.output:
        _write("-o", args.output, lambda path: path.write_text(text))
    else:
        sys.stdout.write(text)
    return 0


# ---- fusec bench

def _size(text: str) -> int:
    try:
        value = 2 ** int(text[2:]) if text.startswith("2^") else int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a size like 4096 or 2^26, got {text!r}")
    return value


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE.fz")
    p.add_argument("--pipeline", metavar="NAME", help="benchmark only this pipeline (default: all)")
    p.add_argument("--sizes", nargs="+", type=_size, default=[2 ** 12, 2 ** 20, 2 ** 26, 2 ** 28], metavar="N",
                   help="elements per call, e.g. 4096 or 2^26 (default: 2^12 2^20 2^26 2^28)")
    p.add_argument("--dtype", choices=("f16", "bf16", "f32", "f64"), help="replace the program's float type")
    p.add_argument("--json", metavar="OUT.json", help="also write the rows as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="draw TB/s against size for each variant (matplotlib)")
    p.add_argument("--dispatch", action="store_true", help="also time host µs per call at 4096 elements")
    p.add_argument("--graph", action="store_true", help="also time both forms replayed as one CUDA graph a call")
    p.add_argument("--fuse", choices=[m for m in FUSE_MODES if m != "none"], default="auto",
                   help="the fused form timed beside the unfused one: auto (the cost model's) or all")
    p.add_argument("--row-length", type=_size, default=4096, metavar="N",
                   help="the innermost dim of 2-D arrays: a row reduction's row (default: 4096)")
    p.add_argument("--grad", action="store_true",
                   help="time forward + backward (the derived PIPELINE_grad) beside torch eager autograd, "
                        "torch.compile and Liger, gradients checked first")
    p.add_argument("--backend", choices=("cuda", "sim", "numpy"), default="cuda",
                   help="where to run: cuda (default); sim or numpy time --grad on the CPU (small sizes)")


def _bench_program(args, source) -> tuple[Program, list[str]]:
    """The program `bench` and `tune` time (retyped by --dtype) and the names of its pipelines to time."""
    from fusec.bench import harness
    program = check_source(source)
    names = [p.name for p in program.pipelines]
    if args.pipeline is not None and args.pipeline not in names:
        raise FzError(Diagnostic(Loc(), f"no pipeline named '{args.pipeline}' (pipelines: {', '.join(names)})"),
                      program.source)
    if args.dtype:
        floats = harness.float_types(source.text)
        if len(floats) > 1:
            raise UsageError(f"--dtype {args.dtype}: {args.file} has more than one float type "
                             f"({', '.join(floats)}); --dtype retypes a program of one; leave it out "
                             f"to time the program as written")
        program = harness.retype(source.text, args.dtype, Path(args.file).stem)
    return program, [args.pipeline] if args.pipeline else names


def run_bench(args) -> int:
    _output_file("--json", args.json)
    _output_file("--plot", args.plot)
    from fusec.bench import harness as bench
    source = read_source(args.file)
    program, names = _bench_program(args, source)
    if args.grad:
        return _run_bench_grad(args, program, names)
    if args.backend != "cuda":
        raise UsageError(f"--backend {args.backend}: without --grad, fusec bench times the forward on a GPU "
                         "only (--backend cuda); --grad times forward + backward on any backend")
    from fusec.runtime.backends.cuda import available
    if not available():
        print("fusec bench: needs a CUDA device and CuPy (pip install -e '.[cuda12]' or '.[cuda13]'); "
              "none was found", file=sys.stderr)
        return 2
    rows = []
    float_type = args.dtype or "as written"
    for name in names:
        runner = bench.Bench(program, name, float_type, graph=args.graph, fuse=args.fuse, row_length=args.row_length)
        runner.check(2 ** 16 + 3)
        for size in args.sizes:
            rows += runner.run(size)
            print(bench.format_rows(rows[-len(runner.peers) - 3 - len(runner.graphs):]), flush=True)
        if args.dispatch:
            rows += runner.dispatch()
    _bench_results(args, rows)
    return 0


def _run_bench_grad(args, program: Program, names: list[str]) -> int:
    """`fusec bench --grad`: forward + backward of each pipeline, its gradients checked first."""
    for option in ("graph", "dispatch"):
        if getattr(args, option):
            raise UsageError(f"--{option} times the forward only; leave it out with --grad")
    from fusec.bench import harness as bench
    from fusec.bench.grad import GradBench
    from fusec.frontend.grad import backward_program
    backward_program(program, *names)  # what cannot be differentiated: a located error, before any work
    if args.backend == "cuda":
        from fusec.runtime.backends.cuda import available
        if not available():
            print("fusec bench: needs a CUDA device and CuPy (pip install -e '.[cuda12]' or '.[cuda13]'); "
                  "none was found (--backend sim or numpy times --grad on the CPU)", file=sys.stderr)
            return EXIT_USAGE
    rows = []
    float_type = args.dtype or "as written"
    for name in names:
        runner = GradBench(program, name, float_type, backend=args.backend, fuse=args.fuse,
                           row_length=args.row_length)
        for size in args.sizes:
            found = runner.run(size)
            rows += found
            print(bench.format_rows(found), flush=True)
    _bench_results(args, rows)
    return EXIT_OK


def _bench_results(args, rows: list) -> None:
    """The whole table of a `fusec bench` run, and its --json and --plot files."""
    from fusec.bench import harness as bench
    print()
    print(bench.format_rows(rows))
    if args.json:
        _write("--json", args.json, lambda path: path.write_text(json.dumps(bench.to_json(rows), indent=1) + "\n"))
    if args.plot:
        _write("--plot", args.plot, lambda path: bench.plot(rows, str(path)))


# ---- fusec cache

def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("dir", help="print the folder fusec keeps its builds in")
    actions.add_parser("clear", help="remove everything fusec keeps there")


def run_cache(args) -> int:
    if args.action == "dir":
        print(cache.root())
        return EXIT_OK
    try:
        files, size = cache.clear()
    except OSError as exc:
        print(f"fusec cache clear: cannot remove {exc.filename or cache.root()}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_PROGRAM
    print(f"removed {files} files, {_bytes(size)}, from {cache.root()}" if files else
          f"nothing to remove in {cache.root()}")
    return EXIT_OK


def _bytes(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    return f"{size / 1024:.1f} KiB" if size < 1024 ** 2 else f"{size / 1024 ** 2:.1f} MiB"


# ---- fusec tune

def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE.fz")
    p.add_argument("--pipeline", metavar="NAME", help="tune only this pipeline (default: all)")
    p.add_argument("--size", type=_size, default=2 ** 26, metavar="N",
                   help="elements per call, e.g. 2^26 (default); the choice is kept for this shape class and GPU")
    p.add_argument("--dtype", choices=("f16", "bf16", "f32", "f64"), help="replace the program's float type")
    p.add_argument("--fast-math", action="store_true", help="tune the fast-math form")


def run_tune(args) -> int:
    program, names = _bench_program(args, read_input(args.file))
    from fusec.runtime.backends.cuda import available
    if not available():
        print("fusec tune: needs a CUDA device and CuPy (pip install 'fusec[cuda12]' or '[cuda13]'); "
              "none was found", file=sys.stderr)
        return EXIT_USAGE
    import cupy as cp

    from fusec.bench import harness
    from fusec.jit import JitOptions, JitPipeline
    from fusec.runtime import tuning
    for name in names:
        f = JitPipeline(program, name, JitOptions(backend="cuda", tune=True, fast_math=args.fast_math))
        pipeline = program.pipeline(name)
        f(*harness.make_args(cp, pipeline, harness.dims_for(pipeline, args.size), seed=5))
        timings = getattr(f, "timings", None)
        print(f"pipeline {name}: " + ("the choice kept from an earlier tuning for this shape class and GPU"
                                      if timings is None else f"{len(timings)} candidates timed"))
        if timings:
            print(tuning.describe(timings))
    return EXIT_OK
