"""Text -> syntax tree (`fusec.frontend.syntax`), with located errors.

One LALR parser, built once from `grammar/fz.lark`. Lark's exceptions are
turned into `FzError`s that point at the offending token; the tree is checked
for nesting depth before it is walked, so that no input can exhaust Python's
recursion limit.
"""
from __future__ import annotations

import functools
import io
import sys
from pathlib import Path

from lark import Lark, Token, Transformer
from lark import __version__ as lark_version
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from fusec import cache
from fusec.errors import Diagnostic, FzError, Loc, Source
from fusec.frontend import syntax, syntax_hints

# Deepest syntax tree accepted (declarations and statements take ~4 levels,
# each operator or call one; parentheses none): a chain of ~190 terms written
# left to right. The checker recurses once per level, so the bound keeps it far
# from Python's recursion limit (1000 frames).
MAX_TREE_DEPTH = 200

# Friendly names for the terminals in "expected ..." messages.
_TERMINAL_NAMES = {"NAME": "a name", "INT": "an integer", "FLOAT": "a number", "$END": "end of file",
                   "INOUT": "'inout'"}
_CLOSERS = ["';'", "')'", "','", "']'", "'{'", "':'", "'='"]


@functools.cache
def _lark() -> Lark:
    grammar = (Path(__file__).parent / "grammar" / "fz.lark").read_text()
    # Lark's strict mode (regex collisions are errors) needs interegular, which a
    # plain install lacks: tests build the grammar strictly, users need not.
    options = dict(parser="lalr", propagate_positions=True, maybe_placeholders=True)

    def build() -> bytes:
        tables = io.BytesIO()
        Lark(grammar, **options).save(tables)
        return tables.getvalue()
    # Building the LALR tables takes ~250 ms; fusec's cache keeps them (Lark's own
    # cache file is written in place, and its name is part of its key).
    tables = cache.load_or_build("grammar", cache.key(grammar, repr(options), lark_version, sys.version), ".lark", build)
    # The transformer builds the syntax tree as the parser reduces (no parse tree
    # in between): half the time of a separate pass on large programs. Lark.load
    # takes no options; _load is what Lark's own cache calls to add them.
    return Lark.__new__(Lark)._load(io.BytesIO(tables), transformer=_ToAst())


def read_source(path: str) -> Source:
    """Reads a .fz file; an unreadable or non-UTF-8 file is an FzError."""
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise FzError(Diagnostic(Loc(), f"cannot read file: {exc.strerror or exc}"), Source(name, "")) from None
    return decode_source(data, name)


def decode_source(data: bytes, name: str) -> Source:
    try:
        return Source(name, data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        before = data[:exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        text = data.decode("utf-8", errors="replace")
        msg = f"file is not valid UTF-8 text (byte 0x{data[exc.start]:02x})"
        raise FzError(Diagnostic(Loc(line, col), msg), Source(name, text)) from None


def parse(source: Source) -> syntax.File:
    """Parses a whole program; raises FzError with the location of the first syntax error."""
    try:
        module = _lark().parse(source.text)
    except UnexpectedInput as exc:
        raise FzError(_syntax_error(exc, source), source) from None
    _check_depth(module, source)
    return module


def _syntax_error(exc: UnexpectedInput, source: Source) -> Diagnostic:
    at_end = isinstance(exc, UnexpectedToken) and exc.token.type == "$END"
    token = exc.token if isinstance(exc, UnexpectedToken) and not at_end else None
    pos = len(source.text) if at_end else token.start_pos if token is not None else exc.pos_in_stream
    if pos is not None:
        stack = list(getattr(exc.state, "value_stack", None) or ())
        found = syntax_hints.hint(syntax_hints.ParseFailure(source.text, pos, token, stack))
        if found is not None:
            offset, message = found
            return Diagnostic(_loc_at(source.text, offset), message)
    if isinstance(exc, UnexpectedCharacters):
        char = source.text[exc.pos_in_stream] if exc.pos_in_stream < len(source.text) else ""
        shown = repr(char) if char.isprintable() else f"U+{ord(char):04X}" if char else "end of file"
        return Diagnostic(Loc(exc.line, exc.column), f"unexpected character {shown}")
    assert isinstance(exc, UnexpectedToken)
    token = exc.token
    if token.type == "$END":
        lines = source.text.split("\n")
        loc = Loc(len(lines), len(lines[-1]) + 1)
        found = "end of file"
    else:
        loc = Loc(token.line, token.column)
        found = f"'{token.value}'" if len(token.value) < 40 else f"'{token.value[:37]}...'"
    expected = {_terminal_text(name) for name in exc.expected}
    # After a complete operand every operator is "expected" too; the closer is the useful hint.
    closers = [c for c in _CLOSERS if c in expected]
    expected = ["';'"] if "';'" in closers else closers or sorted(expected)
    hint = f"; expected {_one_of(expected)}" if expected else ""
    return Diagnostic(loc, f"unexpected {found}{hint}")


def _loc_at(text: str, offset: int) -> Loc:
    line_start = text.rfind("\n", 0, offset) + 1
    return Loc(text.count("\n", 0, offset) + 1, offset - line_start + 1)


def _terminal_text(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    pattern = _lark().get_terminal(name).pattern
    return f"'{pattern.value}'" if pattern.type == "str" else name.lower()


def _one_of(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    if len(items) > 8:
        items = items[:8] + ["..."]
    return "one of " + ", ".join(items)


def _check_depth(module: syntax.File, source: Source) -> None:
    """Iteratively finds a syntax node nested deeper than MAX_TREE_DEPTH."""
    stack = [(module, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, tuple):
            stack.extend((child, depth) for child in node)
            continue
        if not hasattr(node, "__slots__"):
            continue  # a name, a number, None
        if depth > MAX_TREE_DEPTH:
            raise FzError(Diagnostic(node.loc, f"expression is nested too deeply (more than {MAX_TREE_DEPTH} "
                                               "levels); split it into several statements or stages"), source)
        stack.extend((getattr(node, f), depth + 1) for f in node.__slots__ if f != "loc")


def _loc(token: Token) -> Loc:
    return Loc(token.line, token.column)


def _expr(item) -> syntax.Expr:
    """Bare tokens inlined by `?atom` become leaves."""
    if isinstance(item, Token):
        if item.type == "NAME":
            return syntax.Name(str(item), loc=_loc(item))
        return syntax.Num(str(item), item.type == "FLOAT", loc=_loc(item))
    return item


class _ToAst(Transformer):
    """Lark tree -> ast nodes (each method is one grammar rule)."""

    def start(self, decls):
        return syntax.File(tuple(decls))

    # ---- declarations
    def stage_def(self, children):
        name, params, (named, results), body = children
        return syntax.StageDef(str(name), params or (), results, named, body, loc=_loc(name))

    def pipeline_def(self, children):
        name, params, outputs, body = children
        return syntax.PipelineDef(str(name), params or (), outputs or (), body, loc=_loc(name))

    def params(self, items):
        return tuple(items)

    def outputs(self, items):
        return tuple(items)

    def param(self, children):
        inout, name, type_ref = children
        return syntax.Param(str(name), type_ref, inout is not None, loc=_loc(name))

    def single_result(self, children):
        (type_ref,) = children
        return False, (syntax.Param("result", type_ref, False, loc=type_ref.loc),)

    def named_results(self, items):
        return True, tuple(items)

    def type_ref(self, children):
        name, dims = children
        return syntax.TypeRef(str(name), dims, loc=_loc(name))

    def dims(self, items):
        return tuple(syntax.DimDecl(syntax.parse_int(str(t)) if t.type == "INT" else str(t), loc=_loc(t)) for t in items)

    # ---- statements
    def stage_block(self, stmts):
        return tuple(stmts)

    pipe_block = stage_block

    def let_stmt(self, children):
        name, value = children
        return syntax.Let(str(name), _expr(value), loc=_loc(name))

    def return_stmt(self, children):
        keyword, value, _semicolon = children
        return syntax.Return(_expr(value), loc=_loc(keyword))

    def assign(self, children):
        targets, value = children
        return syntax.Assign(targets, _expr(value), loc=targets[0].loc)

    def targets(self, names):
        return tuple(syntax.Name(str(n), loc=_loc(n)) for n in names)

    def repeat(self, children):
        keyword, count, body = children
        return syntax.RepeatBlock(_expr(count), body, loc=_loc(keyword))

    # ---- expressions
    def _binary(self, children):
        left, op, right = children
        return syntax.Binary(str(op), _expr(left), _expr(right), loc=_loc(op))

    or_expr = and_expr = equality = relation = sum = product = power = _binary

    def unary(self, children):
        op, operand = children
        return syntax.Unary(str(op), _expr(operand), loc=_loc(op))

    def ternary(self, children):
        cond, question, then, _colon, other = children
        return syntax.Ternary(_expr(cond), _expr(then), _expr(other), loc=_loc(question))

    def call(self, children):
        name, *args = children
        args = tuple(_expr(a) for a in args if a is not None)
        return syntax.Call(str(name), args, loc=_loc(name))
