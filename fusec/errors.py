"""Source locations and the one error type of fusec.

Every error in a user's program is an `FzError` holding one or more
diagnostics; it prints itself as ``FILE:LINE:COL: error: MESSAGE``, the source
line and a caret, the format of C compilers.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Loc:
    """A 1-based line and column in a source file."""

    line: int = 0
    col: int = 0

    def __bool__(self) -> bool:
        return self.line > 0


NOLOC = Loc()


def loc_field():
    """A location that takes no part in equality or hashing."""
    return field(default=NOLOC, compare=False, hash=False, kw_only=True, repr=False)


@dataclass(frozen=True, slots=True)
class Source:
    """A program's text and the name to print in messages."""

    name: str
    text: str

    def line(self, number: int) -> str:
        lines = self.text.split("\n")
        return lines[number - 1] if 0 < number <= len(lines) else ""


@dataclass(frozen=True, slots=True)
class Diagnostic:
    loc: Loc
    message: str

    def format(self, source: Source | None) -> str:
        name = source.name if source else "<input>"
        if not self.loc:
            return f"{name}: error: {self.message}"
        head = f"{name}:{self.loc.line}:{self.loc.col}: error: {self.message}"
        text = source.line(self.loc.line) if source else ""
        if not text:
            return head
        # Long lines (a 1 MB one-liner) are cut around the column.
        start = max(0, self.loc.col - 60)
        shown = text[start:start + 120].replace("\t", " ")
        caret = " " * (self.loc.col - 1 - start) + "^"
        prefix = "..." if start else ""
        return f"{head}\n    {prefix}{shown}\n    {' ' * len(prefix)}{caret}"


class FzError(Exception):
    """Errors in a user's program (exit code 1), all reported together."""

    def __init__(self, diagnostics: list[Diagnostic] | Diagnostic, source: Source | None = None):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics = sorted(diagnostics, key=lambda d: (d.loc.line, d.loc.col))
        self.source = source
        super().__init__(str(self))

    def with_source(self, source: Source) -> "FzError":
        return FzError(self.diagnostics, source)

    def __str__(self) -> str:
        return "\n".join(d.format(self.source) for d in self.diagnostics)


class ArgumentError(TypeError, ValueError):
    """A wrong argument when a compiled pipeline is called (dtype, shape, device...)."""


class Diagnostics:
    """Collects errors so that a checker can report all of them at once."""

    def __init__(self) -> None:
        self.items: list[Diagnostic] = []

    def error(self, loc: Loc, message: str) -> None:
        self.items.append(Diagnostic(loc, message))

    def raise_if_any(self, source: Source | None = None) -> None:
        if self.items:
            raise FzError(self.items, source)
