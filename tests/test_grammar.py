"""The grammar itself: LALR(1) with no terminal collisions (Lark's strict mode, which needs interegular)."""
from pathlib import Path

from lark import Lark

import fusec


def test_grammar_builds_in_strict_mode():
    grammar = (Path(fusec.__file__).parent / "frontend" / "grammar" / "fz.lark").read_text()
    Lark(grammar, parser="lalr", strict=True)
