"""What to write instead: messages for syntax that .fz does not have.

The grammar stays the language. These rules only read a parse error (the
offending token or character, the operator characters around it, and the
tokens and syntax nodes the parser had shifted before it) and, where they
recognise a construct from C or Python that .fz lacks (`x >> 3`, `x += 1.0`,
`if (...)`, `let` in a pipeline, `eps: f32 = 1e-5`, `f(x, s=2.0)`), say so and
what to write. Any other error keeps the parser's "unexpected X; expected Y".
"""
from __future__ import annotations

from dataclasses import dataclass

from lark import Token

_NO_BITWISE = "there are no bitwise operators"
_SHIFT = ("there are no shift operators in .fz; multiply or divide by a power of two instead "
          "(`x * 8`, `x / 8`)")


def _compound(op: str):
    return lambda t: (f"there is no '{op}=' in .fz (no compound assignment): write `{t} = {t} {op} ...;`")


# Spellings of operators .fz lacks, longest first where one starts another.
# Each maps the target's name (for an assignment) to the message.
_OPERATORS = {
    "<<=": lambda t: f"'<<=' is not supported: {_SHIFT}",
    ">>=": lambda t: f"'>>=' is not supported: {_SHIFT}",
    "<<": lambda t: f"'<<' is not supported: {_SHIFT}",
    ">>": lambda t: f"'>>' is not supported: {_SHIFT}",
    "**=": _compound("**"), "&&=": _compound("&&"), "||=": _compound("||"),
    "+=": _compound("+"), "-=": _compound("-"), "*=": _compound("*"), "/=": _compound("/"), "%=": _compound("%"),
    "++": lambda t: f"there is no '++' in .fz: write `{t} = {t} + 1;`",
    "--": lambda t: f"there is no '--' in .fz: write `{t} = {t} - 1;`",
    "===": lambda t: "there is no '===' in .fz: write '=='",
    "!==": lambda t: "there is no '!==' in .fz: write '!='",
    "<>": lambda t: "there is no '<>' in .fz: write '!='",
    "^=": lambda t: f"'^' is not power in .fz ({_NO_BITWISE}): write `{t} = {t} ** ...;` for a power",
    "&=": lambda t: f"'&=' is not supported ({_NO_BITWISE}): for bools write `{t} = {t} && ...;`",
    "|=": lambda t: f"'|=' is not supported ({_NO_BITWISE}): for bools write `{t} = {t} || ...;`",
    "^": lambda t: f"'^' is not power in .fz ({_NO_BITWISE}): write `x ** y` for a power (and `a != b` for "
                   "the xor of two bools)",
    "&": lambda t: f"'&' is not an operator in .fz ({_NO_BITWISE}): for bools write `a && b`",
    "|": lambda t: f"'|' is not an operator in .fz ({_NO_BITWISE}): for bools write `a || b`",
    "~": lambda t: f"'~' is not an operator in .fz ({_NO_BITWISE}): for a bool write `!a`",
}
_OPERATOR_CHARS = frozenset("<>=!+-*/%^&|~")

_CHOICE = "there is no control flow; choose per element with `c ? a : b` or `where(c, a, b)`"
_LOOP = "there is no control flow; run statements several times with `repeat N { ... }` in a pipeline"
_KEYWORDS = {
    "if": _CHOICE, "else": _CHOICE, "elif": _CHOICE, "switch": _CHOICE, "case": _CHOICE,
    "for": _LOOP, "while": _LOOP, "do": _LOOP, "loop": _LOOP, "break": _LOOP, "continue": _LOOP,
}


@dataclass(frozen=True)
class ParseFailure:
    """A parse error, as the rules read it."""

    text: str
    pos: int  # offset of the offending token or character
    token: Token | None  # None: an unexpected character
    stack: list  # what the parser shifted before it: tokens and (reduced) syntax nodes


def hint(f: ParseFailure) -> tuple[int, str] | None:
    """(offset, message) where the error is a construct .fz lacks; None otherwise."""
    for rule in (_operator, _keyword, _inout, _equals):
        found = rule(f)
        if found is not None:
            return found
    return None


def _tokens(f: ParseFailure) -> list[Token]:
    return [item for item in f.stack if isinstance(item, Token)]


def _target(f: ParseFailure) -> str:
    """The name an assignment's operator follows (`y` in `y += 1`), or `x`."""
    last = f.stack[-1] if f.stack else None
    return str(last) if isinstance(last, Token) and last.type == "NAME" else "x"


def _operator(f: ParseFailure) -> tuple[int, str] | None:
    """A spelling of _OPERATORS in the run of operator characters at the error,
    starting at or before it and covering it (`x >> 3` fails at the second '>';
    `x &&` at the end of the file is not about '&')."""
    text, start = f.text, f.pos
    while start > 0 and text[start - 1] in _OPERATOR_CHARS:
        start -= 1
    for s in range(start, f.pos + 1):
        for spelling, message in _OPERATORS.items():
            if text.startswith(spelling, s) and s + len(spelling) > f.pos:
                return s, message(_target(f))
    return None


def _keyword(f: ParseFailure) -> tuple[int, str] | None:
    """A keyword of C or Python, or one of .fz in the wrong kind of body: the
    offending token, or the name just before it (`if (`, `let t`, `return x`)."""
    candidates = [f.token] if f.token is not None else []
    if f.stack and isinstance(f.stack[-1], Token):
        candidates.insert(0, f.stack[-1])
    body = _body(f)
    for tok in candidates:
        word = str(tok)
        if word in _KEYWORDS:
            return tok.start_pos, f"'{word}' is not in .fz: {_KEYWORDS[word]}"
        if word == "let" and body == "pipeline":
            return tok.start_pos, ("there is no 'let' in a pipeline: its statements assign arrays, so write "
                                   "`t = ...;` (`let` declares a local in a stage)")
        if word == "return" and body == "pipeline":
            return tok.start_pos, ("a pipeline has no 'return': assign its declared outputs (`y = ...;`)")
        if word == "repeat" and body == "stage":
            return tok.start_pos, ("'repeat' is only allowed in a pipeline: a stage is a function of scalars, "
                                   "applied to each element")
    return None


def _body(f: ParseFailure) -> str | None:
    """"stage" or "pipeline": the declaration the error is in (its keyword is still on the stack)."""
    for tok in reversed(_tokens(f)):
        if tok.type in ("STAGE", "PIPELINE"):
            return tok.type.lower()
    return None


def _inout(f: ParseFailure) -> tuple[int, str] | None:
    tokens = _tokens(f)
    if not tokens or f.token is None:
        return None
    last = tokens[-1]
    if last.type == "INOUT" and f.token.type == "COLON":
        return last.start_pos, "'inout' is a keyword (a parameter's mode): give the parameter another name"
    if last.type == "NAME" and str(last) == "inout":
        if len(tokens) > 1 and tokens[-2].type == "INOUT":
            return last.start_pos, "'inout' is written twice"
        if _body(f) == "stage":
            return last.start_pos, ("'inout' is for a pipeline's array parameters; a stage's parameters and "
                                    "results are values")
    return None


def _equals(f: ParseFailure) -> tuple[int, str] | None:
    """`=` inside parentheses: a default value of a parameter, or a keyword argument."""
    if f.token is None or f.token.type != "EQUAL":
        return None
    opening = _open_paren(f.stack)
    if opening is None:
        return None
    before = f.stack[opening - 1] if opening > 0 else None
    if isinstance(before, Token) and before.type == "NAME":
        decl = f.stack[opening - 2] if opening > 1 else None
        if isinstance(decl, Token) and decl.type in ("STAGE", "PIPELINE"):
            name = _param_name(f.stack[opening:])
            return f.pos, (f"a parameter cannot have a default value in .fz: remove `= ...` and pass "
                           f"'{name}' at call time")
        keyword = f.stack[-1]
        if isinstance(keyword, Token) and keyword.type == "NAME":
            return keyword.start_pos, (f"there are no keyword arguments in .fz: pass the arguments of "
                                       f"'{before}' in order (drop '{keyword}=')")
    elif isinstance(before, Token) and str(before) == "->":
        return f.pos, "an output cannot have a default value: assign it in the pipeline's body"
    return None


def _open_paren(stack: list) -> int | None:
    """The index of the innermost '(' not yet closed (a reduced node holds its own pairs)."""
    depth = 0
    for i in range(len(stack) - 1, -1, -1):
        item = stack[i]
        if isinstance(item, Token) and item.type == "RPAR":
            depth += 1
        elif isinstance(item, Token) and item.type == "LPAR":
            if depth == 0:
                return i
            depth -= 1
    return None


def _param_name(items: list) -> str:
    """The name of the parameter being declared: the NAME before the last ':'."""
    names = [t for t in items if isinstance(t, Token) and t.type in ("NAME", "COLON")]
    for a, b in zip(reversed(names[:-1]), reversed(names)):
        if b.type == "COLON" and a.type == "NAME":
            return str(a)
    return "it"
