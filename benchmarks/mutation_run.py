"""A mutation run over fusec's core: does the test suite notice when the compiler is wrong?

Each mutant is one small change to one module of the compiler's core (parser,
checker, fusion, register estimate, codegen, binder):

- compare     a comparison shifted or flipped: `<` <-> `<=`, `>` <-> `>=`,
              `==` <-> `!=`, `is` <-> `is not`, `in` <-> `not in`
- arith       an arithmetic operator swapped: `+` <-> `-`, `*` -> `+`,
              `/` -> `*`, `//` -> `*`, `%` -> `//`, `**` -> `*`, `<<` <-> `>>`,
              `|` <-> `&`, `^` -> `|` (augmented assignments too)
- int         an integer constant plus or minus one
- bool        a boolean constant negated
- logic       `and` <-> `or`; a `not` dropped
- delete      a statement in the body of an `if` (a `return`, a `raise`, ...) replaced by `pass`
- c-code      in the codegen modules, a string of C code changed: a function
              for its opposite (`fminf` -> `fmaxf`, `floor` -> `ceil`), a
              rounding mode (`_rn` -> `_rz`), an operator (` + ` -> ` - `,
              `<` -> `<=`, `&&` -> `||`), or a one-call string emptied to its
              operand (`fabsf({0})` -> `{0}`, `__float2half_rn({value})` -> `{value}`)

plus the hand-written mutants the hardening issue names (`NAMED`), which must
be killed by a numeric or explicit assertion: they run without the golden
tests.

Each mutant is a text edit of the module (so its diff is readable), checked to
parse to exactly the intended syntax tree, and applied to a copy of the
working tree in a temporary directory; a chosen fast subset of the tests then
runs against the copy (`python -m pytest -x -q -p no:cacheprovider`, with a
timeout). A mutant is killed if the tests fail, survives if they pass. The
mutants are a seeded random sample over the modules (every module gets at
least a few), run by a pool of workers, each running one pytest process at a
time. `--confirm` runs each survivor again against the rest of the suite (what
the subset leaves out: the slow examples, the nvcc tier, the long fuzz), so that
a survivor of the whole CI suite is told apart from a survivor of the subset.

    python benchmarks/mutation_run.py --sample 300 --seed 1 --jobs 2 --confirm --json mutation.json
    python benchmarks/mutation_run.py --named-only --json named.json
    python benchmarks/mutation_run.py --list                      # mutants per module and kind
    python benchmarks/mutation_run.py --rerun mutation.json       # its survivors, against today's tests
    python benchmarks/mutation_run.py --show fusec/passes/regs.py#41   # one mutant's diff

The results (a table per module: mutants, killed, survived, timed out, kill
rate; each survivor's diff) are printed and written to the JSON file.
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import dataclasses
import datetime
import difflib
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TARGETS = [
    "fusec/frontend/parser.py",
    "fusec/frontend/check_expr.py",
    "fusec/frontend/check_pipeline.py",
    "fusec/passes/lower.py",
    "fusec/passes/fusion.py",
    "fusec/passes/partitions.py",
    "fusec/passes/recompute.py",
    "fusec/passes/liveness.py",
    "fusec/passes/regs.py",
    "fusec/passes/variants.py",
    "fusec/codegen/cexpr.py",
    "fusec/codegen/emit.py",
    "fusec/runtime/binder.py",
]
# Modules whose strings are C code (the others' strings are messages).
C_CODE_MODULES = {"fusec/codegen/cexpr.py", "fusec/codegen/emit.py"}

# The fast subset, cheapest and most telling first (pytest runs files in the
# order given and stops at the first failure). It leaves out what costs minutes:
# the fusion_hurts example (~17 s a compile), the nvcc tier, the long fuzz.
SUBSET_FILES = [
    "tests/test_grammar.py", "tests/test_declarations.py", "tests/test_literals.py", "tests/test_messages.py",
    "tests/test_malformed.py", "tests/test_reference.py", "tests/test_estimate.py", "tests/test_fusion.py",
    "tests/test_graph_sim.py", "tests/test_binder_sim.py", "tests/test_semantics_sim.py", "tests/test_repeat.py",
    "tests/test_vector_sim.py", "tests/test_call_cache_sim.py", "tests/test_bad_input.py", "tests/test_peers.py",
    "tests/test_generated.py", "tests/test_golden.py", "tests/test_programs_sim.py", "tests/test_launch_interface.py",
    "tests/test_generated_sim.py", "tests/test_generator_findings_sim.py", "tests/test_recompute.py",
    "tests/test_recompute_sim.py",
    "tests/test_jit.py", "tests/test_jit_sim.py", "tests/test_foreach_sim.py", "tests/test_cli.py",
]
SUBSET_DESELECT = "not fusion_hurts and not megabyte"
# Where a module's mutants are most likely to be seen: these run first.
FIRST = {
    "fusec/frontend/parser.py": ["tests/test_malformed.py", "tests/test_messages.py"],
    "fusec/frontend/check_expr.py": ["tests/test_literals.py", "tests/test_semantics_sim.py"],
    "fusec/frontend/check_pipeline.py": ["tests/test_declarations.py", "tests/test_repeat.py"],
    "fusec/passes/lower.py": ["tests/test_generator_findings_sim.py", "tests/test_repeat.py"],
    "fusec/passes/fusion.py": ["tests/test_fusion.py", "tests/test_launch_interface.py"],
    "fusec/passes/recompute.py": ["tests/test_recompute.py", "tests/test_recompute_sim.py"],
    "fusec/passes/partitions.py": ["tests/test_fusion.py", "tests/test_graph_sim.py"],
    "fusec/passes/liveness.py": ["tests/test_fusion.py", "tests/test_graph_sim.py"],
    "fusec/passes/regs.py": ["tests/test_estimate.py", "tests/test_vector_sim.py"],
    "fusec/passes/variants.py": ["tests/test_vector_sim.py", "tests/test_estimate.py"],
    "fusec/codegen/cexpr.py": ["tests/test_semantics_sim.py", "tests/test_golden.py"],
    "fusec/codegen/emit.py": ["tests/test_programs_sim.py", "tests/test_golden.py"],
    "fusec/runtime/binder.py": ["tests/test_binder_sim.py", "tests/test_jit_sim.py"],
}
# Golden text alone may not kill a named mutant: these run without it.
GOLDEN_FILES = {"tests/test_golden.py"}
# Copied into each mutant's tree (tests read the examples, the README, the package metadata).
TREE = ["fusec", "tests", "examples", "pyproject.toml", "README.md", "LICENSE"]
MIN_PER_MODULE = 12
# The rest of the suite holds the long fuzz and the nvcc tier: minutes, not seconds.
CONFIRM_TIMEOUT = 1800


# ---------------------------------------------------------------------------
# Mutants


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One text edit of one module: bytes [start, end) of its UTF-8 source,
    `before` there, replaced by `after`."""

    id: str
    module: str
    kind: str
    line: int
    description: str
    start: int
    end: int
    before: str
    after: str
    why: str = ""  # a named mutant: what the issue says it stands for

    def apply(self, source: bytes) -> bytes:
        if source[self.start:self.end].decode() != self.before:
            raise ValueError(f"{self.id}: the module changed since the mutant was made")
        return source[:self.start] + self.after.encode() + source[self.end:]

    def diff(self, source: bytes) -> str:
        lines = difflib.unified_diff(source.decode().splitlines(True), self.apply(source).decode().splitlines(True),
                                     f"a/{self.module}", f"b/{self.module}", n=1)
        return "".join(lines)


@dataclasses.dataclass(frozen=True)
class Named:
    """A hand-written mutant: `old` (once in `module`) becomes `new`."""

    name: str
    module: str
    old: str
    new: str
    why: str


NAMED = [
    Named("literal-dim-unchecked", "fusec/runtime/binder.py",
          "                if size != decl:\n                    raise",
          "                if False:\n                    raise",
          "the check of a literal dimension disabled: a 3x5 array accepted for [rows, 4]"),
    Named("int-scalar-range-high+1", "fusec/runtime/binder.py",
          "if not lo <= int(value) <= hi:", "if not lo <= int(value) <= hi + 1:",
          "an integer scalar's range check moved by one (the full check: NumPy integers)"),
    Named("int-scalar-range-low-1", "fusec/runtime/binder.py",
          "if not lo <= int(value) <= hi:", "if not lo - 1 <= int(value) <= hi:",
          "an integer scalar's range check moved by one, at the low end"),
    Named("int-scalar-range-high-1", "fusec/runtime/binder.py",
          "if not lo <= int(value) <= hi:", "if not lo <= int(value) < hi:",
          "an integer scalar's range check moved by one: the largest value rejected"),
    Named("int-scalar-fast-path+1", "fusec/runtime/binder.py",
          "return value if type(value) is int and lo <= value <= hi else",
          "return value if type(value) is int and lo <= value <= hi + 1 else",
          "an integer scalar's range check moved by one (the fast path: Python ints)"),
    Named("f64-regs-1", "fusec/types.py", "return 2 if self.compute.bits == 64 else 1",
          "return 1 if self.compute.bits == 64 else 1",
          "the f64 register constant changed: a 64-bit value counted as one register"),
    Named("f64-regs+1", "fusec/types.py", "return 2 if self.compute.bits == 64 else 1",
          "return 3 if self.compute.bits == 64 else 1",
          "the f64 register constant changed: a 64-bit value counted as three registers"),
    Named("f64-scratch+1", "fusec/passes/regs.py", '"exp": (4, 8), "exp2": (4, 22)', '"exp": (5, 8), "exp2": (4, 22)',
          "an f64 scratch constant changed (exp's expansion)"),
    Named("grid-stride-regs+1", "fusec/passes/regs.py", "GRID_STRIDE_REGS = 9", "GRID_STRIDE_REGS = 10",
          "the grid-stride register constant changed"),
    Named("grid-stride-regs-1", "fusec/passes/regs.py", "GRID_STRIDE_REGS = 9", "GRID_STRIDE_REGS = 8",
          "the grid-stride register constant changed"),
    Named("loop-regs+1", "fusec/passes/regs.py", "LOOP_REGS = 7", "LOOP_REGS = 8",
          "the loop kernel's register constant changed"),
    Named("f32-min-nan-second", "fusec/codegen/cexpr.py", '"min": ("fminf({0}, {1})"',
          '"min": ("({0} < {1} ? {0} : {1})"',
          "f32 min wrong when its second operand is NaN (a compare-and-select yields the NaN)"),
    Named("f64-min-nan-second", "fusec/codegen/cexpr.py", '"fmin({0}, {1})"),', '"({0} < {1} ? {0} : {1})"),',
          "f64 min wrong when its second operand is NaN"),
    Named("stage-result-not-rounded", "fusec/frontend/check.py",
          """f"result '{name}' of stage '{d.name}'",\n                                  store=True)""",
          """f"result '{name}' of stage '{d.name}'",\n                                  store=False)""",
          "the f16/bf16 rounding of stage results dropped"),
    Named("stored-value-not-rounded", "fusec/frontend/check_expr.py",
          "return self._round_stored(value, to, loc) if store and to.compute != to else value",
          "return value",
          "the f16/bf16 rounding of stored values (stage results, arguments, assignments) dropped"),
]


def named_mutants(base: Path) -> list[Mutant]:
    out = []
    for n in NAMED:
        source = (base / n.module).read_bytes()
        old = n.old.encode()
        if source.count(old) != 1:
            raise SystemExit(f"named mutant {n.name}: {n.old!r} occurs {source.count(old)} times in {n.module}")
        start = source.index(old)
        out.append(Mutant(f"named:{n.name}", n.module, "named", source[:start].count(b"\n") + 1, n.name, start,
                          start + len(old), n.old, n.new, n.why))
    return out


_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
          ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
          ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr, ast.BitXor: ast.BitOr}
_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
           ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-",
           ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<",
           ast.RShift: ">>", ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^", ast.And: "and", ast.Or: "or"}
# C code: (pattern, replacement, what). Each match is a mutant of its own.
_C_SWAPS = [
    (r"\bfminf\b", "fmaxf", "fminf -> fmaxf"), (r"\bfmaxf\b", "fminf", "fmaxf -> fminf"),
    (r"\bfmin\b", "fmax", "fmin -> fmax"), (r"\bfmax\b", "fmin", "fmax -> fmin"),
    (r"\bfz_min\b", "fz_max", "fz_min -> fz_max"), (r"\bfz_max\b", "fz_min", "fz_max -> fz_min"),
    (r"\bfloor(f?)\b", r"ceil\1", "floor -> ceil"), (r"\bceil(f?)\b", r"floor\1", "ceil -> floor"),
    (r"\brint(f?)\b", r"round\1", "rint -> round"), (r"\bexp(f?)\(", r"exp2\1(", "exp -> exp2"),
    (r"\blog(f?)\(", r"log2\1(", "log -> log2"),
    (r"_rn\b", "_rz", "round to nearest -> toward zero"),
    (r" \+ ", " - ", "+ -> -"), (r" - ", " + ", "- -> +"), (r" \* ", " / ", "* -> /"), (r" / ", " * ", "/ -> *"),
    (r"(?<![<>=!])<(?![<=])", "<=", "< -> <="), (r"<=", "<", "<= -> <"),
    (r"(?<![<>=!-])>(?![>=])", ">=", "> -> >="), (r">=", ">", ">= -> >"),
    (r"==", "!=", "== -> !="), (r"!=", "==", "!= -> =="), (r"&&", "||", "&& -> ||"), (r"\|\|", "&&", "|| -> &&"),
]
_ONE_CALL = re.compile(r"([A-Za-z_][\w.]*)\((\{[^{}]*\})\)")


class _Candidate:
    """A mutant before it is realized: the text edit, and how to make the same
    change to the syntax tree (`swap` toggles it) so that the edit can be checked."""

    def __init__(self, kind: str, node: ast.AST, description: str, edit: tuple[int, int, str],
                 swap, fallback_node: ast.AST | None = None):
        self.kind, self.node, self.description, self.edit = kind, node, description, edit
        self.swap, self.fallback_node = swap, fallback_node


class _Module:
    """One target module: its source, tree and byte offsets."""

    def __init__(self, path: str, base: Path):
        self.path = path
        self.source = (base / path).read_bytes()
        self.tree = ast.parse(self.source)
        self.line_starts = [0]
        for line in self.source.splitlines(True):
            self.line_starts.append(self.line_starts[-1] + len(line))
        self.parents = {child: node for node in ast.walk(self.tree) for child in ast.iter_child_nodes(node)}

    def offset(self, line: int, col: int) -> int:
        return self.line_starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, start: int, end: int) -> str:
        return self.source[start:end].decode()

    # ---- enumeration
    def candidates(self) -> list[_Candidate]:
        out: list[_Candidate] = []
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.stmt) and self._is_text(node):
                continue
            if isinstance(node, ast.Compare):
                out += self._compare(node)
            elif isinstance(node, (ast.BinOp, ast.AugAssign)):
                out += self._arith(node)
            elif isinstance(node, ast.BoolOp):
                out += self._boolop(node)
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                out.append(self._drop_not(node))
            elif isinstance(node, ast.Constant) and not self._is_docstring(node):
                out += self._constant(node)
            elif isinstance(node, ast.JoinedStr) and self.path in C_CODE_MODULES and not _is_c_comment(node):
                out += self._c_fstring(node)
            if isinstance(node, ast.If):
                out += [self._delete(node, k) for k in range(len(node.body))]
        return out

    def _op_edit(self, left: ast.AST, right: ast.AST, symbol: str, new_symbol: str) -> tuple[int, int, str] | None:
        """Replace the operator token between two operands (outside comments)."""
        start, end = self.span(left)[1], self.span(right)[0]
        gap = self.text(start, end)
        masked = re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), gap)
        if symbol[0].isalpha():
            pattern = r"\b" + r"\s+".join(map(re.escape, symbol.split())) + r"\b"
        else:
            pattern = r"(?<![<>=!*/&|^%+\-])" + re.escape(symbol) + r"(?![<>=*/&|])"
        found = list(re.finditer(pattern, masked))
        if len(found) != 1:
            return None
        m = found[0]
        return start + len(gap[:m.start()].encode()), start + len(gap[:m.end()].encode()), new_symbol

    def _compare(self, node: ast.Compare) -> list[_Candidate]:
        out = []
        for k, op in enumerate(node.ops):
            new = _COMPARE[type(op)]
            left = node.left if k == 0 else node.comparators[k - 1]
            edit = self._op_edit(left, node.comparators[k], _SYMBOL[type(op)], _SYMBOL[new])

            def swap(node=node, k=k, old=op, new=new):
                node.ops[k] = new() if node.ops[k] is old else old
            out.append(_Candidate("compare", node, f"{_SYMBOL[type(op)]} -> {_SYMBOL[new]}", edit, swap, node))
        return out

    def _arith(self, node: ast.BinOp | ast.AugAssign) -> list[_Candidate]:
        new = _ARITH.get(type(node.op))
        if new is None:
            return []
        old_symbol, new_symbol = _SYMBOL[type(node.op)], _SYMBOL[new]
        if isinstance(node, ast.AugAssign):
            edit = self._op_edit(node.target, node.value, old_symbol + "=", new_symbol + "=")
            fallback = None
        else:
            edit = self._op_edit(node.left, node.right, old_symbol, new_symbol)
            fallback = node

        def swap(node=node, old=node.op, new=new):
            node.op = new() if node.op is old else old
        return [_Candidate("arith", node, f"{old_symbol} -> {new_symbol}", edit, swap, fallback)]

    def _boolop(self, node: ast.BoolOp) -> list[_Candidate]:
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        old_symbol, new_symbol = _SYMBOL[type(node.op)], _SYMBOL[new]
        edits = [self._op_edit(a, b, old_symbol, new_symbol) for a, b in zip(node.values, node.values[1:])]
        edit = None
        if all(edits):  # one edit spanning every operator
            start, end = edits[0][0], edits[-1][1]
            text = self.text(start, end)
            for s, e, _ in reversed(edits):
                text = text[:len(self.text(start, s))] + new_symbol + text[len(self.text(start, e)):]
            edit = (start, end, text)

        def swap(node=node, old=node.op, new=new):
            node.op = new() if node.op is old else old
        return [_Candidate("logic", node, f"{old_symbol} -> {new_symbol}", edit, swap, node)]

    def _drop_not(self, node: ast.UnaryOp) -> _Candidate:
        start, end = self.span(node)
        operand = self.text(*self.span(node.operand))
        parent = self.parents[node]

        def swap(node=node, parent=parent):
            _replace_child(parent, node, node.operand) or _replace_child(parent, node.operand, node)
        return _Candidate("logic", node, "not dropped", (start, end, f"({operand})"), swap)

    def _constant(self, node: ast.Constant) -> list[_Candidate]:
        value = node.value
        start, end = self.span(node)
        out = []

        def setter(new, node=node, old=value):
            def swap():
                node.value = new if node.value == old and type(node.value) is type(old) else old
            return swap
        if isinstance(value, bool):
            out.append(_Candidate("bool", node, f"{value} -> {not value}", (start, end, str(not value)),
                                  setter(not value)))
        elif isinstance(value, int):
            for new in (value + 1, value - 1):
                text = str(new) if new >= 0 else f"({new})"
                out.append(_Candidate("int", node, f"{value} -> {new}", (start, end, text), setter(new)))
        elif isinstance(value, str) and self.path in C_CODE_MODULES and not value.startswith("//") \
                and not isinstance(self.parents[node], ast.JoinedStr):
            for new, what in _c_mutations(value):
                out.append(_Candidate("c-code", node, f"{what}: {value!r} -> {new!r}", (start, end, repr(new)),
                                      setter(new)))
        return out

    def _c_fstring(self, node: ast.JoinedStr) -> list[_Candidate]:
        start, end = self.span(node)
        out = []
        parts = node.values
        for k, part in enumerate(parts):
            if not isinstance(part, ast.Constant):
                continue
            for new, what in _c_mutations(part.value, emptying=False):
                def swap(part=part, old=part.value, new=new):
                    part.value = new if part.value == old else old
                swap()
                out.append(_Candidate("c-code", node, f"{what} in an f-string",
                                      (start, end, ast.unparse(node)), swap))
                swap()
        # The f-string is one call around one value: emptied to the value.
        if (len(parts) == 3 and isinstance(parts[1], ast.FormattedValue) and isinstance(parts[0], ast.Constant)
                and re.fullmatch(r"[A-Za-z_]\w*\(", parts[0].value) and isinstance(parts[2], ast.Constant)
                and parts[2].value == ")"):
            saved = list(parts)

            def swap(node=node, saved=saved):
                node.values = [saved[1]] if len(node.values) == 3 else saved
            swap()
            out.append(_Candidate("c-code", node, f"emptied: {parts_text(saved)} -> its operand",
                                  (start, end, ast.unparse(node)), swap))
            swap()
        return out

    def _delete(self, node: ast.If, k: int) -> _Candidate:
        stmt = node.body[k]
        start, end = self.span(stmt)
        kind = type(stmt).__name__.lower()

        def swap(node=node, k=k, stmt=stmt):
            node.body[k] = ast.Pass() if node.body[k] is stmt else stmt
        return _Candidate("delete", stmt, f"{kind} in an if body deleted", (start, end, "pass"), swap)

    # ---- what is not code
    def _is_docstring(self, node: ast.Constant) -> bool:
        return isinstance(node.value, str) and isinstance(self.parents.get(node), ast.Expr)

    def _is_text(self, node: ast.AST) -> bool:
        """Part of the text fusec writes for people: an error message (the
        arguments of an exception or of `diags.error`), a C comment, or outside
        the codegen modules any f-string (messages, the report's reasons)."""
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.JoinedStr) and (self.path not in C_CODE_MODULES or _is_c_comment(node)):
                return True
            if isinstance(node, ast.Call):
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if func == "error" or func.endswith("Error"):
                    return True
            if isinstance(node, (ast.Raise, ast.Assert)):
                return True
            if isinstance(node, ast.stmt):
                return False
        return False

    # ---- realizing
    def realize(self, n: int, c: _Candidate) -> Mutant | None:
        """The candidate as a Mutant whose text edit parses to the intended tree
        (with a fallback edit where the operator edit cannot be made), or None."""
        c.swap()
        try:
            expected = _dump(self.tree)
            edits = [c.edit] if c.edit else []
            if c.fallback_node is not None:
                s, e = self.span(c.fallback_node)
                edits.append((s, e, f"({ast.unparse(c.fallback_node)})"))
        finally:
            c.swap()
        for start, end, after in edits:
            mutated = self.source[:start] + after.encode() + self.source[end:]
            try:
                if _dump(ast.parse(mutated)) != expected:
                    continue
            except SyntaxError:
                continue
            line = self.source[:start].count(b"\n") + 1
            return Mutant(f"{self.path}#{n}", self.path, c.kind, line, c.description, start, end,
                          self.text(start, end), after)
        return None


def _is_c_comment(node: ast.JoinedStr) -> bool:
    first = node.values[0] if node.values else None
    return isinstance(first, ast.Constant) and first.value.lstrip().startswith("//")


def parts_text(parts: list[ast.AST]) -> str:
    return ast.unparse(ast.JoinedStr(values=list(parts)))


def _replace_child(parent: ast.AST, old: ast.AST, new: ast.AST) -> bool:
    for field, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, field, new)
            return True
        if isinstance(value, list) and any(v is old for v in value):
            value[[i for i, v in enumerate(value) if v is old][0]] = new
            return True
    return False


def _c_mutations(text: str, emptying: bool = True) -> list[tuple[str, str]]:
    """The mutants of a string of C code: each swap at each place it matches,
    and (for a one-call format such as `fabsf({0})`) the call emptied to its operand."""
    out = []
    for pattern, replacement, what in _C_SWAPS:
        for m in re.finditer(pattern, text):
            out.append((text[:m.start()] + m.expand(replacement) + text[m.end():], what))
    if emptying:
        m = _ONE_CALL.fullmatch(text)
        if m:
            out.append((m.group(2), f"emptied: {m.group(1)}(...) -> its operand"))
    return out


class _Normalize(ast.NodeTransformer):
    """`-1` parses as minus one; a mutated constant is -1 itself."""

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
                and type(node.operand.value) in (int, float):
            return ast.Constant(-node.operand.value)
        return node


def _dump(tree: ast.AST) -> str:
    return ast.dump(_Normalize().visit(copy.deepcopy(tree)))


def enumerate_mutants(modules: list[str], base: Path) -> dict[str, list[tuple[_Module, int, _Candidate]]]:
    """Every candidate mutant of each module (as in the tree at `base`), numbered in a stable order."""
    out = {}
    for path in modules:
        module = _Module(path, base)
        cands = module.candidates()
        cands.sort(key=lambda c: (c.edit[0] if c.edit else module.span(c.node)[0], c.kind, c.description))
        out[path] = [(module, n, c) for n, c in enumerate(cands)]
    return out


def sample_mutants(candidates: dict, total: int, seed: int) -> list[Mutant]:
    """A seeded random sample, each module's share in proportion to the square
    root of its candidates (so that regs.py's calibration tables, two thirds of
    its candidates, do not crowd out the other modules), at least
    MIN_PER_MODULE; candidates that cannot be realized as a checked text edit
    are replaced by others."""
    rng = random.Random(seed)
    weight = {path: math.sqrt(len(c)) for path, c in candidates.items()}
    out = []
    for path, cands in candidates.items():
        want = min(len(cands), max(MIN_PER_MODULE, round(total * weight[path] / sum(weight.values()))))
        order = list(cands)
        rng.shuffle(order)
        taken = []
        for module, n, c in order:
            if len(taken) == want:
                break
            mutant = module.realize(n, c)
            if mutant is not None:
                taken.append(mutant)
        out += sorted(taken, key=lambda m: m.start)
    return out


def find_mutant(candidates: dict, mutant_id: str) -> Mutant:
    path, _, n = mutant_id.rpartition("#")
    module, _, c = candidates[path][int(n)]
    mutant = module.realize(int(n), c)
    if mutant is None:
        raise SystemExit(f"{mutant_id}: cannot be realized as a checked text edit")
    return mutant


# ---------------------------------------------------------------------------
# Running


@dataclasses.dataclass
class Result:
    mutant: Mutant
    status: str          # killed | survived | timeout | error
    seconds: float
    killed_by: str = ""  # the first failing test (or collection error)
    confirm: str = ""    # survivors, with --confirm: killed | survived | timeout by the rest of the suite
    confirm_killed_by: str = ""


def make_tree(dest: Path, base: Path) -> None:
    """A copy of the tree at `base` (what a mutant is applied to)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in TREE:
        src = base / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)


def snapshot(dest: Path, rev: str | None) -> Path:
    """The tree the run works from, fixed at its start: the working tree, or a
    commit (`--at`: its tests, before the ones added since, say)."""
    dest.mkdir()
    if rev is None:
        make_tree(dest, ROOT)
        return dest
    archive = subprocess.run(["git", "archive", "--format=tar", rev, *TREE], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def pytest_command(files: list[str], deselect: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0", *files]
    return cmd + (["-k", deselect] if deselect else [])


# The pytest processes running now: ended with the run, however it ends.
_RUNNING: set[subprocess.Popen] = set()
_STOPPING = threading.Event()


def _end_running() -> None:
    _STOPPING.set()
    for proc in list(_RUNNING):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_pytest(tree: Path, cmd: list[str], timeout: float, cache: Path) -> tuple[str, float, str, str]:
    """(status, seconds, first failing test, output tail) of `cmd` run in `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", FUSEC_CACHE_DIR=str(cache))
    env.pop("FUSEC_DEBUG", None)
    if _STOPPING.is_set():
        return "error", 0.0, "the run was stopped", ""
    started = time.monotonic()
    # A session of its own, so that a timeout ends the compilers pytest started too.
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    _RUNNING.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "timeout", time.monotonic() - started, "", out.decode(errors="replace")[-2000:]
    finally:
        _RUNNING.discard(proc)
    seconds = time.monotonic() - started
    text = out.decode(errors="replace")
    if proc.returncode == 0:
        return "survived", seconds, "", text[-2000:]
    if proc.returncode in (1, 2, 3):  # tests failed; interrupted (a collection error); internal error
        m = re.search(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
        return "killed", seconds, m.group(1) if m else f"pytest exit {proc.returncode}", text[-2000:]
    return "error", seconds, f"pytest exit {proc.returncode}", text[-4000:]


@dataclasses.dataclass(frozen=True)
class Suite:
    """The tests a mutant runs against: files (or test ids), a `-k` deselection,
    and whether each module's FIRST files run first."""

    files: tuple[str, ...]
    deselect: str | None = None
    ordered: bool = False

    def command(self, mutant: Mutant | None = None) -> list[str]:
        files = list(self.files)
        if self.ordered and mutant is not None:
            first = [f for f in FIRST.get(mutant.module, []) if f in files]
            files = first + [f for f in files if f not in first]
        if mutant is not None and mutant.kind == "named":
            files = [f for f in files if f not in GOLDEN_FILES]
        return pytest_command(files, self.deselect)


SUBSET = Suite(tuple(SUBSET_FILES), SUBSET_DESELECT, ordered=True)


def rest_of_suite() -> tuple[list[Suite], str]:
    """What the subset leaves out: the files not in it, and its deselected tests."""
    others = tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                          if str(p.relative_to(ROOT)) not in SUBSET_FILES))
    return [Suite(others), Suite(tuple(SUBSET_FILES), f"not ({SUBSET_DESELECT})")], \
        f"{' '.join(p.rsplit('/', 1)[-1] for p in others)}; and in the subset: not ({SUBSET_DESELECT})"


def run_mutant(mutant: Mutant, suite: Suite, base: Path, workdir: Path, cache: Path, timeout: float,
               confirm: bool) -> Result:
    with tempfile.TemporaryDirectory(prefix="mutant-", dir=workdir) as tmp:
        tree = Path(tmp)
        make_tree(tree, base)
        target = tree / mutant.module
        target.write_bytes(mutant.apply(target.read_bytes()))
        status, seconds, killed_by, _ = run_pytest(tree, suite.command(mutant), timeout, cache)
        result = Result(mutant, status, round(seconds, 1), killed_by)
        if confirm and status == "survived":
            for rest in rest_of_suite()[0]:
                result.confirm, more, result.confirm_killed_by, _ = run_pytest(tree, rest.command(mutant),
                                                                               CONFIRM_TIMEOUT, cache)
                result.seconds = round(result.seconds + more, 1)
                if result.confirm != "survived":
                    break
        return result


def baseline(suite: Suite, base: Path, workdir: Path, cache: Path) -> float:
    """The unmutated tree passes the suite, importing fusec from the copy; its time."""
    with tempfile.TemporaryDirectory(prefix="baseline-", dir=workdir) as tmp:
        tree = Path(tmp)
        make_tree(tree, base)
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
        where = subprocess.run([sys.executable, "-c", "import fusec; print(fusec.__file__)"], cwd=tree, env=env,
                               capture_output=True, text=True).stdout.strip()
        if not where.startswith(str(tree)):
            raise SystemExit(f"the copy's fusec is not the one imported ({where}): mutants would not be tested")
        status, seconds, _, tail = run_pytest(tree, suite.command(), 1800, cache)
        if status != "survived":
            raise SystemExit(f"the unmutated tree fails the tests:\n{tail}")
        return seconds


def run_all(mutants: list[Mutant], suite: Suite, base: Path, jobs: int, timeout: float, confirm: bool,
            workdir: Path, cache: Path, log) -> list[Result]:
    results = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = {pool.submit(run_mutant, m, suite, base, workdir, cache, timeout, confirm): m for m in mutants}
        for done in concurrent.futures.as_completed(futures):
            r = done.result()
            results.append(r)
            extra = f" (rest of suite: {r.confirm} {r.confirm_killed_by})" if r.confirm else ""
            log(f"[{len(results)}/{len(mutants)}] {r.status:8} {r.seconds:6.1f}s {r.mutant.id} "
                f"{r.mutant.description} {r.killed_by}{extra}")
    finally:  # interrupted: nothing more starts, and what runs is ended
        pool.shutdown(wait=False, cancel_futures=True)
        _end_running()
    order = {m.id: k for k, m in enumerate(mutants)}
    return sorted(results, key=lambda r: order[r.mutant.id])


# ---------------------------------------------------------------------------
# Reporting


def final_status(r: Result) -> str:
    """killed, survived or timeout, after the rest of the suite where it ran."""
    if r.status == "survived" and r.confirm:
        return r.confirm
    return r.status


def table(results: list[Result]) -> list[dict]:
    rows = []
    modules = list(dict.fromkeys(r.mutant.module for r in results))
    for module in modules + ["total"]:
        rs = [r for r in results if module in ("total", r.mutant.module)]
        killed = sum(final_status(r) == "killed" for r in rs)
        timeout = sum(final_status(r) == "timeout" for r in rs)
        row = {"module": module, "mutants": len(rs), "killed": killed,
               "survived": sum(final_status(r) == "survived" for r in rs), "timed_out": timeout,
               "errors": sum(final_status(r) == "error" for r in rs),
               "survived_subset": sum(r.status == "survived" for r in rs)}
        # A timed-out mutant is counted as detected (the suite did not pass), and listed apart.
        row["kill_rate"] = round((killed + timeout) / len(rs), 3) if rs else None
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| module | mutants | killed | survived | timed out | kill rate |", "|---|---|---|---|---|---|"]
    for r in rows:
        rate = f"{100 * r['kill_rate']:.1f} %" if r["kill_rate"] is not None else "-"
        lines.append(f"| {r['module']} | {r['mutants']} | {r['killed']} | {r['survived']} | {r['timed_out']} | "
                     f"{rate} |")
    return "\n".join(lines)


def result_json(r: Result, base: Path) -> dict:
    m = r.mutant
    out = {"id": m.id, "module": m.module, "kind": m.kind, "line": m.line, "description": m.description,
           "status": final_status(r), "subset_status": r.status, "seconds": r.seconds, "killed_by": r.killed_by,
           "edit": {"start": m.start, "end": m.end, "before": m.before, "after": m.after}}
    if m.why:
        out["why"] = m.why
    if r.confirm:
        out["rest_of_suite"] = {"status": r.confirm, "killed_by": r.confirm_killed_by}
    if final_status(r) != "killed" or m.kind == "named":
        out["diff"] = m.diff((base / m.module).read_bytes())
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="fusec-mutation-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the cleanup below runs
    try:
        return run(args, argv, workdir)
    finally:
        _end_running()
        shutil.rmtree(workdir, ignore_errors=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=int, default=300, help="mutants to sample over the modules (default 300)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    ap.add_argument("--timeout", type=float, help="seconds a mutant's tests may take (default 3x the baseline)")
    ap.add_argument("--modules", nargs="+", default=TARGETS, metavar="PATH")
    ap.add_argument("--named-only", action="store_true", help="only the issue's named mutants")
    ap.add_argument("--no-named", action="store_true", help="leave the named mutants out")
    ap.add_argument("--confirm", action="store_true", help="run survivors against the rest of the suite too")
    ap.add_argument("--rerun", metavar="JSON", help="re-run the survivors (and timeouts) of an earlier run")
    ap.add_argument("--ids", nargs="+", default=[], metavar="ID", help="run these mutants only")
    ap.add_argument("--tests", nargs="+", metavar="TEST", help="run these tests (files or ids) instead of the subset")
    ap.add_argument("--at", metavar="REV", help="mutate and test the tree of this commit (default: the working tree)")
    ap.add_argument("--cache", metavar="DIR", help="FUSEC_CACHE_DIR of the mutants' tests, kept between runs "
                                                    "(default: a fresh one, removed at the end)")
    ap.add_argument("--list", action="store_true", help="count the mutants per module and kind, run nothing")
    ap.add_argument("--show", metavar="ID", help="print one mutant's diff, run nothing")
    ap.add_argument("--json", metavar="OUT", help="write the results here")
    return ap.parse_args(argv)


def run(args: argparse.Namespace, argv: list[str] | None, workdir: Path) -> int:
    base = snapshot(workdir / "base", args.at)
    candidates = enumerate_mutants(args.modules, base)
    if args.list:
        for path, cands in candidates.items():
            kinds: dict[str, int] = {}
            for _, _, c in cands:
                kinds[c.kind] = kinds.get(c.kind, 0) + 1
            print(f"{path}: {len(cands)} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})")
        print(f"named: {len(NAMED)}")
        return 0
    named = [] if args.no_named else named_mutants(base)
    if args.show:
        mutant = next((m for m in named if m.id == args.show), None) or find_mutant(candidates, args.show)
        print(mutant.diff((base / mutant.module).read_bytes()))
        return 0
    if args.rerun:
        earlier = json.loads(Path(args.rerun).read_text())
        args.ids = [m["id"] for m in earlier["mutants"] if m["status"] != "killed"]
    if args.ids:
        mutants = [m for m in named if m.id in args.ids]
        mutants += [find_mutant(candidates, i) for i in args.ids if not i.startswith("named:")]
    elif args.named_only:
        mutants = named
    else:
        mutants = named + sample_mutants(candidates, args.sample, args.seed)

    cache = Path(args.cache).resolve() if args.cache else workdir / "cache"
    suite = Suite(tuple(args.tests)) if args.tests else SUBSET
    base_s = baseline(suite, base, workdir, cache)
    timeout = args.timeout or max(120.0, 3 * base_s)
    print(f"baseline: the tests pass in {base_s:.0f} s; {len(mutants)} mutants, {args.jobs} at a time, "
          f"timeout {timeout:.0f} s", flush=True)
    started = time.monotonic()
    results = run_all(mutants, suite, base, args.jobs, timeout, args.confirm, workdir, cache,
                      lambda text: print(text, flush=True))
    elapsed = time.monotonic() - started

    sampled = [r for r in results if r.mutant.kind != "named"]
    rows = table(sampled) if sampled else []
    print()
    if rows:
        print(markdown(rows))
    for r in results:
        if r.mutant.kind == "named":
            print(f"named {r.mutant.description}: {final_status(r)} by {r.killed_by or r.confirm_killed_by or '-'}")
    for r in results:
        if final_status(r) != "killed":
            print(f"\n{final_status(r)}: {r.mutant.id} ({r.mutant.description})\n"
                  f"{r.mutant.diff((base / r.mutant.module).read_bytes())}")
    if args.json:
        rev = args.at or "HEAD"
        out = {
            "command": " ".join(["python", "benchmarks/mutation_run.py", *(sys.argv[1:] if argv is None else argv)]),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "tree": "the working tree (on this commit)" if args.at is None else f"commit {args.at}",
            "commit": git_commit(rev),
            "seed": args.seed, "sample": args.sample, "jobs": args.jobs, "timeout_s": timeout,
            "baseline_s": round(base_s, 1), "elapsed_s": round(elapsed, 1),
            "tests": {"files": list(suite.files), "deselect": suite.deselect, "named_without": sorted(GOLDEN_FILES)},
            "rest_of_suite": rest_of_suite()[1] if args.confirm else None,
            "candidates": {p: len(c) for p, c in candidates.items()},
            "table": rows,
            "mutants": [result_json(r, base) for r in results],
        }
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def git_commit(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
