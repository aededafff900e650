"""Emission: a `LaunchInterface` -> one CUDA C module, from the Jinja2 templates.

The templates hold the layout; this module computes every name, type and
expression. It reads the launch interface alone: each kernel's computation,
its form, its variants and its parameters. Output is deterministic, so golden
files can hold it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jinja2

from fusec.cache import TemplateBytecodeCache
from fusec.codegen.cexpr import HELPERS, cast_expr, const, float_const, load_expr, op_expr, rounded, store_expr
from fusec.codegen.names import Namer
from fusec.ir.kernels import ROW_REDUCTIONS, Access, held_values, indexed_picks, row_schedule
from fusec.ir.program import COLUMN_OPS
from fusec.ir.launch import (
    WORK_ITEM,
    ArrayArg,
    ColumnReduce,
    ConstArg,
    CountArg,
    Elementwise,
    Extent,
    GridStride,
    KernelLaunch,
    LaunchInterface,
    MultiTensor,
    NumElements,
    PointerTable,
    RegisterLoop,
    RowBlock,
    ScalarArg,
    ScalarInMemory,
    Variant,
    WorkItemCount,
    WorkItems,
    block_threads,
    cluster_blocks,
    unhandled,
)
from fusec.ir.program import fmt_shape
from fusec.target import BLOCK_SIZE, CLUSTER_PUSH_BLOCKS, CLUSTER_STREAM_THREADS
from fusec.types import F64



@functools.cache
def environment() -> jinja2.Environment:
    # Compiled templates are kept in fusec's cache (Jinja2 keys them on the template's source).
    return jinja2.Environment(loader=jinja2.PackageLoader("fusec.codegen", "templates"),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True, bytecode_cache=TemplateBytecodeCache())


def emit_module(interface: LaunchInterface, source_name: str) -> str:
    emitters = [_KernelEmitter(k, interface.signature.slot_names, interface.fast_math) for k in interface.kernels]
    kernels = [e.render() for e in emitters]
    helpers = sorted({h for e in emitters for h in e.helpers})
    types = {a.type.name for k in interface.kernels for a in k.kernel.accesses}
    types |= {i.type.name for k in interface.kernels for i in k.kernel.body.instrs}
    includes = [h for t, h in (("f16", "cuda_fp16.h"), ("bf16", "cuda_bf16.h")) if t in types]
    return environment().get_template("module.cu.j2").render(
        source=source_name, pipeline=interface.pipeline, form="fused" if interface.fused else "unfused",
        kernels=kernels, helpers=helpers, includes=includes, fast_math=interface.fast_math)


@dataclass(frozen=True, slots=True)
class _RowLoop:
    """A row kernel variant's loop over a row: the C names of its row, its
    element's column, a vector's first column and the element in it, the kept
    vector's slot, the thread's place among the row's threads and whether its
    row exists (several rows at a time), and its numbers: the row's length (an
    expression), vectors kept a thread, elements a vector, rows a block takes at
    a time, threads a block and threads a row."""

    row: str
    col: str
    first: str | None
    element: str | None
    slot: str | None
    thread: str
    live: str | None
    length: str
    resident: int
    width: int
    at_once: int
    block: int
    threads: int


class Refs(dict):
    """Instruction -> the C expression naming its value; `named`: the values given a name so far."""

    named = 0


class _KernelEmitter:
    """One kernel, every variant of it, from its launch description."""

    def __init__(self, launch: KernelLaunch, slot_names: tuple[str, ...], fast_math: bool = False):
        self.launch, self.k, self.fast_math = launch, launch.kernel, fast_math
        self.helpers: set[str] = set()
        self.namer = Namer()
        self.namer.taken |= {p.c_name for p in launch.params}
        # The C name of each array the body reads or writes: its parameter, or
        # (foreach) the local pointer taken from its table for the current set.
        self.buffers, self.tables = {}, {}
        self.scalars, self.extents = {}, {}
        self.n = self.count = self.table = self.chunks = None
        # Lines at the top of every variant: each scalar read from memory, as its by-value form converts it.
        self.reads: list[str] = []
        for p in launch.params:
            match p.source:
                case ArrayArg(slot):
                    self.buffers[slot_names[slot]] = p.c_name
                case PointerTable(slot):
                    self.tables[slot_names[slot]] = p.c_name
                    self.buffers[slot_names[slot]] = self.namer.user(slot_names[slot])
                case ScalarArg(slot):
                    self.scalars[slot_names[slot]] = p.c_name
                case ScalarInMemory(slot, declared):
                    local = self.namer.user(slot_names[slot])
                    self.scalars[slot_names[slot]] = local
                    self.reads.append(f"const {declared.compute.c} {local} = {cast_expr(F64, declared, '*' + p.c_name)};"
                                      f"  // {slot_names[slot]}, from memory")
                case NumElements():
                    self.n = p.c_name
                case CountArg() | ConstArg():
                    self.count = p.c_name
                case Extent(dim):
                    self.extents[dim] = p.c_name
                case WorkItems():
                    self.table = p.c_name
                case WorkItemCount():
                    self.chunks = p.c_name
                case _:
                    unhandled(p.source)
        self.i = self.namer.fresh("i")
        self.decls = [p.declaration for p in launch.params]
        self.coords, self.coord_names = self._coordinates(self.i)
        # What row_position reads in the code being emitted: the element's last
        # coordinate (a vector's: plus its lane; a row kernel's: its column).
        self.position = self.coord_names.get(len(self.k.extents) - 1)
        # Casts to f16 or bf16 that only stores read: written where read, not named (a
        # store of one rounds the cast's operand once: `_stored`).
        body = self.k.body.instrs
        read = {a for ins in body for a in ins.args} | {v for pair in self.k.carried for v in pair}
        self.stored_casts = {idx for idx, ins in enumerate(body)
                             if ins.op == "cast" and ins.type.is_half and idx not in read}

    def _local_namer(self) -> Namer:
        """Names for one function's locals: any name but the parameters, index and coordinates."""
        return self.namer.copy()

    def render(self) -> dict:
        k, launch = self.k, self.launch
        # Emitted in order of elements per thread (the one-element form first).
        variants = [self._variant(v) for v in sorted(launch.variants, key=lambda v: v.elements_per_thread)]
        return {"name": k.name, "stages": k.stages, "space": fmt_shape(k.shape), "comments": self._comments(),
                "variants": variants}

    def _variant(self, variant: Variant) -> dict:
        common = {"name": variant.name, "params": self.decls, "i": self.i, "n": self.n, "coords": self.coords,
                  "est_regs": variant.est_regs, "reads": self.reads}
        match self.launch.form:
            case Elementwise() if variant.elements_per_thread == 1:
                return {"kind": "element", **common, **self._scalar_body(self.i, self._local_namer())}
            case Elementwise():
                return {"kind": "vector", **common, **self._vector_variant(variant.elements_per_thread)}
            case GridStride() | RegisterLoop():
                return {"kind": "grid_stride", **common, **self._loop_variant()}
            case MultiTensor():
                return {"kind": "multi_tensor", **common, **self._multi_tensor_variant(variant.elements_per_thread)}
            case RowBlock():
                return {"kind": "rows", **common, **self._row_variant(variant)}
            case ColumnReduce(chunks, total=True):
                return {"kind": "total", **common, **self._total_variant(chunks)}
            case ColumnReduce(chunks):
                return {"kind": "columns", **common, **self._column_variant(chunks)}
            case form:
                unhandled(form)

    def index(self, access: Access) -> str:
        """Offset of an access at element i: i itself, or from the coordinates of i."""
        if access.contiguous:
            return self.i
        return self._offset(access.present, self.coord_names)

    def _offset(self, present: tuple[bool, ...], coordinates: dict[int, str]) -> str:
        """Row-major offset into an array that varies along the collapsed dims
        `present` (strides: the extents of those after each), from their coordinates."""
        terms, stride = [], []
        for j in range(len(present) - 1, -1, -1):
            if present[j]:
                terms.append(" * ".join([coordinates[j]] + stride))
                if j > 0:
                    stride = [self.extents[j]] + stride
        return " + ".join(reversed(terms)) or "0"

    def _scalar_body(self, i: str, namer: Namer) -> dict:
        """The computation for one element at index i: lines, then stores."""
        loads = {a.value: load_expr(a.type, f"{self.buffers[a.buffer]}[{self.index(a) if not a.contiguous else i}]")
                 for a in self.k.loads}
        lines, refs = self._computation(loads, namer)
        return {"lines": [line for line in lines if line], "stores": self._stores(i, refs)}

    def _stores(self, i: str, refs: list[str], rounds: bool = True) -> list[str]:
        return [f"{self.buffers[a.buffer]}[{i}] = {self._stored(a.type, at, refs) if rounds else store_expr(a.type, refs[at])};"
                for a, at in self.k.stores]

    def _stored(self, t, at: int, refs) -> str:
        """Value `at` in storage type `t`: where it is a cast to `t` (f16, bf16) of a
        value in scope (`refs`: a list holds every value), that value rounded once
        (the cast's own rounding, not a second one of the rounded value)."""
        body = self.k.body.instrs
        ins = body[at]
        if ins.op == "cast" and t.is_half and ins.type == t:
            src = ins.args[0]
            if isinstance(refs, list) or src in refs:
                return rounded(body[src].type, t, refs[src])
        return store_expr(t, refs[at])

    def _loop_variant(self) -> dict:
        """Grid-stride over the elements; for a loop kernel, each element's loads
        once, the body `count` times in registers, its stores once."""
        k, namer = self.k, self._local_namer()
        iteration = namer.fresh("it")
        loads = {a.value: load_expr(a.type, f"{self.buffers[a.buffer]}[{self.index(a)}]") for a in k.loads}
        variables = {lv for lv, _ in k.carried}
        lines, refs = self._computation(loads, namer, mutable=variables)
        body = k.body.instrs
        before = [line for line, ins in zip(lines, body) if line and ins.op == "load"]
        inside = [line for line, ins in zip(lines, body) if line and ins.op != "load"]
        nexts = [(namer.fresh(f"{refs[lv]}_next"), lv, ev) for lv, ev in k.carried]
        inside += [f"const {body[lv].type.compute.c} {name} = {refs[ev]};" for name, lv, ev in nexts]
        inside += [f"{refs[lv]} = {name};" for name, lv, _ in nexts]
        return {"count": self.count, "it": iteration, "pre": before, "lines": inside,
                # after a loop the values inside it are out of scope: stored as they are
                "stores": self._stores(self.i, refs, rounds=self.count is None)}

    def _vector_body(self, namer: Namer, width: int) -> dict:
        """The computation for one vector of `width` elements per array at index i:
        loads, the elements in an unrolled loop over `lane`, then vector stores."""
        k = self.k
        lane = namer.fresh("k")  # the element within the vector
        pre, loads = [], {}
        for a in k.loads:
            ptr = f"{self.buffers[a.buffer]} + {self.index(a)}"
            if a.contiguous or a.present[-1]:  # `width` consecutive elements: one vector
                vec = namer.fresh(f"{self.buffers[a.buffer]}_v")
                pre.append(f"const fz_vec<{a.type.c}, {width}> {vec} = "
                           f"*reinterpret_cast<const fz_vec<{a.type.c}, {width}>*>({ptr});")
                loads[a.value] = load_expr(a.type, f"{vec}.v[{lane}]")
            else:  # the same element for the whole vector: one load
                name = namer.fresh(f"{self.buffers[a.buffer]}_s")
                pre.append(f"const {a.type.c} {name} = {self.buffers[a.buffer]}[{self.index(a)}];")
                loads[a.value] = load_expr(a.type, name)
        out_vec = {a.value: namer.fresh(f"{self.buffers[a.buffer]}_out") for a, _ in k.stores}
        declare = [f"fz_vec<{a.type.c}, {width}> {out_vec[a.value]};" for a, _ in k.stores]
        element_position, self.position = self.position, f"({self.position} + {lane})"
        lines, refs = self._computation(loads, namer)
        self.position = element_position
        lines = [line for line in lines if line]
        lines += [f"{out_vec[a.value]}.v[{lane}] = {self._stored(a.type, at, refs)};" for a, at in k.stores]
        stores = [f"*reinterpret_cast<fz_vec<{a.type.c}, {width}>*>({self.buffers[a.buffer]} + {self.i}) "
                  f"= {out_vec[a.value]};" for a, _ in k.stores]
        self.helpers.add("vec")
        return {"vector": width, "lane": lane, "pre": pre, "declare": declare, "lines": lines, "stores": stores}

    def _vector_variant(self, width: int) -> dict:
        tail = None
        if not self.k.needs_coordinates:  # with broadcasts the runtime only picks this variant when rows hold whole vectors
            tail_namer = self._local_namer()
            j = tail_namer.fresh("j")
            tail = {"j": j, **self._scalar_body(j, tail_namer)}
        return {"tail": tail, **self._vector_body(self._local_namer(), width)}

    def _multi_tensor_variant(self, width: int) -> dict:
        """foreach: blocks stride over a table of work items, each a range of
        one set's elements: whole vectors where the set's arrays are aligned,
        then one element per thread."""
        namer = self._local_namer()
        item, fields = namer.fresh("c"), {f: namer.fresh(f) for f in WORK_ITEM}
        written = {a.buffer for a, _ in self.k.stores}
        pointers = []
        for buffer, table in self.tables.items():
            qual = "" if buffer in written else "const "
            access = next(a for a in self.k.accesses if a.buffer == buffer)
            pointers.append(f"{qual}{access.type.c}* __restrict__ {self.buffers[buffer]} = {table}[{fields['set']}];")
        # The two loops are separate scopes: each body may name its locals freely.
        vector_body = self._vector_body(namer.copy(), width)
        return {"item": item, "fields": fields, "width": len(WORK_ITEM), "table": self.table, "chunks": self.chunks,
                "pointers": pointers, "vector_body": vector_body, **self._scalar_body(self.i, namer)}

    def _row_variant(self, variant: Variant) -> dict:
        """One block per row (or, for a RowGrid of several rows a block, one warp
        per row), as its RowSchedule says: pass r computes the
        per-element values round r's reductions reduce, and combines them across
        the block; per-row values are computed once their round is reached; a
        last pass stores the row's elements, and thread 0 the per-row values.
        With `variant.row_cache`, the loads a later pass reads again are kept
        in shared memory by the first pass that reads them (each thread reads
        back only the columns it wrote: no barrier is needed for them); with
        `variant.row_resident`, in registers: each pass is an unrolled loop over
        the thread's `row_resident` vectors, so the first one's loads all issue
        before its arithmetic, and the kept vectors are indexed by constants."""
        k, namer = self.k, self._local_namer()
        body = k.body.instrs
        schedule = row_schedule(k)
        self.helpers.add("rows")
        last = len(k.extents) - 1
        length = self.extents[last] if last else self.n
        chunks = self.launch.form.chunks  # with column sums: a block a run of rows
        at_once = variant.grid.rows_per_block  # rows a block takes at a time
        width = variant.elements_per_thread  # > 1: each pass moves one vector of the row a thread
        resident = variant.row_resident
        # threads a row: a warp's, or fewer (several rows a warp), or the block's, or its cluster's
        # blocks', or (a run of rows several at a time) a group of the block's warps
        block = block_threads(variant, BLOCK_SIZE)
        cluster = cluster_blocks(variant)
        if chunks:
            threads = block // at_once
            warp = threads <= 32
        else:
            warp = at_once > 1
            threads = BLOCK_SIZE // at_once if warp else block * cluster
        grouped = not warp and at_once > 1  # each row a group of warps, combined through shared memory
        row, col = namer.fresh("row"), namer.fresh("col")
        rank = namer.fresh("rank") if cluster > 1 else None  # the block's place in its cluster
        # the thread's place among the row's threads
        thread = namer.fresh("lane") if warp else namer.fresh("t") if rank or grouped else "threadIdx.x"
        element_position, self.position = self.position, col
        slot = namer.fresh("r") if resident else None  # which of the thread's kept vectors
        lane = thread if warp else None
        # the group's row exists (several rows at a time: a group past the last computes it again)
        live = namer.fresh("live") if (warp and threads < 32) or (chunks and at_once > 1) else None
        first, element = (namer.fresh("c"), namer.fresh("k")) if width > 1 else (None, None)
        coordinates, coordinate_names = self._row_coordinates(row, namer)
        per_row_loads = {a.value: load_expr(a.type, f"{self.buffers[a.buffer]}[{self._row_offset(a, row, coordinate_names)}]")
                         for a in k.loads if not a.present[-1]}
        element_loads = {a.value: f"{self.buffers[a.buffer]}[{self.index(a)}]" for a in k.loads if a.present[-1]}
        cached = schedule.cached_loads(k) if variant.row_cache or resident else []
        if rank and variant.grid.persistent:  # a streaming cluster holds every array of whole rows, loaded ahead
            cached += [a for a in k.loads if a.contiguous and all(a.present) and a not in cached]
        scope = list(coordinates)
        caches, offset = {}, []
        ahead: dict[str, str] = {}  # a prefetched array's next vectors
        for a in cached:
            if resident:  # the thread's vectors of the row, in registers
                caches[a.value] = namer.fresh(f"{self.buffers[a.buffer]}_reg")
                declared = f"fz_vec<{a.type.c}, {width}> {caches[a.value]}[{resident}]"
                # loaded while the rows before were computed (a streaming cluster: the arrays of whole rows)
                if variant.prefetch and (chunks or all(a.present)):
                    ahead[a.value] = namer.fresh(f"{self.buffers[a.buffer]}_next")
                    declared += f" = {{{', '.join(f'{ahead[a.value]}[{r}]' for r in range(resident))}}}"
                scope.append(declared + ";")
                continue
            # one array of the row's elements each, widest first: each stays aligned
            caches[a.value] = namer.fresh(f"{self.buffers[a.buffer]}_row")
            start = " + ".join(offset) or "0"
            scope.append(f"{a.type.c}* {caches[a.value]} = reinterpret_cast<{a.type.c}*>(fz_smem + {start});")
            offset.append(f"{length} * {a.type.itemsize}")
        refs = Refs()
        partials: dict[str, str] = {}
        slots: list[str] = []  # a cluster's: per combine, the block's value the others read, and the result
        kept: set[str] = set()  # cached loads already in shared memory

        def shared_slot() -> str | None:
            if rank:
                slots.append(namer.fresh("cluster"))
                return slots[-1]
            return None

        def per_row(round_: int) -> list[str]:
            """Lines computing the per-row values of this round."""
            out = []
            for idx, ins in enumerate(body):
                if schedule.per_element[idx] or schedule.rounds[idx] != round_ or ins.op in ROW_REDUCTIONS:
                    continue
                if ins.op == "row_length":
                    refs[idx] = namer.fresh("length")
                    out.append(f"const {ins.type.compute.c} {refs[idx]} = ({ins.type.compute.c}){length};")
                else:
                    out.append(self._instruction(idx, per_row_loads, namer, refs))
            return [line for line in out if line]

        def element_pass(needed: frozenset[int], reads: dict[int, str] | None = None, keeps: tuple[int, ...] = ()) -> dict:
            """A loop over the row computing the per-element values `needed` (with
            vectors: `pre` loads one vector of each array at the vector's first
            element, and the lines compute each of its elements). Held in
            registers (a resident row): `reads`, values an earlier pass kept (their
            registers' names); `keeps`, values this pass computes and keeps."""
            loads, pre = dict(per_row_loads), []
            used = {body[i].attr for i in needed if body[i].op == "load"}
            for a in k.loads:
                value = element_loads.get(a.value)
                if resident and a.value in caches:
                    kept_vector = f"{caches[a.value]}[{slot}]"
                    if a.value in used and a.value not in kept and a.value not in ahead:  # loaded into its register
                        pre.append(f"{kept_vector} = *reinterpret_cast<const fz_vec<{a.type.c}, {width}>*>("
                                   f"{self.buffers[a.buffer]} + {self.index(a)});")
                    loads[a.value] = load_expr(a.type, f"{kept_vector}.v[{element}]")
                    continue
                if width > 1 and a.value in element_loads and a.value in used and a.value not in kept:
                    vec = namer.fresh(f"{self.buffers[a.buffer]}_v")
                    pre.append(f"const fz_vec<{a.type.c}, {width}> {vec} = *reinterpret_cast<const fz_vec<{a.type.c}, "
                               f"{width}>*>({self.buffers[a.buffer]} + {self.index(a)});")
                    value = f"{vec}.v[{element}]"
                if a.value in caches and a.value in kept:
                    loads[a.value] = load_expr(a.type, f"{caches[a.value]}[{col}]")
                elif a.value in caches:  # read from global memory, and kept for the next passes
                    loads[a.value] = load_expr(a.type, f"({caches[a.value]}[{col}] = {value})")
                elif a.value in element_loads:
                    loads[a.value] = load_expr(a.type, value)
            kept.update(body[i].attr for i in needed if body[i].op == "load" and body[i].attr in caches)
            inner = Refs(refs)
            inner.named = refs.named
            local = namer.copy()  # the loop's scope
            lines = []
            for idx in sorted(needed):
                if reads and idx in reads:
                    inner[idx] = f"{reads[idx]}[{slot}].v[{element}]"
                elif body[idx].op == "col_partial":  # the element's value, added to its column's sum below
                    inner[idx] = inner[body[idx].args[0]]
                else:
                    lines.append(self._instruction(idx, loads, local, inner))
            lines += [f"{held[idx]}[{slot}].v[{element}] = {inner[idx]};" for idx in keeps]
            refs.named = inner.named
            return {"lines": [line for line in lines if line], "refs": inner, "pre": pre, "declare": [], "stores": [],
                    "live": None}

        scope += per_row(0)
        sums = k.column_sums
        element_stores = [(a, at) for a, at in k.stores if a.present[-1] and (a, at) not in sums]
        rounds = range(1, schedule.reductions + 1)
        sets = list(schedule.passes)
        held: dict[int, str] = {}  # value -> the registers a resident row keeps it in
        keeps: list[tuple[int, ...]] = [()] * len(sets)
        if resident:
            sets, keeps = held_values(body, schedule)
            for idx in (i for kept_here in keeps for i in kept_here):
                held[idx] = namer.fresh("held")
                scope.append(f"fz_vec<{body[idx].type.compute.c}, {width}> {held[idx]}[{resident}];")
        # a pick of an input's element at a per-row index: one load a row, issued before the passes
        picks = self._indexed_picks(schedule, row, length, refs, namer) if not chunks else {}
        scope += picks.values()
        passes = []
        for round_ in rounds:
            reductions = [i for i, ins in enumerate(body) if ins.op in ROW_REDUCTIONS and schedule.rounds[i] == round_
                          and i not in picks]
            earlier = {i: held[i] for kept_here in keeps[:round_ - 1] for i in kept_here}
            loop = element_pass(sets[round_ - 1], earlier, keeps[round_ - 1])
            init, steps, combine, finish, post = [], [], [], [], None
            for idx in reductions:
                ins = body[idx]
                t = ins.type.compute.c
                acc = namer.fresh("acc")
                value = loop["refs"][ins.args[0]]
                if ins.op == "row_lse":  # a running (max, sum) pair, combined as such
                    pair = f"fz_lse<{t}>"
                    partial = partials.setdefault(pair, namer.fresh(f"partial_lse_{t}"))
                    init.append(f"{pair} {acc} = {{{float_const(-math.inf, ins.type.compute.bits == 64)}, ({t})0}};")
                    if resident:  # the thread's max first, then its sum from registers: no branch an element
                        kept_in, term = namer.fresh("lse_in"), namer.fresh("e")
                        scope.append(f"fz_vec<{t}, {width}> {kept_in}[{resident}];")
                        steps += [f"{kept_in}[{slot}].v[{element}] = {value};",
                                  f"{acc}.m = fz_max_op()({acc}.m, {value});"]
                        post = post or {"lines": [], "pre": [], "declare": [], "stores": [], "live": None, "after": []}
                        # With the thread's max finite no term is NaN; with it infinite or NaN every
                        # term is NaN or 0 (fz_lse_add skips the NaN ones): the sum is then 0, set once.
                        post["lines"] += [f"const {t} {term} = fz_exp_accurate({kept_in}[{slot}].v[{element}] - {acc}.m);",
                                          f"{acc}.s += {term};"]
                        post["after"].append(f"if ({acc}.m - {acc}.m != ({t})0) {acc}.s = ({t})0;  "
                                             "// a max not finite: each term NaN or 0")
                    else:
                        steps.append(f"fz_lse_add({acc}, {value});")
                    combine.append((acc, "fz_lse_op", partial, shared_slot()))
                    refs[idx] = namer.fresh("lse")
                    finish.append(f"const {t} {refs[idx]} = fz_lse_result({acc});")
                    continue
                partial = partials.setdefault(t, namer.fresh(f"partial_{t}"))
                if ins.op == "row_pick":  # one thread's element (the others' -0: -0 + x is x exactly)
                    index = loop["refs"][ins.args[1]]
                    init.append(f"{t} {acc} = -({t})0;")
                    steps.append(f"if ({col} == {index}) {acc} = {value};")
                    combine.append((acc, "fz_sum_op", partial, shared_slot()))
                    refs[idx] = namer.fresh("picked")
                    # every column is some thread's: the index inside the row is the one hit
                    finish.append(f"const {t} {refs[idx]} = {index} >= 0 && {index} < {length} ? {acc} : ({t})0;")
                    continue
                op = {"row_sum": "fz_sum_op", "row_max": "fz_max_op", "row_min": "fz_min_op"}[ins.op]
                # infinity as cexpr spells it: NVRTC has no <math.h> and its INFINITY
                double = ins.type.compute.bits == 64
                start = {"row_sum": f"({t})0", "row_max": float_const(-math.inf, double),
                         "row_min": float_const(math.inf, double)}[ins.op]
                init.append(f"{t} {acc} = {start};")
                steps.append(f"{acc} = {op}()({acc}, {value});")
                combine.append((acc, op, partial, shared_slot()))
                refs[idx] = acc
            passes.append({**loop, "init": init, "steps": steps, "post": post, "combine": combine,
                           "after": finish + per_row(round_)})
        earlier = {i: held[i] for kept_here in keeps[:-1] for i in kept_here}
        final = element_pass(sets[-1], earlier) if element_stores or sums else None
        if final is not None:
            final["live"] = live  # a group past the last row stores nothing
        if final is not None and width == 1:
            final["lines"] += [f"{self.buffers[a.buffer]}[{self.i}] = {self._stored(a.type, at, final['refs'])};"
                               for a, at in element_stores]
        elif final is not None:  # each element into its place in a vector, stored whole after the last
            out = {a.buffer: namer.fresh(f"{self.buffers[a.buffer]}_out") for a, _ in element_stores}
            final["declare"] = [f"fz_vec<{a.type.c}, {width}> {out[a.buffer]};" for a, _ in element_stores]
            final["lines"] += [f"{out[a.buffer]}.v[{element}] = {self._stored(a.type, at, final['refs'])};"
                               for a, at in element_stores]
            final["stores"] = [f"*reinterpret_cast<fz_vec<{a.type.c}, {width}>*>({self.buffers[a.buffer]} + {self.i}) "
                               f"= {out[a.buffer]};" for a, _ in element_stores]
        loop = _RowLoop(row, col, first, element, slot, thread, live, length, resident, width, at_once, block,
                        threads)
        chunked = self._column_sums(sums, final, loop, namer) if chunks else {}
        if ahead and chunks:  # the run's first row's vectors before the loop, each next row's at its top
            loaded = [a for a in cached if a.value in ahead]
            chunked["head"] += [f"fz_vec<{a.type.c}, {width}> {ahead[a.value]}[{resident}];" for a in loaded]
            first_row, start, end = chunked["first_row"], chunked["start"], chunked["end"]
            chunked["head"] += self._prefetch(loaded, ahead, first_row, start, end, loop, namer)
            scope += self._prefetch(loaded, ahead, f"{row} + {at_once}", start, end, loop, namer)
        rows = " * ".join(self.extents[j] for j in range(last)) or "1"
        stream = {}
        if rank and variant.grid.persistent:  # a persistent grid of clusters, each taking every clusters-th row
            index, clusters, it, parity = (namer.fresh(n) for n in ("cl", "clusters", "it", "parity"))
            loaded = [a for a in cached if a.value in ahead]
            stream = {"index": index, "clusters": clusters, "it": it, "parity": parity,
                      "head": [f"fz_vec<{a.type.c}, {width}> {ahead[a.value]}[{resident}];" for a in loaded]
                      + self._stream_loads(loaded, ahead, index, rows, loop, namer)}
            # the next row's vectors, issued before this row's reductions and barriers
            scope += self._stream_loads(loaded, ahead, f"{row} + {clusters}", rows, loop, namer)
        if width > 1:
            self.helpers.add("vec")
        if rank:
            self.helpers.add("clusters")
        row_stores = [f"{self.buffers[a.buffer]}[{row}] = {self._stored(a.type, at, refs)};"
                      for a, at in k.stores if not a.present[-1] and (a, at) not in sums]
        self.position = element_position
        # A row held in registers reads its place along the row; the others keep the
        # division (ptxas unrolls their loops further without it: 42 -> 54 registers
        # for add_rmsnorm_bf16's warp kernel, unmeasured on the GPU).
        return {"coords": self._row_element_coordinates(row, first or col) if resident else self.coords,
                "row": row, "col": col, "length": length, "scope": scope, "shared": bool(caches) and not resident,
                "resident": resident, "slot": slot, "threads": threads, "thread": thread,
                "cluster": cluster if rank else 0, "rank": rank, "block": block,
                "push": bool(rank) and cluster <= CLUSTER_PUSH_BLOCKS,
                # a block larger than any function can launch: ptxas to fit its registers to it
                "bounds": block if not warp and (block > BLOCK_SIZE or stream) else 0,
                # a streaming cluster's: its blocks an SM (its two sets of registers within their share)
                "min_blocks": max(1, CLUSTER_STREAM_THREADS // block) if stream else 1,
                "partials": [] if warp else [(t, name) for t, name in partials.items()],
                "cluster_slots": slots, "passes": passes, "grouped": grouped,
                "final": final, "row_stores": row_stores, "warp": warp, "lane": lane, "rows": rows, "live": live,
                "rows_per_block": variant.grid.rows_per_block, "max_row": variant.max_row,
                "vector": width, "first": first, "element": element, "chunked": chunked, "stream": stream}

    def _column_sums(self, sums, final: dict, loop: _RowLoop, namer: Namer) -> dict:
        """A row kernel's column sums (RowBlock.chunks): its block takes a run of
        rows in order, `at_once` rows at a time, and each column's sum is added
        up in the rows' order, from 0 (as ColumnReduce's). A row at a time, a
        thread adds its own columns' values of each row: in registers where it
        holds its row's vectors (the same columns in every row), else in the
        sums' array, each element read back and written by the thread that owns
        it. Several rows at a time, each row's values go into a tile in shared
        memory, from which a thread a column adds them up, the rows in order."""
        chunks = self.launch.form.chunks
        self.helpers.add("columns")
        body = self.k.body.instrs
        row, col, first, element, slot, thread, live, length = (
            loop.row, loop.col, loop.first, loop.element, loop.slot, loop.thread, loop.live, loop.length)
        resident, width, at_once, block, threads = loop.resident, loop.width, loop.at_once, loop.block, loop.threads
        chunk, per, start, end = (namer.fresh(n) for n in ("chunk", "per", "start", "end"))
        rows = " * ".join(self.extents[j] for j in range(len(self.k.extents) - 1)) or "1"
        head = [f"const long long {chunk} = blockIdx.x;",
                f"const long long {per} = ({rows} + {chunks - 1}) / {chunks};",
                f"const long long {start} = {chunk} * {per};",
                f"const long long {end} = {start} + {per} < {rows} ? {start} + {per} : {rows};"]
        zero, store, after = [], [], []
        if at_once == 1:
            opening = [f"for (long long {row} = {start}; {row} < {end}; ++{row}) {{"]
        else:
            group, base = namer.fresh("g"), namer.fresh("base")
            head += [f"const unsigned {group} = threadIdx.x / {threads}u;  // the block's row at a time",
                     f"const unsigned {thread} = threadIdx.x % {threads}u;  // the thread's place in it"]
            opening = [f"for (long long {base} = {start}; {base} < {end}; {base} += {at_once}) {{",
                       f"    const bool {live} = {base} + {group} < {end};",
                       f"    const long long {row} = {live} ? {base} + {group} : {end} - 1;"]
            # a thread's columns of the tile: threadIdx.x + j * block
            capacity = resident * threads * width  # the longest row a group holds
            held = -(-capacity // block)
            j, q = namer.fresh("j"), namer.fresh("q")
            after += ["__syncthreads();  // every row's values in the tile",
                      "#pragma unroll", f"for (int {j} = 0; {j} < {held}; ++{j}) {{",
                      f"    const long long {col} = threadIdx.x + {j} * {block}ll;",
                      f"    if ({col} >= {length}) break;",
                      f"    for (int {q} = 0; {q} < {at_once} && {base} + {q} < {end}; ++{q}) {{"]
            closing = ["    }", "}", "__syncthreads();  // the tile free again for the next rows"]
        for a, at in sums:
            t = body[at].type.compute.c
            array = self.buffers[a.buffer]
            value = final["refs"][at]
            out = f"{array}[{chunk} * {length} + {col}]"
            if at_once > 1:
                acc, tile = namer.fresh("colsum"), namer.fresh("tile")
                aligned = max(16, body[at].type.compute.itemsize * width)  # as its vectors (fz_vec's alignas)
                head += [f"__shared__ __align__({aligned}) {t} {tile}[{at_once * capacity}];  // each row's values at a time",
                         f"{t} {acc}[{held}] = {{}};  // zeros: the sums of the thread's columns"]
                # a vector's values written whole (one access, no bank conflicts between its elements)
                values = namer.fresh(f"{tile}_v")
                final["declare"].append(f"fz_vec<{t}, {width}> {values};")
                final["lines"].append(f"{values}.v[{element}] = {value};")
                final["stores"].append(f"*reinterpret_cast<fz_vec<{t}, {width}>*>({tile} + {group} * {capacity} + "
                                       f"{first}) = {values};")
                after.append(f"        {acc}[{j}] = fz_add_rn({acc}[{j}], {tile}[{q} * {capacity} + {col}]);")
                store += ["#pragma unroll", f"for (int {j} = 0; {j} < {held}; ++{j}) {{",
                          f"    const long long {col} = threadIdx.x + {j} * {block}ll;",
                          f"    if ({col} < {length}) {out} = {store_expr(a.type, f'{acc}[{j}]')};", "}"]
            elif resident:
                acc = namer.fresh("colsum")
                head.append(f"fz_vec<{t}, {width}> {acc}[{resident}] = {{}};  // zeros: the thread's columns' sums")
                mine = f"{acc}[{slot}].v[{element}]"
                final["lines"].append(f"{mine} = fz_add_rn({mine}, {value});")
                store.append(f"{out} = {store_expr(a.type, mine)};")
            elif width > 1:  # the thread's vector of each sum read, added to and written whole (coalesced)
                zero.append(f"{out} = ({t})0;")
                at_vector = f"{array} + {chunk} * {length} + {first}"
                vec = namer.fresh(f"{array}_v")
                final["pre"].append(f"fz_vec<{t}, {width}> {vec} = *reinterpret_cast<const fz_vec<{t}, {width}>*>("
                                    f"{at_vector});")
                final["lines"].append(f"{vec}.v[{element}] = fz_add_rn({vec}.v[{element}], {value});")
                final["stores"].append(f"*reinterpret_cast<fz_vec<{t}, {width}>*>({at_vector}) = {vec};")
            else:
                zero.append(f"{out} = ({t})0;")
                final["lines"].append(f"{out} = fz_add_rn({out}, {value});")
        if at_once > 1:
            after += closing
        return {"chunks": chunks, "head": head, "open": opening, "after": after, "zero": zero,
                "store": store if at_once == 1 else [], "store_lines": store if at_once > 1 else [],
                "first_row": start if at_once == 1 else f"{start} + {group}", "start": start, "end": end}

    def _prefetch(self, loaded, ahead: dict, row: str, start: str, end: str, loop: _RowLoop,
                  namer: Namer) -> list[str]:
        """Lines loading row `row`'s vectors of the arrays `loaded` into their
        `ahead` registers; past the run's last row (before `end`), that last row
        again, as a group past it computes it (where the run has rows: from `start`)."""
        slot, first, taken = namer.fresh("r"), namer.fresh("c"), namer.fresh("ahead_row")
        opening = [f"if ({start} < {end}) {{", f"    const long long {taken} = {row} < {end} ? {row} : {end} - 1;"]
        return self._vectors_ahead(loaded, ahead, opening, f"{taken} * {loop.length} + {first}", slot, first, loop)

    def _stream_loads(self, loaded, ahead: dict, row: str, rows: str, loop: _RowLoop, namer: Namer) -> list[str]:
        """Lines loading row `row`'s vectors of the arrays `loaded` (whole rows) into
        their `ahead` registers, where that row exists (a streaming cluster's next row)."""
        slot, first, at = namer.fresh("r"), namer.fresh("c"), namer.fresh("at")
        # the thread's first vector's place in the row once, each next vector a constant further
        opening = [f"if ({row} < {rows}) {{",
                   f"    const long long {at} = ({row}) * {loop.length} + (long long){loop.thread} * {loop.width};"]
        return self._vectors_ahead(loaded, ahead, opening, f"{at} + {slot} * {loop.threads * loop.width}", slot, first,
                                   loop)

    def _vectors_ahead(self, loaded, ahead: dict, opening: list[str], offset: str, slot: str, first: str,
                       loop: _RowLoop) -> list[str]:
        """Within `opening` (a condition and the row's place), the thread's vectors of
        the arrays `loaded` into their `ahead` registers: vector `slot`, starting at
        element `first` of the row, at `offset` in its array."""
        lines = opening + ["#pragma unroll", f"    for (int {slot} = 0; {slot} < {loop.resident}; ++{slot}) {{",
                           f"        const long long {first} = ((long long){slot} * {loop.threads} + {loop.thread}) "
                           f"* {loop.width};",
                           f"        if ({first} < {loop.length}) {{"]
        lines += [f"            {ahead[a.value]}[{slot}] = *reinterpret_cast<const fz_vec<{a.type.c}, {loop.width}>*>("
                  f"{self.buffers[a.buffer]} + {offset});" for a in loaded]
        return lines + ["        }", "    }", "}"]

    def _total_variant(self, chunks: int) -> dict:
        """A total over the rows (ColumnReduce.total): a block of `chunks` threads,
        thread c adding up, in order from 0, its run of ceil(rows / chunks)
        consecutive rows of each column sum (of one column); the runs' sums go to
        shared memory, and the first thread adds them up in order from 0 (or the
        runs' sums another kernel stored), then computes what reads the finished
        sums and stores each value at [0]. ColumnReduce's order, in one block."""
        k, namer = self.k, self._local_namer()
        body = k.body.instrs
        finish: set[int] = set()  # the finishes and what reads them: computed by the first thread
        users: dict[int, set[int]] = {}
        for idx, ins in enumerate(body):
            if ins.op == "col_sum" or any(a in finish for a in ins.args):
                finish.add(idx)
            for a in ins.args:
                users.setdefault(a, set()).add(idx)
        # loads only the finish reads: a run's sums another kernel stored, or a finished sum (one element)
        late = {idx for idx, ins in enumerate(body) if ins.op == "load" and ins.attr not in self.scalars
                and users.get(idx) and users[idx] <= finish}
        partials = [idx for idx, ins in enumerate(body) if ins.op == "col_partial"]
        if any(at not in finish and at not in partials for _, at in k.stores):
            raise AssertionError(f"{k.name}: a total's kernel stores only sums and what reads them")
        rows = self.extents[0]
        chunk, per, first, row, end, c = (namer.fresh(n) for n in ("chunk", "per", "first", "row", "end", "c"))
        loads = {a.value: load_expr(a.type, f"{self.buffers[a.buffer]}[{self.index(a)}]") for a in k.loads}
        refs = Refs()
        inner = namer.copy()  # the loop's scope
        lines = [self._instruction(idx, loads, inner, refs) for idx in range(len(body))
                 if idx not in finish and idx not in late and idx not in partials]
        accumulators = {idx: namer.fresh("acc") for idx in partials}
        runs = {idx: namer.fresh("runs") for idx in partials}
        stored = {at: a for a, at in k.stores}
        out = [f"__shared__ {body[idx].type.compute.c} {runs[idx]}[{chunks}];  // each run's sum" for idx in partials]
        out += [f"const long long {chunk} = threadIdx.x;  // the run of rows this thread adds up",
                f"const long long {per} = ({rows} + {chunks - 1}) / {chunks};",
                f"const long long {first} = {chunk} * {per} < {rows} ? {chunk} * {per} : {rows};",
                f"const long long {end} = {first} + {per} < {rows} ? {first} + {per} : {rows};"]
        out += [f"{body[idx].type.compute.c} {acc} = 0;" for idx, acc in accumulators.items()]
        if accumulators:
            out += ["#pragma unroll 4", f"for (long long {row} = {first}; {row} < {end}; ++{row}) {{",
                    f"    const long long {self.i} = {row};"]
            out += [f"    {line}" for line in lines if line]
            out += [f"    {acc} = fz_add_rn({acc}, {refs[body[idx].args[0]]});" for idx, acc in accumulators.items()]
            out.append("}")
        for idx, acc in accumulators.items():
            out.append(f"{runs[idx]}[{chunk}] = {acc};")
            if idx in stored:  # another kernel finishes it: the run's sum at [run]
                a = stored[idx]
                out.append(f"{self.buffers[a.buffer]}[{chunk}] = {store_expr(a.type, acc)};")
        out += ["__syncthreads();", "if (threadIdx.x != 0) return;",
                "// the runs' sums added up in order from 0, then what reads them"]
        finals = {a.value: load_expr(a.type, f"{self.buffers[a.buffer]}[0]") for a in k.loads}
        for idx in sorted(finish | late):
            ins = body[idx]
            if idx in late and users[idx] <= {j for j in finish if body[j].op == "col_sum"}:
                continue  # read by the finish below, a run at a time
            if ins.op == "col_sum":
                a = ins.args[0]
                if a in runs:
                    term = f"{runs[a]}[{c}]"
                else:  # the runs' sums another kernel stored
                    access = next(x for x in k.loads if x.value == body[a].attr)
                    term = load_expr(access.type, f"{self.buffers[access.buffer]}[{c}]")
                name = namer.fresh("total")
                refs[idx] = name
                out += [f"{ins.type.compute.c} {name} = 0;",
                        f"for (int {c} = 0; {c} < {chunks}; ++{c}) {name} = fz_add_rn({name}, {term});"]
            else:
                line = self._instruction(idx, finals, namer, refs)
                if line:
                    out.append(line)
        out += [f"{self.buffers[a.buffer]}[0] = {store_expr(a.type, refs[at])};" for a, at in k.stores
                if at in finish]
        self.helpers.add("columns")
        return {"lines": out}

    def _column_variant(self, chunks: int) -> dict:
        """A thread per column and run of rows (ColumnReduce): the body at each
        of the run's elements in order, each statement over the elements stored
        at the element, each column sum added up from 0 and stored at [chunk,
        column]. The element's index i is the row times the columns plus the
        column; broadcast operands read through the coordinates of i."""
        k, namer = self.k, self._local_namer()
        body = k.body.instrs
        sums = [idx for idx, ins in enumerate(body) if ins.op in COLUMN_OPS]
        self.helpers.add("columns")
        rows = self.extents[0]
        cols, blocks, chunk, col, per, first, row, end = (
            namer.fresh(n) for n in ("cols", "blocks", "chunk", "col", "per", "first", "row", "end"))
        loads = {a.value: load_expr(a.type, f"{self.buffers[a.buffer]}[{self.index(a)}]") for a in k.loads}
        refs = Refs()
        inner = namer.copy()  # the loop's scope
        lines = [self._instruction(idx, loads, inner, refs) for idx in range(len(body)) if idx not in sums]
        accumulators = {idx: namer.fresh("acc") for idx in sums}
        where = f"{chunk} * {cols} + {col}" if chunks > 1 else col
        element_stores = [f"{self.buffers[a.buffer]}[{self.index(a)}] = {self._stored(a.type, at, refs)};"
                          for a, at in k.stores if at not in accumulators]
        return {"rows": rows, "cols": cols, "chunks": chunks, "coords": self._column_coordinates(row, col, inner),
                "extent_product": " * ".join(self.extents[j] for j in range(1, len(k.extents))) or "1",
                "blocks": blocks, "chunk": chunk, "col": col, "per": per, "first": first, "row": row, "end": end,
                "accumulators": [(body[idx].type.compute.c, acc) for idx, acc in accumulators.items()],
                "lines": [line for line in lines if line] + element_stores,
                "steps": [f"{acc} = fz_add_rn({acc}, {refs[body[idx].args[0]]});" for idx, acc in accumulators.items()],
                "stores": [f"{self.buffers[a.buffer]}[{where}] = {store_expr(a.type, accumulators[at])};"
                           for a, at in k.stores if at in accumulators]}

    def _column_coordinates(self, row: str, col: str, namer: Namer) -> list[str]:
        """The coordinates `_coordinates` names, in a column kernel's loop: the first
        is the row, the others the thread's column's (i = row * cols + col; no
        division of i, and nothing that varies with the row but the row: broadcast
        operands read at the same place in every row)."""
        if not self.coords:
            return []
        names, rest, lines = self.coord_names, col, [f"// coordinates of {self.i}: its row, and its column's"]
        if 0 in names:
            lines.append(f"const long long {names[0]} = {row};")
        for j in range(len(self.k.extents) - 1, 0, -1):
            if j == 1:  # the outermost of the column's dims: what the divisions left
                if 1 in names:
                    lines.append(f"const long long {names[1]} = {rest};")
                break
            if j in names:
                lines.append(f"const long long {names[j]} = fz_rem({rest}, {self.extents[j]});")
            if not any(0 < d < j for d in names):
                break
            quotient = namer.fresh(f"r{j}")
            lines.append(f"const long long {quotient} = fz_quot({rest}, {self.extents[j]});")
            rest = quotient
        return lines

    def _row_coordinates(self, row: str, namer: Namer) -> tuple[list[str], dict[int, str]]:
        """The row's coordinates over the leading collapsed dims, outermost first,
        where a per-row access does not vary along every one of them."""
        lead = len(self.k.extents) - 1
        if all(all(a.present[:-1]) for a in self.k.loads if not a.present[-1]):
            return [], {}
        self.helpers.add("index")
        lines, names, rest = [], {}, row
        for j in range(lead - 1, 0, -1):
            names[j] = namer.fresh(f"r{j}")
            lines.append(f"const long long {names[j]} = fz_rem({rest}, {self.extents[j]});")
            quotient = namer.fresh(f"q{j}")
            lines.append(f"const long long {quotient} = fz_quot({rest}, {self.extents[j]});")
            rest = quotient
        names[0] = rest
        return lines, names

    def _indexed_picks(self, schedule, row: str, length: str, refs: Refs, namer: Namer) -> dict[int, str]:
        """The row kernel's picks (row_pick) that read an input array's element,
        as it is or widened to the accumulation type, at an index known before
        the row's first pass (a per-row value of round 0): each is one load a row,
        `x[row * length + index]`, and 0 where the index is outside the row (as
        the reference defines it), instead of a compare at every element and a
        combine. The line computing each, by instruction; its name is in `refs`."""
        body = self.k.body.instrs
        arrays = {a.value: a for a in self.k.loads if a.contiguous and a.present[-1]}
        out = {}
        for idx, at in indexed_picks(self.k, schedule).items():
            ins, source = body[idx], body[at]
            a, t, index = arrays[source.attr], ins.type.compute.c, refs[ins.args[1]]
            value = load_expr(a.type, f"{self.buffers[a.buffer]}[{row} * {length} + {index}]")
            refs[idx] = namer.fresh("picked")
            out[idx] = f"const {t} {refs[idx]} = {index} >= 0 && {index} < {length} ? ({t}){value} : ({t})0;"
        return out

    def _row_offset(self, access: Access, row: str, coordinates: dict[int, str]) -> str:
        """Offset of a per-row access (one that does not vary along the row): the
        row itself where it varies along every other dim, else from the row's coordinates."""
        lead = access.present[:-1]
        return row if all(lead) else self._offset(lead, coordinates)

    def _computation(self, loads: dict[str, str], namer: Namer,
                     mutable: set[int] = frozenset()) -> tuple[list[str | None], list[str]]:
        """One line per instruction, None where it is inlined (a constant, a
        scalar parameter); the `mutable` ones are variables, not constants."""
        refs = Refs()
        lines = [self._instruction(idx, loads, namer, refs, idx in mutable) for idx in range(len(self.k.body.instrs))]
        return lines, [refs[idx] for idx in range(len(lines))]

    def _instruction(self, idx: int, loads: dict[str, str], namer: Namer, refs: "Refs",
                     mutable: bool = False) -> str | None:
        """The line computing instruction `idx` from `refs` (None where it is
        inlined: a constant, a scalar parameter); records its name in `refs`."""
        body = self.k.body.instrs
        ins = body[idx]
        if ins.op == "const":
            refs[idx] = const(ins.attr, ins.type)
            return None
        if ins.op == "load" and ins.attr in self.scalars:
            refs[idx] = self.scalars[ins.attr]
            return None
        if ins.op == "position":
            refs[idx] = self.position
            return None
        if ins.op == "load":
            expr = loads[ins.attr]
        elif ins.op == "cast":
            src = body[ins.args[0]].type
            expr = cast_expr(src, ins.type, refs[ins.args[0]])
            if ins.type.is_int and src.is_float:
                self.helpers.add("f2i")
            if idx in self.stored_casts and not mutable:
                refs[idx] = expr
                return None
        elif ins.op == "pow" and ins.type.is_float and body[ins.args[1]].op == "const" and body[ins.args[1]].attr == 2:
            expr = f"{refs[ins.args[0]]} * {refs[ins.args[0]]}"  # x ** 2: exact (as NumPy's), where pow is not always
        else:
            operand_type = body[ins.args[0]].type if ins.args else ins.type
            if ins.op == "select":
                operand_type = body[ins.args[1]].type
            expr = op_expr(ins.op, ins.type, operand_type, [refs[a] for a in ins.args], self.fast_math)
            self.helpers.update(h for fn, h in HELPERS.items() if fn + "(" in expr)
        name = namer.fresh(f"v{refs.named}")
        refs.named += 1
        refs[idx] = name
        return f"{'' if mutable else 'const '}{ins.type.compute.c} {name} = {expr};"

    def _coordinates(self, i: str) -> tuple[list[str], dict[int, str]]:
        """Coordinates of the flat index in the collapsed space, outermost first."""
        if not self.k.needs_coordinates:
            return [], {}
        m = len(self.k.extents)
        needed = {j for a in self.k.loads if not a.contiguous for j in range(m) if a.present[j]}
        if self.k.has_position:  # row_position: the place along the last dim
            needed.add(m - 1)
        names = {j: self.namer.fresh(f"c{j}") for j in sorted(needed)}
        self.helpers.add("index")
        return [f"// coordinates of {i} in the collapsed space "
                f"[{', '.join(' * '.join(map(str, e)) for e in self.k.extents)}]",
                *self._coordinate_lines(i, m - 1, names)], names

    def _coordinate_lines(self, index: str, last: int, names: dict[int, str]) -> list[str]:
        """Lines naming the coordinates `names` (dim -> name) of `index`, a flat index
        over the collapsed dims 0 to `last`: a remainder per coordinate, a quotient per
        dim crossed, as far as the outermost one named."""
        lines, rest = [], index
        for j in range(last, 0, -1):
            if j in names:
                lines.append(f"const long long {names[j]} = fz_rem({rest}, {self.extents[j]});")
            if not any(k < j for k in names):
                return lines
            if j > 1:
                quotient = self.namer.fresh(f"r{j}")
                lines.append(f"const long long {quotient} = fz_quot({rest}, {self.extents[j]});")
                rest = quotient
            else:
                rest = f"fz_quot({rest}, {self.extents[j]})"
        if 0 in names:
            lines.append(f"const long long {names[0]} = {rest};")
        return lines

    def _row_element_coordinates(self, row: str, position: str) -> list[str]:
        """The coordinates `_coordinates` names, in a row kernel's loop: the last is the
        element's `position` along its row, the others the row's own (no division by
        the row's length where i = row * length + position)."""
        if not self.coords:
            return []
        last = len(self.k.extents) - 1
        along = [f"const long long {self.coord_names[last]} = {position};"] if last in self.coord_names else []
        leading = {j: name for j, name in self.coord_names.items() if j < last}
        return [f"// coordinates of {self.i}: its row's, and its place along the row", *along,
                *self._coordinate_lines(row, last - 1, leading)]

    def _comments(self) -> list[str]:
        k = self.k
        reads = ", ".join(a.buffer + ("" if a.contiguous else " (broadcast)") for a in k.loads) or "nothing"
        writes = ", ".join(a.buffer for a, _ in k.stores) or "nothing"
        return [f"reads {reads}; writes {writes}"]
