"""Type checking of scalar expressions: syntax.Expr -> SSA instructions.

Literals are weak: a subexpression made only of literals and named
constants is folded to its exact value (`fusec.frontend.literals`) and stays
`Weak` until it meets a strong operand; only then is its value checked
against that type and emitted as a constant (`materialize`). Errors are
collected; a failed subexpression becomes POISON so that one mistake is
reported once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Union

from fusec.errors import Diagnostics, Loc
from fusec.frontend import literals, syntax
from fusec.frontend.builtins import (
    ARITH_OPS,
    BOOL_CONSTANTS,
    BUILTINS,
    COLUMN_REDUCTIONS,
    COMPARE_OPS,
    FLOAT_CONSTANTS,
    LOGIC_OPS,
    POSITIONS,
    ROW_REDUCTIONS,
    unknown_function,
)
from fusec.ir.program import BodyBuilder, Instr, StageFn
from fusec.types import BOOL, BY_NAME, DEFAULT_FLOAT, DEFAULT_INT, F32, INT_RANGE, ScalarType, can_convert, promote

# Instructions whose f16/bf16 value is already rounded to its type (a "const"
# is checked by its value: as an operand of f16 arithmetic it holds f32 precision).
_EXACT_OPS = ("load", "cast", "arg", "call")


@dataclass(frozen=True, slots=True)
class Strong:
    id: int
    type: ScalarType | None  # None: poisoned by an earlier error


@dataclass(frozen=True, slots=True)
class Weak:
    """A literal, or an expression of literals alone, folded to its exact value."""

    value: object  # an int (kind "int"); a Fraction, or a float for ±0, ±inf, NaN (kind "float")
    kind: str  # "int" | "float"
    node: syntax.Expr  # where it was written, for messages


Typed = Union[Strong, Weak]
POISON = Strong(-1, None)


def default_type(kind: str) -> ScalarType:
    return DEFAULT_FLOAT if kind == "float" else DEFAULT_INT


def start_loc(node: syntax.Expr) -> Loc:
    """The location of an expression's first token (a Binary's own is its operator's)."""
    while isinstance(node, syntax.Binary):
        node = node.left
    return node.loc


def describe(weak: Weak) -> str:
    node = weak.node
    sign = ""
    if isinstance(node, syntax.Unary) and node.op == "-" and isinstance(node.operand, syntax.Num):
        node, sign = node.operand, "-"
    if isinstance(node, syntax.Num):
        return f"{'float' if node.is_float else 'integer'} literal {sign}{syntax.abbreviate(node.text)}"
    return f"the literal expression's value {literals.show(weak.value)}"


class ExprChecker:
    """Checks expressions of one body (a stage, or one pipeline statement).

    `lookup(name)` resolves a name to a Strong value (or None); `stages` are
    the already-checked stages a call may name; `reduce(call)` checks a row
    reduction and gives its value (None: a stage body, which has no rows).
    """

    def __init__(self, builder: BodyBuilder, diags: Diagnostics,
                 lookup: Callable[[str, Loc], Strong | None], stages: Mapping[str, StageFn | None],
                 reduce: Callable[[syntax.Call], Typed] | None = None,
                 position: Callable[[syntax.Call], Typed] | None = None):
        self.b = builder
        self.diags = diags
        self.lookup = lookup
        self.stages = stages
        self.reduce = reduce
        self.position = position

    # ---- helpers
    def error(self, loc: Loc, message: str) -> Strong:
        self.diags.error(loc, message)
        return POISON

    def emit(self, op: str, args: tuple[int, ...], type_: ScalarType, loc: Loc, attr=None) -> Strong:
        return Strong(self.b.emit(Instr(op, args, type_, attr, loc=loc)), type_)

    def strong(self, value: Typed) -> Strong:
        """A weak value on its own takes the default type (i32 or f32)."""
        if isinstance(value, Weak):
            return self.materialize(value, default_type(value.kind))
        return value

    # ---- conversions
    def convert(self, value: Typed, to: ScalarType, loc: Loc, what: str, store: bool = False) -> Strong:
        """Implicit conversion: operand promotion, or (store=True) an assignment,
        stage argument or stage result, which also rounds an f16/bf16 value."""
        if isinstance(value, Weak):
            if value.kind == "float" and not to.is_float:
                return self.error(loc, f"{what}: a float literal cannot be used as {to}; write {to}(...)")
            if to.is_bool:
                return self.error(loc, f"{what}: a number cannot be used as bool; write true, false or a "
                                       "comparison")
            return self.materialize(value, to, "store" if store else "operand")
        if value.type is None:
            return POISON
        if value.type == to:
            return self._round_stored(value, to, loc) if store and to.compute != to else value
        if not can_convert(value.type, to):
            return self.error(loc, f"{what}: cannot convert {value.type} to {to} implicitly; write {to}(...)")
        return self.emit("cast", (value.id,), to, loc)

    def _round_stored(self, value: Strong, to: ScalarType, loc: Loc) -> Strong:
        """An f16/bf16 value as it is stored: rounded to its type."""
        ins = self.b.instrs[value.id]
        if ins.op == "const":
            rounded = literals.round_to(literals.from_float(ins.attr), to.name)
            return value if rounded == ins.attr else self.emit("const", (), to, loc, rounded)
        if ins.op in _EXACT_OPS:
            return value
        return self.emit("cast", (value.id,), to, loc)

    def cast(self, value: Typed, to: ScalarType, loc: Loc) -> Strong:
        """An explicit cast `T(x)`: any scalar type to any other."""
        if isinstance(value, Weak):
            return self._cast_literal(value, to)
        if value.type is None:
            return POISON
        if value.type == to and to.compute == to:
            return value
        return self.emit("cast", (value.id,), to, loc)

    def _cast_literal(self, weak: Weak, to: ScalarType) -> Strong:
        """`T(literal)` converts the literal's exact value, as the README's casts say:
        to a float type it rounds once (and may give inf: `f16(70000.0)`)."""
        value, loc = weak.value, start_loc(weak.node)
        if to.is_bool:
            return self.emit("const", (), BOOL, loc, bool(value != 0))
        if to.is_float:
            return self.emit("const", (), to, loc, literals.round_to(literals.as_float(value), to.name))
        if weak.kind == "int":
            return self.materialize(weak, to, "cast")
        return self.emit("const", (), to, loc, literals.saturate(value, *INT_RANGE[to]))

    def materialize(self, weak: Weak, to: ScalarType, mode: str = "operand") -> Strong:
        """A weak value in a strong type: as an operand (f16/bf16 keep f32 precision
        there, as PyTorch computes a half tensor with a float scalar), or rounded
        to the type itself where it is stored ("store", "cast")."""
        value, loc = weak.value, start_loc(weak.node)
        if to.is_int:
            lo, hi = INT_RANGE[to]
            if not lo <= value <= hi:
                return self.error(loc, f"{describe(weak)} does not fit {to} (range {lo} to {hi})")
            return self.emit("const", (), to, loc, int(value))
        if to.is_bool:
            return self.emit("const", (), BOOL, loc, bool(value))
        fmt = to.compute.name if mode == "operand" else to.name
        rounded = literals.round_to(literals.as_float(value), fmt)
        if math.isinf(rounded) and not (isinstance(value, float) and math.isinf(value)):
            where = str(to) if fmt == to.name else f"{to} arithmetic (done in {fmt})"
            return self.error(loc, f"{describe(weak)} is out of range for {where}: it rounds to infinity "
                                   f"(the largest {fmt} is {literals.largest(fmt):.8g})")
        return self.emit("const", (), to, loc, rounded)

    def join(self, a: Typed, b: Typed, loc: Loc, what: str) -> ScalarType | None:
        """The type two operands are converted to."""
        if isinstance(a, Weak) and isinstance(b, Weak):
            return default_type("float" if "float" in (a.kind, b.kind) else "int")
        if isinstance(a, Weak):
            a, b = b, a
        if a.type is None or (isinstance(b, Strong) and b.type is None):
            return None
        if isinstance(b, Weak):
            if b.kind == "float" and not a.type.is_float:
                return DEFAULT_FLOAT
            return DEFAULT_INT if a.type.is_bool else a.type
        common = promote(a.type, b.type)
        if common is None:
            self.error(loc, f"{what}: {a.type} and {b.type} have no common type; cast one of them")
        return common

    # ---- expressions
    def check(self, node: syntax.Expr) -> Typed:
        method = getattr(self, "_" + type(node).__name__.lower())
        return method(node)

    def _num(self, node: syntax.Num) -> Typed:
        if node.is_float:
            try:
                return Weak(literals.parse_float(node.text), "float", node)
            except literals.LiteralError as exc:
                return self.error(node.loc, str(exc))
        value = syntax.parse_int(node.text)
        if value > INT_RANGE[BY_NAME["u64"]][1]:
            return self.error(node.loc, f"integer literal {syntax.abbreviate(node.text)} is too large (more than 64 bits)")
        return Weak(value, "int", node)

    def _name(self, node: syntax.Name) -> Typed:
        found = self.lookup(node.id, node.loc)
        if found is not None:
            return found
        if node.id in FLOAT_CONSTANTS:
            return Weak(FLOAT_CONSTANTS[node.id], "float", node)
        if node.id in BOOL_CONSTANTS:
            return self.emit("const", (), BOOL, node.loc, BOOL_CONSTANTS[node.id])
        return self.error(node.loc, f"unknown name '{node.id}'")

    def _unary(self, node: syntax.Unary) -> Typed:
        operand = self.check(node.operand)
        if isinstance(operand, Weak):
            if node.op == "!":
                return self.error(node.loc, "operand of '!' must be bool, not a number")
            return Weak(literals.negate(operand.value) if node.op == "-" else operand.value, operand.kind, node)
        if operand.type is None:
            return POISON
        if node.op == "!":
            if not operand.type.is_bool:
                return self.error(node.loc, f"operand of '!' must be bool, got {operand.type}")
            return self.emit("not", (operand.id,), BOOL, node.loc)
        if operand.type.is_bool:
            return self.error(node.loc, f"unary '{node.op}' needs a number, got bool")
        return operand if node.op == "+" else self.emit("neg", (operand.id,), operand.type, node.loc)

    def _binary(self, node: syntax.Binary) -> Typed:
        left, right = self.check(node.left), self.check(node.right)
        if node.op in LOGIC_OPS:
            for side in (left, right):
                if isinstance(side, Weak) or (side.type is not None and not side.type.is_bool):
                    shown = "a number" if isinstance(side, Weak) else str(side.type)
                    return self.error(node.loc, f"operands of '{node.op}' must be bool, got {shown}")
            if left.type is None or right.type is None:
                return POISON
            return self.emit(LOGIC_OPS[node.op], (left.id, right.id), BOOL, node.loc)
        if node.op in ARITH_OPS and isinstance(left, Weak) and isinstance(right, Weak):
            try:
                value = literals.fold(ARITH_OPS[node.op], left.value, right.value)
            except literals.LiteralError as exc:
                return self.error(node.loc, str(exc))
            return Weak(value, "int" if left.kind == right.kind == "int" else "float", node)
        what = f"operands of '{node.op}'"
        common = self.join(left, right, node.loc, what)
        if common is None:
            return POISON
        if node.op in ARITH_OPS and common.is_bool:
            return self.error(node.loc, f"'{node.op}' on bool values; convert them with i32(...) first")
        a, b = self.convert(left, common, node.loc, what), self.convert(right, common, node.loc, what)
        if a.type is None or b.type is None:
            return POISON
        if node.op in COMPARE_OPS:
            return self.emit(COMPARE_OPS[node.op], (a.id, b.id), BOOL, node.loc)
        return self.emit(ARITH_OPS[node.op], (a.id, b.id), common, node.loc)

    def _select(self, cond: Typed, then: Typed, other: Typed, loc: Loc, what: str) -> Strong:
        if isinstance(cond, Weak) or (cond.type is not None and not cond.type.is_bool):
            shown = "a number" if isinstance(cond, Weak) else str(cond.type)
            return self.error(loc, f"condition of {what} must be bool, got {shown}")
        common = self.join(then, other, loc, f"branches of {what}")
        if common is None or cond.type is None:
            return POISON
        a = self.convert(then, common, loc, f"branches of {what}")
        b = self.convert(other, common, loc, f"branches of {what}")
        if a.type is None or b.type is None:
            return POISON
        return self.emit("select", (cond.id, a.id, b.id), common, loc)

    def _ternary(self, node: syntax.Ternary) -> Typed:
        return self._select(self.check(node.cond), self.check(node.then), self.check(node.other),
                            node.loc, "'? :'")

    def _call(self, node: syntax.Call) -> Typed:
        if node.func in self.stages:
            if self.stages[node.func] is None:  # it failed to check; already reported
                return POISON
            results = self.call_stage(node)
            if results is None:
                return POISON
            if len(results) != 1:
                return self.error(node.loc, f"stage '{node.func}' returns {len(results)} values; "
                                            f"assign them with `a, b = {node.func}(...);`")
            return results[0]
        if node.func in BY_NAME:
            if len(node.args) != 1:
                return self.error(node.loc, f"cast {node.func}(...) takes 1 argument, got {len(node.args)}")
            return self.cast(self.check(node.args[0]), BY_NAME[node.func], node.loc)
        if node.func in ROW_REDUCTIONS or node.func in COLUMN_REDUCTIONS:
            if self.reduce is None:
                what = "the rows" if node.func in ROW_REDUCTIONS else "over the first axis"
                return self.error(node.loc, f"{node.func}() reduces {what} of an array: it belongs in a pipeline "
                                            "statement; a stage computes one element")
            return self.reduce(node)
        if node.func in POSITIONS:
            if self.position is None:
                return self.error(node.loc, f"{node.func}() is an element's place in an array: it belongs in a "
                                            "pipeline statement; a stage computes one element")
            return self.position(node)
        builtin = BUILTINS.get(node.func)
        if builtin is None:
            if self.lookup(node.func, node.loc) is not None:
                return self.error(node.loc, f"'{node.func}' is a value, not a function")
            return self.error(node.loc, unknown_function(node.func, [*self.stages, *BY_NAME]))
        if len(node.args) != builtin.arity:
            # max(x) or min(x) reads as a reduction: say how one is written.
            reduction = (f" (elementwise, of its arguments; the {node.func}imum of each row is "
                         f"row_{node.func}(x))" if node.func in ("min", "max") and len(node.args) == 1 else "")
            return self.error(node.loc, f"{node.func}() takes {builtin.arity} argument"
                                        f"{'s' if builtin.arity > 1 else ''}, got {len(node.args)}{reduction}")
        args = [self.check(a) for a in node.args]
        if builtin.rule == "select":
            return self._select(*args, node.loc, "where()")
        return self._builtin(node, args, builtin.rule)

    def _builtin(self, node: syntax.Call, args: list[Typed], rule: str) -> Strong:
        what = f"arguments of {node.func}()"
        # A literal takes the type of the typed arguments wherever it stands: min(1, x) as min(x, 1).
        strong = [a for a in args if isinstance(a, Strong)]
        if any(a.type is None for a in strong):
            return POISON
        if strong:
            common_type = strong[0].type
        else:
            common_type = default_type("float" if any(a.kind == "float" for a in args) else "int")
        for other in args:
            common_type = self.join(Strong(0, common_type), other, node.loc, what)
            if common_type is None:
                return POISON
        if rule == "float" and not common_type.is_float:
            common_type = F32
        elif common_type.is_bool:
            return self.error(node.loc, f"{node.func}() needs numbers, got bool")
        converted = [self.convert(a, common_type, node.loc, what) for a in args]
        if any(c.type is None for c in converted):
            return POISON
        if rule == "round" and common_type.is_int:
            return converted[0]
        if rule == "class":
            if common_type.is_int:
                return self.emit("const", (), BOOL, node.loc, False)
            return self.emit(node.func, (converted[0].id,), BOOL, node.loc)
        return self.emit(node.func, tuple(c.id for c in converted), common_type, node.loc)

    def call_stage(self, node: syntax.Call) -> list[Strong] | None:
        """A call of a user stage: one "call" instruction per result."""
        stage = self.stages[node.func]
        if len(node.args) != len(stage.params):
            self.error(node.loc, f"stage '{stage.name}' takes {len(stage.params)} argument"
                                 f"{'s' if len(stage.params) != 1 else ''}, got {len(node.args)}")
            return None
        args = []
        for i, (arg, (pname, ptype)) in enumerate(zip(node.args, stage.params)):
            value = self.convert(self.check(arg), ptype, arg.loc,
                                 f"argument {i + 1} ('{pname}') of stage '{stage.name}'", store=True)
            args.append(value)
        if any(a.type is None for a in args):
            return None
        ids = tuple(a.id for a in args)
        return [self.emit("call", ids, rtype, node.loc, (stage.name, k))
                for k, (_, rtype) in enumerate(stage.results)]


def resolve_type(ref: syntax.TypeRef, diags: Diagnostics) -> ScalarType | None:
    found = BY_NAME.get(ref.name)
    if found is None:
        diags.error(ref.loc, f"unknown type '{ref.name}' (types: {', '.join(BY_NAME)})")
    return found


def assigned_values(stmt: syntax.Assign, exprs: ExprChecker) -> list[Typed]:
    """Values for the targets of `a = e;` or `a, b = stage(...);` (POISON on error)."""
    n = len(stmt.targets)
    if n == 1:
        return [exprs.check(stmt.value)]
    if not (isinstance(stmt.value, syntax.Call) and stmt.value.func in exprs.stages):
        exprs.error(stmt.loc, f"{n} targets need a call of a stage with {n} results on the right")
        return [POISON] * n
    stage = exprs.stages[stmt.value.func]
    if stage is None:
        return [POISON] * n
    if len(stage.results) != n:
        exprs.error(stmt.value.loc, f"stage '{stage.name}' returns {len(stage.results)} "
                                    f"value{'s' if len(stage.results) != 1 else ''}, but there are {n} targets")
        return [POISON] * n
    return exprs.call_stage(stmt.value) or [POISON] * n
