"""The front end in one call: text -> parsed -> checked IR."""
from __future__ import annotations

import os
from pathlib import Path

from fusec.errors import Source
from fusec.frontend.check import check_program
from fusec.frontend.parser import parse, read_source
from fusec.ir.program import Program


def check_source(source: Source) -> Program:
    return check_program(parse(source), source)


def load(path_or_text: str) -> Program:
    """A program from a .fz path or from .fz source text."""
    if _is_path(path_or_text):
        return check_source(read_source(path_or_text))  # a missing file is an FzError
    return check_source(Source("<string>", path_or_text))


def _is_path(text: str) -> bool:
    """An existing file is a path. Otherwise text with a newline or a '{' is source
    (every program has a '{'; a one-line program may end in a comment that ends in
    '.fz'), and text that ends in '.fz' or names a folder is a path."""
    if "\n" not in text:
        try:
            if Path(text).is_file():
                return True
        except (OSError, ValueError):  # a name too long, a NUL character
            pass
    if "\n" in text or "{" in text:
        return False
    return text.endswith(".fz") or "/" in text or os.sep in text
