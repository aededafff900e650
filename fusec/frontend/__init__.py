"""The front end in one call: text -> parsed -> checked IR."""
from __future__ import annotations

from fusec.errors import Source
from fusec.frontend.check import check_program
from fusec.frontend.parser import parse, read_source
from fusec.ir.program import Program


def check_source(source: Source) -> Program:
    return check_program(parse(source), source)


def load(path_or_text: str) -> Program:
    """A program from a .fz path or from .fz source text."""
    if "\n" not in path_or_text and path_or_text.endswith(".fz"):
        return check_source(read_source(path_or_text))
    return check_source(Source("<string>", path_or_text))
