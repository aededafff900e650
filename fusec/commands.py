"""`fusec compile`: its arguments and the command."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .compiler import CompileOptions, compile_pipeline
from .errors import Diagnostic, FzError, Loc
from .frontend import check_source
from .parser import read_source

# Registers per SM (64K on every arch since sm_50) and the most threads an SM
# runs; the default budget keeps half occupancy, enough for memory-bound kernels.
REGISTER_FILE = 65536
MAX_THREADS_PER_SM = {75: 1024, 80: 2048, 86: 1536, 87: 1536, 89: 1536, 90: 2048, 100: 2048, 120: 1536}


def default_max_regs(arch: str) -> int:
    number = int(arch.split("_")[1].rstrip("a"))
    threads = MAX_THREADS_PER_SM.get(number, 2048)
    return min(255, REGISTER_FILE // (threads // 2) // 8 * 8)


def _arch(text: str) -> str:
    if not re.fullmatch(r"sm_\d{2,3}a?", text):
        raise argparse.ArgumentTypeError(f"expected an architecture like sm_90, got {text!r}")
    return text


def _regs(text: str) -> int:
    value = int(text) if text.isdigit() else -1
    if not 16 <= value <= 255:
        raise argparse.ArgumentTypeError(f"expected a register count from 16 to 255, got {text!r}")
    return value


def add_compile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE.fz")
    p.add_argument("-o", dest="output", metavar="OUT.cu", help="write to this file (default: stdout)")
    p.add_argument("--pipeline", metavar="NAME", help="compile only this pipeline (default: all)")
    p.add_argument("--unfused", action="store_true", help="one kernel per stage, for comparison")
    p.add_argument("--emit", choices=("cuda", "ir", "report"), default="cuda",
                   help="CUDA C (default), the stage graph and partition, or the JSON report")
    p.add_argument("--arch", type=_arch, default="sm_90", help="target architecture (default sm_90)")
    p.add_argument("--max-regs", type=_regs, metavar="N",
                   help="register budget per thread for fused kernels (default: half occupancy on --arch)")
    p.add_argument("--report", action="store_true", help="print a table of kernels and traffic to stderr")


def run_compile(args) -> int:
    program = check_source(read_source(args.file))
    names = [p.name for p in program.pipelines]
    if args.pipeline is not None and args.pipeline not in names:
        raise FzError(Diagnostic(Loc(), f"no pipeline named '{args.pipeline}' (pipelines: {', '.join(names)})"),
                      program.source)
    selected = [args.pipeline] if args.pipeline else names
    max_regs = args.max_regs or default_max_regs(args.arch)
    compiled = [compile_pipeline(program, name, CompileOptions(fuse=not args.unfused, max_regs=max_regs))
                for name in selected]
    from . import report
    if args.emit == "cuda":
        text = "\n".join(c.cuda for c in compiled)
    elif args.emit == "ir":
        text = "\n".join(report.format_ir(c) for c in compiled)
    else:
        text = json.dumps([k for c in compiled for k in report.report(c)], indent=2) + "\n"
    if args.report:
        for name in selected:
            fused = compile_pipeline(program, name, CompileOptions(fuse=True, max_regs=max_regs))
            unfused = compile_pipeline(program, name, CompileOptions(fuse=False, max_regs=max_regs))
            print(report.table(fused, unfused), file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
