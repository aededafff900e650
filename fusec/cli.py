"""The `fusec` command line.

Exit codes: 0 success; 1 an error in the user's program (printed as
FILE:LINE:COL: error: ...), a file that cannot be read, or output cut off (a
closed pipe); 2 a usage error (including an output file that cannot be
written), or a command that cannot run here (`fusec bench` without a GPU);
3 an internal error of fusec.
"""
from __future__ import annotations

import argparse
import os
import sys

from fusec import __version__
from fusec.commands import (
    EXIT_INTERNAL,
    EXIT_PROGRAM,
    EXIT_USAGE,
    UsageError,
    add_bench_arguments,
    add_cache_arguments,
    add_check_arguments,
    add_compile_arguments,
    add_tune_arguments,
    run_bench,
    run_cache,
    run_check,
    run_compile,
    run_tune,
)
from fusec.errors import FzError

COMMANDS = {"check": run_check, "compile": run_compile, "bench": run_bench, "tune": run_tune, "cache": run_cache}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fusec", description="A fusion compiler for elementwise GPU pipelines.")
    parser.add_argument("--version", action="version", version=f"fusec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_check_arguments(sub.add_parser("check", help="parse and type-check .fz files"))
    add_compile_arguments(sub.add_parser("compile", help="compile a .fz file to CUDA C"))
    add_bench_arguments(sub.add_parser(
        "bench", help="time a pipeline against the copy limit and its peers (needs a GPU)"))
    add_tune_arguments(sub.add_parser(
        "tune", help="time the cost model's best partitions on the GPU and keep the fastest (needs a GPU)"))
    add_cache_arguments(sub.add_parser("cache", help="where fusec keeps its builds; clear them"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # exits 2 on a usage error
    try:
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # here, so that a closed pipe is reported below, not at exit
        return code
    except FzError as exc:
        print(exc, file=sys.stderr)
        return EXIT_PROGRAM
    except UsageError as exc:
        print(f"fusec {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `fusec compile ... | head`: the reader left
        _discard_stdout()
        _say("fusec: output cut off: the pipe fusec was writing to was closed")
        return EXIT_PROGRAM
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug in fusec: say so plainly; FUSEC_DEBUG=1 shows the traceback
        if os.environ.get("FUSEC_DEBUG"):
            raise
        print(f"fusec: internal error: {type(exc).__name__}: {exc} (set FUSEC_DEBUG=1 for details)",
              file=sys.stderr)
        return EXIT_INTERNAL


def _discard_stdout() -> None:
    """Points stdout at /dev/null, so that Python's flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):  # stdout is not a file (captured by a test)
        pass


def _say(message: str) -> None:
    try:
        print(message, file=sys.stderr)
    except OSError:  # stderr went with stdout (`2>&1 | head`)
        pass


if __name__ == "__main__":
    sys.exit(main())
