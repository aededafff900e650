"""Emission: a `ModulePlan` -> one CUDA C module, from the Jinja2 templates.

The templates hold the layout; this module computes every name, type and
expression. Output is deterministic, so golden files can hold it.
"""
from __future__ import annotations

import functools

import jinja2

from fusec.cache import TemplateBytecodeCache
from fusec.codegen.cexpr import (
    HELPERS,
    cast_expr,
    compute_type,
    const,
    load_expr,
    op_expr,
    scalar_param_type,
    storage_type,
    store_expr,
)
from fusec.codegen.names import Namer
from fusec.ir.kernels import WORK_ITEM, Access, Kernel, ModulePlan, kernel_params, needs_coordinates
from fusec.ir.program import fmt_shape


@functools.cache
def environment() -> jinja2.Environment:
    # Compiled templates are kept in fusec's cache (Jinja2 keys them on the template's source).
    return jinja2.Environment(loader=jinja2.PackageLoader("fusec.codegen", "templates"), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                              bytecode_cache=TemplateBytecodeCache())


def emit_module(plan: ModulePlan, source_name: str) -> str:
    emitters = [_KernelEmitter(k, Namer()) for k in plan.kernels]
    kernels = [e.render() for e in emitters]
    helpers = sorted({h for e in emitters for h in e.helpers})
    types = {a.type.name for k in plan.kernels for a in list(k.loads) + [s for s, _ in k.stores]}
    types |= {i.type.name for k in plan.kernels for i in k.body.instrs}
    includes = [h for t, h in (("f16", "cuda_fp16.h"), ("bf16", "cuda_bf16.h")) if t in types]
    return environment().get_template("module.cu.j2").render(
        source=source_name, pipeline=plan.pipeline, form="fused" if plan.fused else "unfused",
        kernels=kernels, helpers=helpers, includes=includes)


class _KernelEmitter:
    """One kernel, in two variants: one element per thread (any alignment), and
    one vector per array per thread (aligned arrays: plan.vector_alignment).
    A persistent kernel has one grid-stride form, a multi-tensor kernel one
    form with both loops inside."""

    def __init__(self, kernel: Kernel, namer: Namer):
        self.k, self.namer = kernel, namer
        self.helpers: set[str] = set()
        params = kernel_params(kernel)
        self.buffers = {p.key: namer.user(p.key) for p in params if p.kind in ("array", "pointers")}
        self.scalars = {p.key: namer.user(p.key) for p in params if p.kind == "scalar"}
        self.i, self.n = namer.fresh("i"), namer.fresh("n")
        self.extents = {p.key: namer.fresh(f"e{p.key}") for p in params if p.kind == "extent"}
        self.count = namer.fresh("count") if kernel.count is not None else None
        if kernel.multi_tensor:
            self.tables = {p.key: namer.fresh(f"{self.buffers[p.key]}_ptrs") for p in params if p.kind == "pointers"}
            self.table, self.chunks = namer.fresh("table"), namer.fresh("chunks")
        self.decls = [self._decl(p) for p in params]
        self.coords, self.coord_names = self._coordinates(self.i, self.extents)

    def _local_namer(self) -> Namer:
        """Names for one function's locals: any name but the parameters and coordinates."""
        namer = Namer()
        namer.taken |= set(self.buffers.values()) | set(self.scalars.values()) | set(self.extents.values())
        namer.taken |= {self.i, self.n, self.count} | set(self.coord_names.values())
        return namer

    def _decl(self, p) -> str:
        if p.kind == "pointers":
            qual = "" if p.written else "const "
            return f"{qual}{storage_type(p.type)}* const* __restrict__ {self.tables[p.key]}"
        if p.kind == "table":
            return f"const long long* __restrict__ {self.table}"
        if p.kind == "chunks":
            return f"const long long {self.chunks}"
        if p.kind == "array":
            qual = "" if p.written else "const "
            return f"{qual}{storage_type(p.type)}* __restrict__ {self.buffers[p.key]}"
        if p.kind == "scalar":
            return f"const {scalar_param_type(p.type)} {self.scalars[p.key]}"
        name = {"numel": self.n, "count": self.count}.get(p.kind) or self.extents[p.key]
        return f"const long long {name}"

    def render(self) -> dict:
        k = self.k
        if k.multi_tensor:
            variants = [self._multi_tensor_variant()]
        elif k.persistent:
            variants = [self._loop_variant()]
        else:
            variants = [{"name": k.name, "vector": 0, "loop": False, "multi": False, "params": self.decls,
                         "i": self.i, "n": self.n, "coords": self.coords,
                         **self._scalar_body(self.i, self._local_namer())}]
            if k.vector > 1:
                variants.append(self._vector_variant())
        return {"name": k.name, "stages": k.stages, "space": fmt_shape(k.shape), "comments": self._comments(),
                "variants": variants}

    def index(self, access: Access) -> str:
        """Offset of an access at element i: i itself, or from the coordinates of i."""
        if access.contiguous:
            return self.i
        terms, stride = [], []
        for j in range(len(access.present) - 1, -1, -1):
            if access.present[j]:
                terms.append(" * ".join([self.coord_names[j]] + stride))
                if j > 0:
                    stride = [self.extents[j]] + stride
        return " + ".join(reversed(terms)) or "0"

    def _scalar_body(self, i: str, namer: Namer) -> dict:
        """The computation for one element at index i: lines, then stores."""
        loads = {a.value: load_expr(a.type, f"{self.buffers[a.buffer]}[{self.index(a) if not a.contiguous else i}]")
                 for a in self.k.loads}
        lines, refs = self._computation(loads, namer)
        return {"lines": [line for line in lines if line], "stores": self._stores(i, refs)}

    def _stores(self, i: str, refs: list[str]) -> list[str]:
        return [f"{self.buffers[a.buffer]}[{i}] = {store_expr(a.type, refs[at])};" for a, at in self.k.stores]

    def _loop_variant(self) -> dict:
        """A persistent kernel: a grid-stride loop over elements; for a loop
        kernel, each element's loads once, the body `count` times in registers,
        its stores once."""
        k, namer = self.k, self._local_namer()
        iteration = namer.fresh("it")
        loads = {a.value: load_expr(a.type, f"{self.buffers[a.buffer]}[{self.index(a)}]") for a in k.loads}
        variables = {lv for lv, _ in k.carried}
        lines, refs = self._computation(loads, namer, mutable=variables)
        body = k.body.instrs
        before = [line for line, ins in zip(lines, body) if line and ins.op == "load"]
        inside = [line for line, ins in zip(lines, body) if line and ins.op != "load"]
        nexts = [(namer.fresh(f"{refs[lv]}_next"), lv, ev) for lv, ev in k.carried]
        inside += [f"const {compute_type(body[lv].type)} {name} = {refs[ev]};" for name, lv, ev in nexts]
        inside += [f"{refs[lv]} = {name};" for name, lv, _ in nexts]
        return {"name": k.name, "vector": 0, "loop": True, "multi": False, "params": self.decls, "i": self.i, "n": self.n,
                "count": self.count, "it": iteration, "coords": self.coords, "pre": before, "lines": inside,
                "stores": self._stores(self.i, refs)}

    def _vector_body(self, namer: Namer) -> dict:
        """The computation for one 16-byte vector per array at index i: loads,
        the elements in an unrolled loop over `lane`, then vector stores."""
        k, width = self.k, self.k.vector
        lane = namer.fresh("k")  # the element within the vector
        pre, loads = [], {}
        inner = len(k.extents) - 1
        for a in k.loads:
            ptr = f"{self.buffers[a.buffer]} + {self.index(a)}"
            if a.contiguous or a.present[inner]:  # E consecutive elements: one vector
                vec = namer.fresh(f"{self.buffers[a.buffer]}_v")
                pre.append(f"const fz_vec<{storage_type(a.type)}, {width}> {vec} = "
                           f"*reinterpret_cast<const fz_vec<{storage_type(a.type)}, {width}>*>({ptr});")
                loads[a.value] = load_expr(a.type, f"{vec}.v[{lane}]")
            else:  # the same element for the whole vector: one load
                name = namer.fresh(f"{self.buffers[a.buffer]}_s")
                pre.append(f"const {storage_type(a.type)} {name} = {self.buffers[a.buffer]}[{self.index(a)}];")
                loads[a.value] = load_expr(a.type, name)
        out_vec = {a.value: namer.fresh(f"{self.buffers[a.buffer]}_out") for a, _ in k.stores}
        declare = [f"fz_vec<{storage_type(a.type)}, {width}> {out_vec[a.value]};" for a, _ in k.stores]
        lines, refs = self._computation(loads, namer)
        lines = [line for line in lines if line]
        lines += [f"{out_vec[a.value]}.v[{lane}] = {store_expr(a.type, refs[at])};" for a, at in k.stores]
        stores = [f"*reinterpret_cast<fz_vec<{storage_type(a.type)}, {width}>*>({self.buffers[a.buffer]} + {self.i}) "
                  f"= {out_vec[a.value]};" for a, _ in k.stores]
        self.helpers.add("vec")
        return {"vector": width, "lane": lane, "pre": pre, "declare": declare, "lines": lines, "stores": stores}

    def _vector_variant(self) -> dict:
        k = self.k
        tail = None
        if not needs_coordinates(k):  # with broadcasts the runtime only picks this variant when n % E == 0
            tail_namer = self._local_namer()
            j = tail_namer.fresh("j")
            tail = {"j": j, **self._scalar_body(j, tail_namer)}
        return {"name": f"{k.name}_v{k.vector}", "loop": False, "multi": False, "params": self.decls,
                "i": self.i, "n": self.n, "coords": self.coords, "tail": tail,
                **self._vector_body(self._local_namer())}

    def _multi_tensor_variant(self) -> dict:
        """foreach: blocks stride over a table of work items, each a range of
        one set's elements (runtime.foreach.CHUNK at most): whole 16-byte vectors where the set's
        arrays are aligned, then one element per thread."""
        namer = self._local_namer()
        namer.taken |= set(self.tables.values()) | {self.table, self.chunks}
        item, fields = namer.fresh("c"), {f: namer.fresh(f) for f in WORK_ITEM}
        pointers = []
        for p in kernel_params(self.k):
            if p.kind == "pointers":
                qual = "" if p.written else "const "
                pointers.append(f"{qual}{storage_type(p.type)}* __restrict__ {self.buffers[p.key]} = "
                                f"{self.tables[p.key]}[{fields['set']}];")
        # The two loops are separate scopes: each body may name its locals freely.
        vector_body = self._vector_body(namer.copy())
        return {"name": f"{self.k.name}_mt", "vector": 0, "loop": False, "multi": True, "params": self.decls,
                "i": self.i, "item": item, "fields": fields, "width": len(WORK_ITEM), "table": self.table,
                "chunks": self.chunks, "pointers": pointers, "vector_body": vector_body,
                **self._scalar_body(self.i, namer)}

    def _computation(self, loads: dict[str, str], namer: Namer,
                     mutable: set[int] = frozenset()) -> tuple[list[str | None], list[str]]:
        """One line per instruction, None where it is inlined (a constant, a
        scalar parameter); the `mutable` ones are variables, not constants."""
        refs: list[str] = []
        lines: list[str | None] = []
        body = self.k.body.instrs
        for idx, ins in enumerate(body):
            if ins.op == "const":
                refs.append(const(ins.attr, ins.type))
                lines.append(None)
                continue
            if ins.op == "load" and ins.attr in self.scalars:
                refs.append(self.scalars[ins.attr])
                lines.append(None)
                continue
            if ins.op == "load":
                expr = loads[ins.attr]
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
            name = namer.fresh(f"v{sum(1 for line in lines if line)}")
            qualifier = "" if idx in mutable else "const "
            lines.append(f"{qualifier}{compute_type(ins.type)} {name} = {expr};")
            refs.append(name)
        return lines, refs

    def _coordinates(self, i: str, extent_names: dict) -> tuple[list[str], dict[int, str]]:
        """Coordinates of the flat index in the collapsed space, outermost first."""
        if not needs_coordinates(self.k):
            return [], {}
        m = len(self.k.extents)
        needed = {j for a in self.k.loads if not a.contiguous for j in range(m) if a.present[j]}
        names = {j: self.namer.fresh(f"c{j}") for j in sorted(needed)}
        lines, rest = [f"// coordinates of {i} in the collapsed space "
                       f"[{', '.join(' * '.join(map(str, e)) for e in self.k.extents)}]"], i
        self.helpers.add("index")
        for j in range(m - 1, 0, -1):
            if j in needed:
                lines.append(f"const long long {names[j]} = fz_rem({rest}, {extent_names[j]});")
            if not any(k < j for k in needed):
                break
            if j > 1:
                quotient = self.namer.fresh(f"r{j}")
                lines.append(f"const long long {quotient} = fz_quot({rest}, {extent_names[j]});")
                rest = quotient
            else:
                rest = f"fz_quot({rest}, {extent_names[j]})"
        if 0 in needed:
            lines.append(f"const long long {names[0]} = {rest};")
        return lines, names

    def _comments(self) -> list[str]:
        k = self.k
        reads = ", ".join(a.buffer + ("" if a.contiguous else " (broadcast)") for a in k.loads) or "nothing"
        writes = ", ".join(a.buffer for a, _ in k.stores) or "nothing"
        lines = [f"reads {reads}; writes {writes}; estimated {k.est_regs} registers"]
        return lines
