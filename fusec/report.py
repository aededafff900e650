"""What the compiler decided, for people: the JSON report, the table, the IR dump.

The report reads the launch interface alone: one entry per kernel, listing
exactly the variants the module emits, each with its own register estimate
(and, once a backend has loaded them, what the compiled functions really use).
"""
from __future__ import annotations

from fusec.ir.launch import (
    ColumnGrid,
    ColumnReduce,
    DeviceFillGrid,
    ElementGrid,
    Elementwise,
    GridStride,
    KernelLaunch,
    LaunchInterface,
    MultiTensor,
    RegisterLoop,
    RowGrid,
    RowBlock,
    WorkItemGrid,
    unhandled,
)
from fusec.ir.program import fmt_shape
from fusec.target import BLOCK_SIZE


def form_name(launch: KernelLaunch) -> str:
    match launch.form:
        case Elementwise():
            return "elementwise"
        case GridStride():
            return "grid_stride"
        case RegisterLoop(count):
            return f"register_loop ({count if isinstance(count, int) else 'a count given at call time'} times)"
        case MultiTensor():
            return "multi_tensor"
        case RowBlock():
            return "rows"
        case ColumnReduce(chunks, total=True):
            return f"total ({chunks} runs of rows, one block, finished in it)"
        case ColumnReduce(chunks):
            return "columns" if chunks == 1 else f"column_partials ({chunks} runs of rows)"
        case form:
            unhandled(form)


def _grid_name(grid) -> str:
    match grid:
        case ElementGrid():
            return "elements"
        case DeviceFillGrid():
            return "device_fill"
        case WorkItemGrid():
            return "work_items"
        case RowGrid(rows_per_block, threads, cluster, chunks):
            if chunks:
                return f"a run of rows a block of {threads}, {rows_per_block} at a time ({chunks} runs)"
            if cluster and grid.persistent:
                return f"clusters of {cluster} blocks of {threads} (as many as run at once), each streaming its rows"
            if cluster:
                return f"a cluster of {cluster} blocks of {threads} per row"
            if rows_per_block > 1:
                lanes = BLOCK_SIZE // rows_per_block
                return f"a warp per row ({rows_per_block} a block)" if lanes == 32 else \
                    f"{lanes} lanes per row ({rows_per_block} a block)"
            return f"a block of {threads} per row" if threads else "a block per row"
        case ColumnGrid(chunks, total=True):
            return f"one block of {chunks}, a thread a run of rows"
        case ColumnGrid(chunks):
            return "columns" if chunks == 1 else f"columns x {chunks}"
        case _:
            unhandled(grid)


def kernel_report(interface: LaunchInterface, launch: KernelLaunch, backend=None) -> dict:
    """One kernel: its form, its variants, traffic per element, and why it was formed."""
    kernel = launch.kernel
    slots = interface.signature.slot_names
    variants = []
    for v in launch.variants:
        entry = {"name": v.name, "elements_per_thread": v.elements_per_thread, "grid": _grid_name(v.grid),
                 "est_regs": v.est_regs, "alignment": {slots[slot]: size for slot, size in v.alignment}}
        if v.max_row is not None:  # the runtime's choice by the row's length
            entry["max_row"] = v.max_row
        if v.row_resident:
            entry["row_resident"] = v.row_resident
        if hasattr(backend, "attributes"):  # compiled: the function's real registers and local memory
            entry.update(backend.attributes(v.name))
        variants.append(entry)
    return {
        "pipeline": interface.pipeline,
        "name": kernel.name,
        "module": "fused" if interface.fused else "unfused",
        "form": form_name(launch),
        "stages": list(kernel.stages),
        "iteration_space": fmt_shape(kernel.shape),
        "est_regs": launch.variants[0].est_regs,  # of the variant tried first
        "variants": variants,
        "max_regs": interface.max_regs,
        "arch": interface.arch,
        # Minimum traffic per element of the iteration space; a broadcast operand
        # is re-read from cache, so it is listed apart and not counted.
        "bytes_read": sum(a.type.itemsize for a in kernel.loads if a.contiguous),
        "bytes_written": sum(a.type.itemsize for a, _ in kernel.stores),
        "reads": [a.buffer for a in kernel.loads if a.contiguous],
        "broadcast_reads": [a.buffer for a in kernel.loads if not a.contiguous],
        "writes": [a.buffer for a, _ in kernel.stores],
        "fusion": [f"{d.stage}: {d.reason}" for d in kernel.decisions],
        "predicted_us": round(launch.prediction.us, 1) if launch.prediction else None,
        "prediction": launch.prediction.describe() if launch.prediction else None,
    }


def report(interface: LaunchInterface, backend=None) -> list[dict]:
    rows = [kernel_report(interface, k, backend) for k in interface.kernels]
    if rows and interface.notes:  # decisions about no kernel (a dropped statement), with the first
        rows[0]["fusion"] = [f"{d.stage}: {d.reason}" for d in interface.notes] + rows[0]["fusion"]
    return rows


def traffic(interface: LaunchInterface) -> int:
    """Bytes per element of the pipeline's widest iteration space: the kernels over
    that space (a kernel over a smaller one, such as a per-column producer,
    moves a vanishing share per element and is not counted)."""
    widest = _widest(interface)
    return sum(r["bytes_read"] + r["bytes_written"] for r, k in zip(report(interface), interface.kernels)
               if k.kernel.shape == widest)


def _widest(interface: LaunchInterface):
    shapes = [k.kernel.shape for k in interface.kernels]
    return max(shapes, key=len, default=())


def table(fused: LaunchInterface, unfused: LaunchInterface) -> str:
    rows = report(fused)
    lines = [f"pipeline {fused.pipeline}: {len(rows)} kernel{'s' if len(rows) != 1 else ''} fused, "
             f"{len(unfused.kernels)} unfused"]
    header = ("kernel", "stages", "regs", "read B/el", "written B/el", "predicted at 2^26")
    body = [(r["name"], ", ".join(r["stages"]),
             f"{r['est_regs']}" + (f"/{r['max_regs']}" if r["max_regs"] is not None else ""), str(r["bytes_read"]),
             str(r["bytes_written"]), f"{r['predicted_us']} µs ({_bound(r)})") for r in rows]
    widths = [max(len(row[c]) for row in [header] + body) for c in range(len(header))]
    for row in [header] + body:
        lines.append("  " + "  ".join(cell.ljust(w) if c < 2 else cell.rjust(w)
                                      for c, (cell, w) in enumerate(zip(row, widths))))
    fused_bytes, unfused_bytes = traffic(fused), traffic(unfused)
    ratio = f"{unfused_bytes / fused_bytes:.2f}x less" if fused_bytes else "no traffic"
    lines.append(f"  traffic: {fused_bytes} B/element fused, {unfused_bytes} B/element unfused ({ratio})")
    smaller = [k.name for k in fused.kernels if k.kernel.shape != _widest(fused)]
    if smaller:
        lines.append(f"  not counted per element (over a smaller iteration space): {', '.join(smaller)}")
    for r, launch in zip(rows, fused.kernels):
        if isinstance(launch.form, RowBlock):  # the strategy the runtime takes, by the row's length
            lines.append(f"  {r['name']}: the first of these that a call's rows allow")
            lines += [f"    {v.name}: {_row_variant(v)}" for v in launch.variants]
    lines.append("  fusion decisions:")
    lines += [f"    {line}" for r in rows for line in r["fusion"]]
    return "\n".join(lines)


def _row_variant(v) -> str:
    """A row kernel's variant as the report names it: strategy, vectors, cache, when taken."""
    parts = [_grid_name(v.grid)]
    if v.row_resident:
        parts.append(f"the row held in registers ({v.row_resident} vector{'s' * (v.row_resident > 1)} a thread)")
    if v.max_row is not None:
        parts.append(f"rows of at most {v.max_row} elements")
    if v.elements_per_thread > 1:
        parts.append(f"{v.elements_per_thread}-element vectors (a length of whole vectors, arrays aligned)")
    if v.row_cache:
        parts.append(f"the row kept in shared memory where it fits ({v.row_cache} B an element)")
    return ", ".join(parts)


def format_ir(compiled) -> str:
    """The stage graph and the kernels, as text (`fusec compile --emit ir`)."""
    g = compiled.graph
    out = [f"pipeline {g.pipeline}"]
    for v in g.values:
        shape = fmt_shape(v.shape) if v.shape is not None else "scalar"
        out.append(f"  value {v.name}: {v.type} {shape} ({v.role}, buffer {v.buffer})")
    for s in g.stages:
        out.append(f"  stage {s.name} over {fmt_shape(s.shape)} -> {', '.join(s.outputs)}")
        for idx, ins in enumerate(s.body.instrs):
            operands = [str(ins.attr)] if ins.attr is not None else []
            operands += [f"%{a}" for a in ins.args]
            out.append(f"    %{idx} = {ins.op} {', '.join(operands)} : {ins.type}")
        out.append(f"    results {', '.join(f'%{r}' for r in s.body.results)}")
    for loop in g.loops:
        body = ", ".join(s.name for s in g.stages[loop.start:loop.stop]) or "(empty)"
        carried = ", ".join(f"{lv} <- {ev}" for lv, ev in loop.carried)
        out.append(f"  repeat {loop.count}: {body}; carries {carried or '(nothing)'}")
    out.append(f"  results {', '.join(g.results) or '(none)'}")
    for launch in compiled.interface.kernels:
        stored = ", ".join(a.value for a, _ in launch.kernel.stores)
        variants = ", ".join(v.name for v in launch.variants)
        out.append(f"  kernel {launch.name}: {', '.join(launch.kernel.stages)}; stores {stored or '(nothing)'}; "
                   f"{form_name(launch)}; variants {variants}")
    return "\n".join(out) + "\n"


def _bound(row: dict) -> str:
    return row["prediction"].split("(")[1].split(":")[0] if row["prediction"] else "-"
