"""The type checker: syntax tree -> IR, reporting every error of a program at once.

Stages are checked in call order (a call graph with a cycle is an error);
pipelines by `check_pipeline`.
"""
from __future__ import annotations

from fusec.errors import Diagnostics, Loc, Source
from fusec.frontend import syntax
from fusec.frontend.check_expr import ExprChecker, Strong, Typed, assigned_values, resolve_type
from fusec.frontend.check_pipeline import PipelineChecker
from fusec.ir.program import BodyBuilder, Instr, Program, StageFn
from fusec.types import ScalarType


def check_program(module: syntax.File, source: Source) -> Program:
    diags = Diagnostics()
    seen: dict[str, syntax.StageDef | syntax.PipelineDef] = {}
    for decl in module.decls:
        if decl.name in seen:
            diags.error(decl.loc, f"'{decl.name}' is already defined (line {seen[decl.name].loc.line})")
        else:
            seen[decl.name] = decl
    stage_defs = {d.name: d for d in module.decls if isinstance(d, syntax.StageDef) and seen[d.name] is d}
    # A stage that failed to check maps to None, so that its callers stay quiet.
    stages: dict[str, StageFn | None] = dict.fromkeys(stage_defs)
    for name in _call_order(stage_defs, diags):
        stages[name] = _StageChecker(stage_defs[name], stages, diags).check()
    pipelines = [PipelineChecker(d, stages, diags).check()
                 for d in module.decls if isinstance(d, syntax.PipelineDef)]
    if not pipelines and not diags.items:
        diags.error(Loc(1, 1), "no pipeline in this file; declare one with `pipeline NAME(...) { ... }`")
    diags.raise_if_any(source)
    return Program(tuple(stages.values()), tuple(pipelines), source)  # no errors: no None left


def _stage_calls(node) -> set[str]:
    """Names called anywhere inside a syntax node."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, syntax.Call):
            found.add(item.func)
        if isinstance(item, tuple):
            stack.extend(item)
        elif hasattr(item, "__slots__"):
            stack.extend(getattr(item, f) for f in item.__slots__ if f != "loc")
    return found


def _call_order(defs: dict[str, syntax.StageDef], diags: Diagnostics) -> list[str]:
    """Stages, callees first; a stage in a call cycle is reported and dropped."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> bool:
        if state.get(name) == "done":
            return True
        if state.get(name) == "active":
            cycle = " -> ".join(path[path.index(name):] + [name])
            diags.error(defs[name].loc, f"stage '{name}' calls itself ({cycle}); recursion is not allowed")
            return False
        state[name] = "active"
        ok = all(visit(c, path + [name]) for c in sorted(_stage_calls(defs[name].body) & defs.keys()))
        state[name] = "done"
        if ok:
            order.append(name)
        return ok

    for name in defs:
        visit(name, [])
    return order


class _StageChecker:
    def __init__(self, d: syntax.StageDef, stages: dict[str, StageFn], diags: Diagnostics):
        self.d, self.diags = d, diags
        self.b = BodyBuilder()
        self.env: dict[str, Typed] = {}
        self.exprs = ExprChecker(self.b, diags, lambda name, loc: self.env.get(name), stages)

    def check(self) -> StageFn | None:
        d, diags = self.d, self.diags
        before = len(diags.items)
        params = []
        for i, p in enumerate(d.params):
            ptype = self._scalar_decl(p, "stage parameter")
            if p.name in self.env:
                diags.error(p.loc, f"duplicate parameter '{p.name}'")
            elif ptype is not None:
                self.env[p.name] = Strong(self.b.emit(Instr("arg", (), ptype, i, loc=p.loc)), ptype)
                params.append((p.name, ptype))
        results = {}
        for r in d.results:
            rtype = self._scalar_decl(r, "stage result")
            if r.name in self.env or r.name in results:
                diags.error(r.loc, f"result '{r.name}' has the name of another parameter or result")
            elif rtype is not None:
                results[r.name] = rtype
        assigned: dict[str, Typed] = {}
        returned = False
        for stmt in d.body:
            if returned:
                diags.error(stmt.loc, "statement after 'return'")
                break
            if isinstance(stmt, syntax.Let):
                self._bind(stmt.name, self.exprs.check(stmt.value), stmt.loc)
            elif isinstance(stmt, syntax.Return):
                returned = True
                if d.named_results:
                    diags.error(stmt.loc, f"stage '{d.name}' has named results; assign them instead of 'return'")
                else:
                    assigned["result"] = self.exprs.check(stmt.value)
            else:
                self._assign(stmt, results, assigned)
        if not d.named_results and not returned:
            diags.error(d.loc, f"stage '{d.name}' has no 'return'")
        for r in d.results:
            if d.named_results and r.name in results and r.name not in assigned:
                diags.error(r.loc, f"result '{r.name}' of stage '{d.name}' is never assigned")
        if len(diags.items) > before:
            return None
        ids = [self.exprs.convert(assigned[name], rtype, d.loc, f"result '{name}' of stage '{d.name}'",
                                  store=True).id
               for name, rtype in results.items()]
        if len(diags.items) > before:
            return None
        return StageFn(d.name, tuple(params), tuple(results.items()), self.b.build(ids), loc=d.loc)

    def _scalar_decl(self, p: syntax.Param, what: str) -> ScalarType | None:
        if p.inout:
            self.diags.error(p.loc, f"'inout' is for pipeline arrays, not a {what}")
        if p.type.dims is not None:
            self.diags.error(p.type.loc, f"a {what} is a scalar; stages are applied elementwise, so drop the dims")
        return resolve_type(p.type, self.diags)

    def _bind(self, name: str, value: Typed, loc: Loc) -> None:
        if name in self.env:
            self.diags.error(loc, f"'{name}' is already defined in stage '{self.d.name}'")
        else:
            self.env[name] = value

    def _assign(self, stmt: syntax.Assign, results: dict[str, ScalarType], assigned: dict[str, Typed]) -> None:
        if not self.d.named_results:
            self.diags.error(stmt.loc, f"stage '{self.d.name}' returns one value: use 'let' for locals "
                                       "and 'return' for the result")
            return
        values = assigned_values(stmt, self.exprs)
        for target, value in zip(stmt.targets, values):
            if target.id not in results:
                what = "a parameter" if target.id in self.env else "not a result of this stage"
                self.diags.error(target.loc, f"cannot assign to '{target.id}': {what}")
            elif target.id in assigned:
                self.diags.error(target.loc, f"result '{target.id}' is assigned twice")
            else:
                assigned[target.id] = value
                self.env[target.id] = value  # readable once assigned
