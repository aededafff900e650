"""The syntax tree of a .fz program, as the parser builds it.

Untyped and unchecked; `fusec.frontend.check` turns it into the IR.
Every node carries the location of its first token (not part of equality).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from fusec.errors import Loc, loc_field

# A literal of more digits than this is far beyond 64 bits (and beyond what
# Python's int() reads from long decimal text): only its being too large matters.
MAX_INT_DIGITS = 40
TOO_LARGE = 1 << 256


def abbreviate(text: str, limit: int = 40) -> str:
    """A literal's text for a message: long ones cut (a 5000-digit number)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_int(text: str) -> int:
    """An integer literal's value: hexadecimal after 0x, else decimal (a leading zero
    is not octal); TOO_LARGE for a literal of more than MAX_INT_DIGITS digits."""
    hexadecimal = text[:2].lower() == "0x"
    digits = (text[2:] if hexadecimal else text).lstrip("0") or "0"
    if len(digits) > MAX_INT_DIGITS:
        return TOO_LARGE
    return int(digits, 16 if hexadecimal else 10)


@dataclass(frozen=True, slots=True)
class Num:
    text: str
    is_float: bool
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Name:
    id: str
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Unary:
    op: str
    operand: "Expr"
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    left: "Expr"
    right: "Expr"
    loc: Loc = loc_field()  # the operator's location


@dataclass(frozen=True, slots=True)
class Ternary:
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    loc: Loc = loc_field()  # the '?'


@dataclass(frozen=True, slots=True)
class Call:
    func: str
    args: tuple["Expr", ...]
    loc: Loc = loc_field()


Expr = Union[Num, Name, Unary, Binary, Ternary, Call]


@dataclass(frozen=True, slots=True)
class DimDecl:
    value: str | int
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class TypeRef:
    name: str
    dims: tuple[DimDecl, ...] | None  # None: a scalar
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: TypeRef
    inout: bool
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Let:
    name: str
    value: Expr
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Assign:
    targets: tuple[Name, ...]
    value: Expr
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class Return:
    value: Expr
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class RepeatBlock:
    count: "Expr"  # the checker allows an integer literal or an integer scalar's name
    body: tuple["Assign | RepeatBlock", ...]
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class StageDef:
    name: str
    params: tuple[Param, ...]
    results: tuple[Param, ...]
    named_results: bool  # `-> (r: f32, a: f32)` rather than `-> f32`
    body: tuple[Let | Assign | Return, ...]
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class PipelineDef:
    name: str
    params: tuple[Param, ...]
    outputs: tuple[Param, ...]
    body: tuple[Assign | RepeatBlock, ...]
    loc: Loc = loc_field()


@dataclass(frozen=True, slots=True)
class File:
    decls: tuple[StageDef | PipelineDef, ...]
