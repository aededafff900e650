"""The `fusec` command line.

Exit codes: 0 success; 1 an error in the user's program (printed as
FILE:LINE:COL: error: ...); 2 a usage error, or a command that cannot run
here (`fusec bench` without a GPU); 3 an internal error of fusec.
"""
from __future__ import annotations

import argparse
import os
import sys

from fusec.errors import FzError

EXIT_OK, EXIT_PROGRAM, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fusec", description="A fusion compiler for elementwise GPU pipelines.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check", help="parse and type-check a .fz file")
    check.add_argument("file", metavar="FILE.fz")

    from fusec.commands import add_bench_arguments, add_compile_arguments
    compile_ = sub.add_parser("compile", help="compile a .fz file to CUDA C")
    add_compile_arguments(compile_)
    bench = sub.add_parser("bench", help="time a pipeline against the copy limit and its peers (needs a GPU)")
    add_bench_arguments(bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # exits 2 on a usage error
    try:
        if args.command == "check":
            from fusec.frontend import check_source
            from fusec.frontend.parser import read_source
            program = check_source(read_source(args.file))
            names = ", ".join(p.name for p in program.pipelines)
            print(f"{args.file}: ok ({len(program.stages)} stages; pipelines: {names})")
            return EXIT_OK
        from fusec.commands import run_bench, run_compile
        return run_bench(args) if args.command == "bench" else run_compile(args)
    except FzError as exc:
        print(exc, file=sys.stderr)
        return EXIT_PROGRAM
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug in fusec: say so plainly; FUSEC_DEBUG=1 shows the traceback
        if os.environ.get("FUSEC_DEBUG"):
            raise
        print(f"fusec: internal error: {type(exc).__name__}: {exc} (set FUSEC_DEBUG=1 for details)",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
