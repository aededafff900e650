"""Emission: a `ModulePlan` -> one CUDA C module, from the Jinja2 templates.

The templates hold the layout; this module computes every name, type and
expression. Output is deterministic, so golden files can hold it.
"""
from __future__ import annotations

import functools

import jinja2

from ..ir import fmt_shape
from ..plan import Access, Kernel, ModulePlan, kernel_params, needs_coordinates
from .cexpr import (HELPERS, cast_expr, compute_type, const, load_expr, op_expr, scalar_param_type,
                    storage_type, store_expr)
from .names import Namer


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("fusec", "templates"), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def emit_module(plan: ModulePlan, source_name: str) -> str:
    kernels = [_KernelEmitter(plan, k, Namer()).render() for k in plan.kernels]
    helpers = sorted({h for k in kernels for h in k["helpers"]})
    types = {a.type.name for k in plan.kernels for a in list(k.loads) + [s for s, _ in k.stores]}
    types |= {i.type.name for k in plan.kernels for i in k.body.instrs}
    includes = [h for t, h in (("f16", "cuda_fp16.h"), ("bf16", "cuda_bf16.h")) if t in types]
    return environment().get_template("module.cu.j2").render(
        source=source_name, pipeline=plan.pipeline, form="fused" if plan.fused else "unfused",
        kernels=kernels, helpers=helpers, includes=includes)


class _KernelEmitter:
    def __init__(self, plan: ModulePlan, kernel: Kernel, namer: Namer):
        self.plan, self.k, self.namer = plan, kernel, namer
        self.helpers: set[str] = set()

    def render(self) -> dict:
        k, namer = self.k, self.namer
        params = kernel_params(k)
        buffer_names = {p.key: namer.user(p.key) for p in params if p.kind == "array"}
        scalar_names = {p.key: namer.user(p.key) for p in params if p.kind == "scalar"}
        i, n = namer.fresh("i"), namer.fresh("n")
        extent_names = {p.key: namer.fresh(f"e{p.key}") for p in params if p.kind == "extent"}
        decls = []
        for p in params:
            if p.kind == "array":
                qual = "" if p.written else "const "
                decls.append(f"{qual}{storage_type(p.type)}* __restrict__ {buffer_names[p.key]}")
            elif p.kind == "scalar":
                decls.append(f"const {scalar_param_type(p.type)} {scalar_names[p.key]}")
            elif p.kind == "numel":
                decls.append(f"const long long {n}")
            else:
                decls.append(f"const long long {extent_names[p.key]}")
        coords, coord_names = self._coordinates(i, extent_names)

        def index(access: Access) -> str:
            if access.contiguous:
                return i
            terms, stride = [], []
            for j in range(len(access.present) - 1, -1, -1):
                if access.present[j]:
                    terms.append(" * ".join([coord_names[j]] + stride))
                    if j > 0:
                        stride = [extent_names[j]] + stride
            return " + ".join(reversed(terms)) or "0"

        refs: list[str] = []
        lines: list[str] = []
        body = k.body.instrs
        for idx, ins in enumerate(body):
            if ins.op == "const":
                refs.append(const(ins.attr, ins.type))
                continue
            if ins.op == "load" and ins.attr in scalar_names:
                refs.append(scalar_names[ins.attr])
                continue
            name = namer.fresh(f"v{len(lines)}")
            if ins.op == "load":
                access = next(a for a in k.loads if a.value == ins.attr)
                expr = load_expr(ins.type, f"{buffer_names[access.buffer]}[{index(access)}]")
            elif ins.op == "cast":
                src = body[ins.args[0]].type
                expr = cast_expr(src, ins.type, refs[ins.args[0]])
                if ins.type.is_int and src.is_float:
                    self.helpers.add("f2i")
            else:
                operand_type = body[ins.args[0]].type if ins.args else ins.type
                if ins.op == "select":
                    operand_type = body[ins.args[1]].type
                expr = op_expr(ins.op, ins.type, operand_type, [refs[a] for a in ins.args])
                self.helpers.update(h for fn, h in HELPERS.items() if fn + "(" in expr)
            lines.append(f"const {compute_type(ins.type)} {name} = {expr};")
            refs.append(name)
        stores = [f"{buffer_names[a.buffer]}[{index(a)}] = {store_expr(a.type, refs[at])};" for a, at in k.stores]
        return {
            "name": k.name, "stages": k.stages, "space": fmt_shape(k.shape), "params": decls, "i": i, "n": n,
            "coords": coords, "lines": lines, "stores": stores, "helpers": self.helpers,
            "comments": self._comments(),
        }

    def _coordinates(self, i: str, extent_names: dict) -> tuple[list[str], dict[int, str]]:
        """Coordinates of the flat index in the collapsed space, outermost first."""
        if not needs_coordinates(self.k):
            return [], {}
        m = len(self.k.extents)
        needed = {j for a in self.k.loads if not a.contiguous for j in range(m) if a.present[j]}
        names = {j: self.namer.fresh(f"c{j}") for j in sorted(needed)}
        lines, rest = [f"// coordinates of {i} in the collapsed space "
                       f"[{', '.join(' * '.join(map(str, e)) for e in self.k.extents)}]"], i
        for j in range(m - 1, 0, -1):
            if j in needed:
                lines.append(f"const long long {names[j]} = {rest} % {extent_names[j]};")
            if not any(k < j for k in needed):
                break
            if j > 1:
                quotient = self.namer.fresh(f"r{j}")
                lines.append(f"const long long {quotient} = {rest} / {extent_names[j]};")
                rest = quotient
            else:
                rest = f"{rest} / {extent_names[j]}"
        if 0 in needed:
            lines.append(f"const long long {names[0]} = {rest};")
        return lines, names

    def _comments(self) -> list[str]:
        k = self.k
        reads = ", ".join(a.buffer + ("" if a.contiguous else " (broadcast)") for a in k.loads) or "nothing"
        writes = ", ".join(a.buffer for a, _ in k.stores) or "nothing"
        lines = [f"reads {reads}; writes {writes}; estimated {k.est_regs} registers"]
        return lines
