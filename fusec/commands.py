"""`fusec compile`: arguments and the command itself."""
from __future__ import annotations

import argparse


def add_compile_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE.fz")


def run_compile(args) -> int:
    raise NotImplementedError("fusec compile")
