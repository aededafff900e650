"""Type checking of pipelines: statements, targets, shapes and `repeat` blocks.

Each statement becomes an `ir.Apply` whose iteration space is the broadcast
shape of the arrays it reads (or the shape of the declared array it writes).
Named dims never broadcast; two different names that meet in a broadcast must
be equal at call time (`ir.DimEq`); only a literal 1 broadcasts.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from fusec.errors import Diagnostics, Loc
from fusec.frontend import syntax
from fusec.frontend.builtins import COLUMN_REDUCTIONS, ROW_REDUCTIONS
from fusec.frontend.check_expr import (
    POISON,
    ExprChecker,
    Strong,
    Typed,
    Weak,
    assigned_values,
    default_type,
    resolve_type,
)
from fusec.ir.program import (
    Apply,
    BodyBuilder,
    Dim,
    DimEq,
    Instr,
    Pipeline,
    Repeat,
    Shape,
    Slot,
    StageFn,
    Stmt,
    fmt_shape,
    reduced_shape,
)
from fusec.types import F32, F64, I64

MAX_DIM = 1 << 62
# Repeat counts are signed 64-bit in emitted code (and in every backend's loop).
MAX_REPEAT = (1 << 63) - 1


class _Loop:
    """A `repeat` being checked: what reading after it needs of its count."""

    def __init__(self, count: int | str | None, loc: Loc):
        self.count = count
        self.loc = loc
        self.runs = isinstance(count, int) and count >= 1  # its body surely runs
        self.unassigned_if_zero: dict[str, None] = {}  # ordered set: outputs read after it that only it assigns


class Dims:
    """Union-find over dims: names that met in a broadcast must be equal."""

    def __init__(self, diags: Diagnostics):
        self.parent: dict[Dim, Dim] = {}
        self.eqs: list[DimEq] = []
        self.diags = diags

    def find(self, d: Dim) -> Dim:
        while self.parent.get(d, d) != d:
            d = self.parent[d]
        return d

    def union(self, a: Dim, b: Dim, loc: Loc) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        if isinstance(ra, int) and isinstance(rb, int):
            return False
        if isinstance(ra, int):  # a literal represents its class
            ra, rb = rb, ra
        self.parent[ra] = rb
        self.eqs.append(DimEq(a, b, loc=loc))
        return True

    def broadcast(self, shapes: list[Shape], loc: Loc) -> Shape | None:
        rank = max((len(s) for s in shapes), default=0)
        out: list[Dim] = []
        for pos in range(1, rank + 1):
            dims = [self.find(s[-pos]) for s in shapes if len(s) >= pos]
            real = [d for d in dims if d != 1]
            for d in real[1:]:
                if not self.union(real[0], d, loc):
                    shown = " and ".join(fmt_shape(s) for s in shapes)
                    self.diags.error(loc, f"shapes {shown} cannot broadcast ({real[0]} vs {d})")
                    return None
            out.append(self.find(real[0]) if real else 1)
        return tuple(reversed(out))


def fmt_slot(slot: Slot) -> str:
    return f"{slot.type}{fmt_shape(slot.shape) if slot.shape is not None else ''}"


class PipelineChecker:
    def __init__(self, d: syntax.PipelineDef, stages: dict[str, StageFn], diags: Diagnostics):
        self.d, self.stages, self.diags = d, stages, diags
        self.dims = Dims(diags)
        self.current: dict[str, Slot] = {}   # user name -> slot it names now
        self.slots: list[Slot] = []
        self.assigned: set[str] = set()       # outputs surely assigned (not only in a loop that may not run)
        # Outputs assigned so far only inside loops that may run 0 times: those loops.
        self.maybe_assigned: dict[str, tuple[_Loop, ...]] = {}
        self.loops: list[_Loop] = []          # the enclosing repeats
        self.loop_of: dict[int, _Loop] = {}   # id(ir Repeat) -> its loop record
        self.repeat_outer: list[set[str]] = []  # names visible before each enclosing repeat
        self.poisoned: set[str] = set()  # temps whose statement failed: reading them is not a new error
        self.pending: list[Apply] = []   # row reductions of the statement being checked, to run before it

    def check(self) -> Pipeline:
        d = self.d
        params = [s for s in (self._param(p, "param") for p in d.params) if s]
        outputs = [s for s in (self._param(p, "out") for p in d.outputs) if s]
        body = self._stmts(d.body)
        for out in outputs:
            if out.name in self.maybe_assigned:
                self._needs_loops_to_run(out.name, self.maybe_assigned[out.name], out.loc)
            elif out.name not in self.assigned:
                self.diags.error(out.loc, f"output '{out.name}' is never assigned")
        self._check_output_dims(params)
        canon = {s.name: self._canonical(s) for s in self.slots}
        return Pipeline(d.name, tuple(params), tuple(outputs), tuple(canon.values()),
                        self._canonical_stmts(body), tuple(self.dims.eqs), loc=d.loc)

    # ---- declarations
    def _param(self, p: syntax.Param, kind: str) -> Slot | None:
        scalar_type = resolve_type(p.type, self.diags)
        if p.name in self.current:
            self.diags.error(p.loc, f"duplicate name '{p.name}' in pipeline '{self.d.name}'")
            return None
        if p.inout and kind == "out":
            self.diags.error(p.loc, f"'inout' is for a parameter the pipeline updates in place; output "
                                    f"'{p.name}' is written by it: drop 'inout' here, or declare `inout "
                                    f"{p.name}: ...` among the parameters")
        if p.type.dims is None:
            if p.inout and kind != "out":
                self.diags.error(p.loc, f"'inout' needs an array; '{p.name}' is a scalar (a scalar parameter "
                                        "cannot be assigned)")
            if kind == "out":
                self.diags.error(p.loc, f"output '{p.name}' must be an array: give it dims, e.g. f32[n]")
                return None
        for dim in p.type.dims or ():
            if isinstance(dim.value, int) and dim.value > MAX_DIM:
                shown = f" {dim.value}" if dim.value < syntax.TOO_LARGE else ""
                self.diags.error(dim.loc, f"dim{shown} is too large (at most 2^62)")
        if scalar_type is None:
            self.poisoned.add(p.name)
            return None
        shape = None if p.type.dims is None else tuple(dim.value for dim in p.type.dims)
        # The role follows from the kind of declaration, whatever mode was (wrongly) written.
        role = "out" if kind == "out" else "scalar" if shape is None else "inout" if p.inout else "in"
        slot = Slot(p.name, scalar_type, shape, role, loc=p.loc)
        self.current[p.name] = slot
        self.slots.append(slot)
        return slot

    def _check_output_dims(self, params: list[Slot]) -> None:
        # By name: at call time an output's dims are read off the input arrays.
        bound = {d for p in params if p.shape for d in p.shape}
        for out_decl in self.d.outputs:
            for dim in out_decl.type.dims or ():
                if isinstance(dim.value, str) and dim.value not in bound:
                    self.diags.error(dim.loc, f"dim '{dim.value}' of output '{out_decl.name}' is not "
                                              "bound by any input array")

    # ---- statements
    def _stmts(self, stmts) -> list[Stmt]:
        out = []
        for stmt in stmts:
            checked = self._repeat(stmt) if isinstance(stmt, syntax.RepeatBlock) else self._apply(stmt)
            if checked is not None:
                out += self.pending
                out.append(checked)
            elif isinstance(stmt, syntax.Assign):
                self._poison_targets(stmt)
            self.pending = []
        return out

    def _poison_targets(self, stmt: syntax.Assign) -> None:
        """After a failed statement its targets count as assigned, so errors do not cascade."""
        for target in stmt.targets:
            slot = self.current.get(target.id)
            if slot is not None and slot.role == "out":
                self._mark_assigned(slot.name)
            elif slot is None or slot.role == "temp":
                self.poisoned.add(target.id)

    def _repeat(self, stmt: syntax.RepeatBlock) -> Repeat | None:
        count, problem = self._repeat_count(stmt.count)
        if problem:
            self.diags.error(stmt.count.loc, problem)
        loop = _Loop(count, stmt.loc)
        self.loops.append(loop)
        self.repeat_outer.append(set(self.current))
        body = self._stmts(stmt.body)
        outer = self.repeat_outer.pop()
        self.loops.pop()
        self.current = {k: v for k, v in self.current.items() if k in outer}
        if count is None:
            return None
        checked = Repeat(count, tuple(body), loc=stmt.loc)
        self.loop_of[id(checked)] = loop
        return checked

    # ---- outputs assigned in loops that may run 0 times
    def _mark_assigned(self, name: str) -> None:
        guard = tuple(loop for loop in self.loops if not loop.runs)
        if not guard:
            self.assigned.add(name)
            self.maybe_assigned.pop(name, None)
        elif name not in self.assigned:
            known = self.maybe_assigned.get(name)
            if known is None or len(guard) < len(known):  # keep the fewest conditions
                self.maybe_assigned[name] = guard

    def _needs_loops_to_run(self, name: str, guard: tuple[_Loop, ...], loc: Loc) -> None:
        """`name` is read at `loc` (or returned) and only `guard`'s loops assign it: each
        that does not enclose the read must run at least once."""
        for loop in guard:
            if any(loop is enclosing for enclosing in self.loops):
                continue  # the read is inside it, so it runs
            if loop.count == 0:
                self.diags.error(loc, f"'{name}' is assigned only inside the 'repeat' at line {loop.loc.line}, "
                                      "which runs 0 times; assign it before the block")
            else:
                loop.unassigned_if_zero[name] = None

    def _repeat_count(self, expr) -> tuple[int | str | None, str | None]:
        """The count (a literal, or an integer scalar parameter's name), or None and what is wrong."""
        allowed = "a repeat count is an integer literal or an integer scalar parameter"
        if isinstance(expr, syntax.Num):
            if expr.is_float:
                return None, f"{allowed}; {expr.text} is not an integer"
            count = syntax.parse_int(expr.text)
            if count > MAX_REPEAT:
                return None, (f"a repeat count is at most 2^63 - 1 ({MAX_REPEAT}); {syntax.abbreviate(expr.text)} "
                              "is larger")
            return count, None
        if isinstance(expr, syntax.Unary) and expr.op == "-" and isinstance(expr.operand, syntax.Num):
            return None, f"a repeat count cannot be negative (-{expr.operand.text})"
        if isinstance(expr, syntax.Name):
            slot = self.current.get(expr.id)
            if slot is None or slot.role != "scalar":
                return None, f"{allowed}; '{expr.id}' is not a scalar parameter"
            if not slot.type.is_int:
                return None, f"{allowed}; '{expr.id}' is {slot.type}"
            return slot.name, None
        return None, allowed

    def _scope(self) -> tuple[BodyBuilder, list[Slot], ExprChecker, Callable[[Slot, Loc], Strong]]:
        """A body being checked: its builder, the slots it loads, its expression
        checker, and `load(slot, loc)`, which loads a slot into it."""
        b = BodyBuilder()
        loaded: list[Slot] = []

        def load(slot: Slot, loc: Loc) -> Strong:
            loaded.append(slot)
            return Strong(b.emit(Instr("load", (), slot.type, slot.name, loc=loc)), slot.type)

        def lookup(name: str, loc: Loc) -> Strong | None:
            slot = self.current.get(name)
            if name in self.poisoned:
                return POISON
            if slot is None:
                return None
            if slot.role == "out" and name in self.maybe_assigned:
                self._needs_loops_to_run(name, self.maybe_assigned[name], loc)
            elif slot.role == "out" and name not in self.assigned:
                self.diags.error(loc, f"output '{name}' is read before it is assigned")
                return POISON
            return load(slot, loc)

        def position(call: syntax.Call) -> Typed:
            return self._position(call, exprs, loaded)
        exprs = ExprChecker(b, self.diags, lookup, self.stages, reduce=lambda call: self._reduction(call, load),
                            position=position)
        return b, loaded, exprs, load

    def _position(self, call: syntax.Call, exprs: ExprChecker, loaded: list) -> Typed:
        """row_position(x): each element's place along x's last axis (0 where that axis
        is a broadcast 1), as i64; x stays an operand, its shape the statement's."""
        what = f"{call.func}()"
        if len(call.args) != 1:
            return exprs.error(call.loc, f"{what} takes 1 argument, got {len(call.args)}")
        first = len(loaded)
        value = exprs.check(call.args[0])
        if isinstance(value, Strong) and value.type is None:
            return POISON
        arrays = [s.shape for s in loaded[first:] if s.is_array]
        if isinstance(value, Weak) or not arrays:
            return exprs.error(call.loc, f"{what} is each element's place along the last axis of an array; "
                                         "its argument is a scalar")
        shape = self.dims.broadcast(arrays, call.loc)
        if shape is None:
            return POISON
        if self.dims.find(shape[-1]) == 1:  # a broadcast axis of one: every place is 0
            return exprs.emit("const", (), I64, call.loc, 0)
        return exprs.emit("position", (value.id,), I64, call.loc)

    def _reduction(self, call: syntax.Call, load_result: Callable[[Slot, Loc], Strong]) -> Typed:
        """A reduction in an expression: its own statement (run before the one it is
        in) into a hidden temporary of shape [..., 1] (a column sum: two statements,
        `_column_sum`), loaded where it stands."""
        column = call.func in COLUMN_REDUCTIONS
        op, arity = ("col_partial", 1) if column else ROW_REDUCTIONS[call.func]
        what = f"{call.func}()"
        if len(call.args) != arity:
            self.diags.error(call.loc, f"{what} takes {arity} argument{'s' if arity > 1 else ''}, "
                                       f"got {len(call.args)}")
            return POISON
        if self.loops:
            self.diags.error(call.loc, f"{what} inside 'repeat' is not supported yet; reduce before "
                                       "the loop, or run this pipeline with backend='numpy'")
            return POISON
        b, loaded, exprs, _ = self._scope()
        before = len(self.diags.items)
        value = exprs.check(call.args[0])
        value_arrays = [s.shape for s in loaded if s.is_array]
        index = exprs.check(call.args[1]) if op == "pick" else None
        index_arrays = [s.shape for s in loaded[len(value_arrays):] if s.is_array] if op == "pick" else []
        if len(self.diags.items) > before:
            return POISON
        if any(isinstance(v, Strong) and v.type is None for v in (value, index)):
            return POISON  # a name whose statement failed: already reported
        if isinstance(value, Weak) or not value_arrays:
            does = "sums an array over its first axis" if column else "is the length of each row of an array" \
                if op == "length" else "reduces each row of an array"
            return exprs.error(call.loc, f"{what} {does}; its argument is a scalar")
        if not value.type.is_float and op != "length":
            return exprs.error(call.loc, f"{what} needs floats, got {value.type}; convert with f32(...)")
        space = self.dims.broadcast(value_arrays + index_arrays, call.loc)
        if space is None:
            return POISON
        if column and len(space) < 2:
            return exprs.error(call.loc, f"{what} sums over the first axis of an array of two or more dims, "
                                         f"leaving the others; its argument is {fmt_shape(space)}")
        acc = F64 if value.type == F64 else F32
        # row_length's operand only gives the row (any type's, cast: its values are never read)
        results = [(exprs.cast(value, acc, call.loc) if op == "length" else exprs.convert(value, acc, call.loc, what)).id]
        if op == "pick":
            if isinstance(index, Strong) and not index.type.is_int:
                return exprs.error(call.loc, f"the index of {what} must be an integer, got {index.type}")
            index_shape = self.dims.broadcast(index_arrays, call.loc) if index_arrays else ()
            if index_shape is None:
                return POISON
            if index_shape and self.dims.find(index_shape[-1]) != 1:
                return exprs.error(call.loc, f"the index of {what} must be one per row, of shape [..., 1]; "
                                             f"it is {fmt_shape(index_shape)}")
            results.append(exprs.convert(index, I64, call.loc, f"the index of {what}").id)
        if len(self.diags.items) > before:
            return POISON
        slot = Slot(self._hidden("col_partial" if column else call.func), acc, reduced_shape(op, space), "temp",
                    loc=call.loc)
        self.slots.append(slot)
        self.pending.append(Apply((slot.name,), b.build(results), space, None, loc=call.loc, reduce=op))
        return load_result(self._column_sum(call, slot) if column else slot, call.loc)

    def _hidden(self, base: str) -> str:
        """A new hidden temporary's name: '#' and a number, which no user can write."""
        return f"{base}#{sum(1 for s in self.slots if '#' in s.name)}"

    def _column_sum(self, call: syntax.Call, partial: Slot) -> Slot:
        """After `col_sum(x)`'s statement of COLUMN_CHUNKS partial sums, the statement
        summing them into a hidden temporary of x's shape without its first dim."""
        b, _, _, load = self._scope()
        chunks = load(partial, call.loc)
        total = Slot(self._hidden(call.func), partial.type, reduced_shape("col_sum", partial.shape), "temp",
                     loc=call.loc)
        self.slots.append(total)
        self.pending.append(Apply((total.name,), b.build([chunks.id]), partial.shape, None, loc=call.loc,
                                  reduce="col_sum"))
        return total

    def _apply(self, stmt: syntax.Assign) -> Apply | None:
        b, loaded, exprs, _ = self._scope()
        before = len(self.diags.items)
        values = assigned_values(stmt, exprs)
        value_shape = self.dims.broadcast([s.shape for s in loaded if s.is_array], stmt.loc)
        if value_shape is None or len(self.diags.items) > before:
            return None
        targets = self._targets(stmt, values, value_shape)
        if targets is None:
            return None
        shape = targets[0].shape
        results = [exprs.convert(v, t.type, stmt.loc, f"assignment to '{n.id}'", store=True).id
                   for v, t, n in zip(values, targets, stmt.targets)]
        if len(self.diags.items) > before:
            return None
        callee = stmt.value.func if isinstance(stmt.value, syntax.Call) and stmt.value.func in self.stages else None
        # `m = row_max(x);`, `g = col_sum(x);`: the reduction's last statement stores into
        # the target itself (converted to its type), no copy. (A poisoned operand leaves
        # no pending statement: nothing to retarget.)
        if isinstance(stmt.value, syntax.Call) and stmt.value.func in (*ROW_REDUCTIONS, *COLUMN_REDUCTIONS) \
                and self.pending and self._canonical_shape(shape) == self._canonical_shape(
                    reduced_shape(self.pending[-1].reduce, self.pending[-1].shape)):
            reduction = self.pending.pop()
            self.slots = [s for s in self.slots if s.name != reduction.targets[0]]
            return Apply((targets[0].name,), reduction.body, reduction.shape, None, loc=stmt.loc,
                         reduce=reduction.reduce)
        return Apply(tuple(t.name for t in targets), b.build(results), shape, callee, loc=stmt.loc)

    def _targets(self, stmt: syntax.Assign, values: list[Typed], value_shape: Shape) -> list[Slot] | None:
        names = [t.id for t in stmt.targets]
        declared = [self.current[n] for n in names if n in self.current and self.current[n].role in ("inout", "out")]
        space = declared[0].shape if declared else value_shape
        ok = True
        for target in stmt.targets:
            slot = self.current.get(target.id)
            if names.count(target.id) > 1:
                self.diags.error(target.loc, f"'{target.id}' is assigned twice in one statement")
                ok = False
            elif slot is not None and slot.role == "in":
                self.diags.error(target.loc, f"cannot assign to input '{target.id}'; declare it `inout` "
                                             "to update it in place")
                ok = False
            elif slot is not None and slot.role == "scalar":
                self.diags.error(target.loc, f"cannot assign to scalar parameter '{target.id}'")
                ok = False
            elif slot is not None and slot.role in ("inout", "out"):
                fits = self.dims.broadcast([slot.shape, value_shape], target.loc)
                if fits is None:
                    ok = False
                elif [self.dims.find(d) for d in fits] != [self.dims.find(d) for d in slot.shape]:
                    self.diags.error(target.loc, f"a value of shape {fmt_shape(value_shape)} does not fit "
                                                 f"'{target.id}' of shape {fmt_shape(slot.shape)}")
                    ok = False
                elif not self._same_shape(slot.shape, space, target.loc):
                    self.diags.error(target.loc, "the targets of one statement must have the same shape")
                    ok = False
        if not ok:
            return None
        out = []
        for target, value in zip(stmt.targets, values):
            out.append(self._bind_target(target, value, space))
        return None if any(s is None for s in out) else out

    def _bind_target(self, target: syntax.Name, value: Typed, shape: Shape) -> Slot | None:
        self.poisoned.discard(target.id)
        slot = self.current.get(target.id)
        in_repeat = bool(self.repeat_outer)
        if slot is not None and slot.role in ("inout", "out"):
            if slot.role == "out":
                self._mark_assigned(slot.name)
            return slot
        vtype = value.type if isinstance(value, Strong) else default_type(value.kind)
        if slot is not None and slot.type == vtype and self._canonical_shape(slot.shape) == self._canonical_shape(shape):
            return slot
        if slot is not None and in_repeat and target.id in self.repeat_outer[-1]:
            self.diags.error(target.loc, f"'{target.id}' is carried around the repeat loop, so it must keep "
                                         f"its type: {fmt_slot(slot)} before, {vtype}{fmt_shape(shape)} here")
            return None
        count = sum(1 for s in self.slots if s.name == target.id or s.name.startswith(target.id + "."))
        name = target.id if count == 0 else f"{target.id}.{count + 1}"
        new = Slot(name, vtype, shape, "temp", loc=target.loc)
        self.slots.append(new)
        self.current[target.id] = new
        return new

    # ---- canonical shapes (dims that met in a broadcast share one name)
    def _canonical_shape(self, shape: Shape) -> Shape:
        return tuple(self.dims.find(d) for d in shape)

    def _same_shape(self, a: Shape, b: Shape, loc) -> bool:
        """Shapes one kernel can cover: named dims are equated (checked at call time), as a broadcast would."""
        if len(a) != len(b) or any((self.dims.find(x) == 1) != (self.dims.find(y) == 1) for x, y in zip(a, b)):
            return False
        return all(self.dims.union(x, y, loc) for x, y in zip(a, b))

    def _canonical(self, slot: Slot) -> Slot:
        if slot.role != "temp":
            return slot
        return Slot(slot.name, slot.type, tuple(self.dims.find(d) for d in slot.shape), slot.role, loc=slot.loc)

    def _canonical_stmts(self, stmts: list[Stmt]) -> tuple[Stmt, ...]:
        out = []
        for s in stmts:
            if isinstance(s, Repeat):
                unassigned = tuple(self.loop_of[id(s)].unassigned_if_zero)
                out.append(Repeat(s.count, self._canonical_stmts(list(s.body)), unassigned, loc=s.loc))
            else:
                out.append(replace(s, shape=tuple(self.dims.find(d) for d in s.shape)))
        return tuple(out)
