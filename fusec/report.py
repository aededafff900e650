"""What the compiler decided, for people: the JSON report, the table, the IR dump."""
from __future__ import annotations

from fusec.compiler import Compiled
from fusec.ir.kernels import Kernel
from fusec.ir.program import fmt_shape


def kernel_report(compiled: Compiled, kernel: Kernel) -> dict:
    """One kernel: its stages, the register estimate, traffic per element, and why it was formed."""
    return {
        "pipeline": compiled.plan.pipeline,
        "name": kernel.name,
        "form": "fused" if compiled.plan.fused else "unfused",
        "stages": list(kernel.stages),
        "iteration_space": fmt_shape(kernel.shape),
        "est_regs": kernel.est_regs,
        "variants": [kernel.name, f"{kernel.name}_v{kernel.vector}"],
        "vector_elements": kernel.vector,
        "max_regs": compiled.plan.max_regs,
        # Minimum traffic per element of the iteration space; a broadcast operand
        # is re-read from cache, so it is listed apart and not counted.
        "bytes_read": sum(a.type.itemsize for a in kernel.loads if a.contiguous),
        "bytes_written": sum(a.type.itemsize for a, _ in kernel.stores),
        "reads": [a.buffer for a in kernel.loads if a.contiguous],
        "broadcast_reads": [a.buffer for a in kernel.loads if not a.contiguous],
        "writes": [a.buffer for a, _ in kernel.stores],
        "fusion": [f"{d.stage}: {d.reason}" for d in kernel.decisions],
    }


def report(compiled: Compiled) -> list[dict]:
    return [kernel_report(compiled, k) for k in compiled.plan.kernels]


def traffic(compiled: Compiled) -> int:
    """Bytes per element summed over the kernels (exact when they share one iteration space)."""
    return sum(r["bytes_read"] + r["bytes_written"] for r in report(compiled))


def table(fused: Compiled, unfused: Compiled) -> str:
    rows = report(fused)
    lines = [f"pipeline {fused.plan.pipeline}: {len(rows)} kernel{'s' if len(rows) != 1 else ''} fused, "
             f"{len(unfused.plan.kernels)} unfused"]
    header = ("kernel", "stages", "regs", "read B/el", "written B/el")
    body = [(r["name"], ", ".join(r["stages"]), f"{r['est_regs']}/{r['max_regs']}", str(r["bytes_read"]),
             str(r["bytes_written"])) for r in rows]
    widths = [max(len(row[c]) for row in [header] + body) for c in range(len(header))]
    for row in [header] + body:
        lines.append("  " + "  ".join(cell.ljust(w) if c < 2 else cell.rjust(w)
                                      for c, (cell, w) in enumerate(zip(row, widths))))
    fused_bytes, unfused_bytes = traffic(fused), traffic(unfused)
    ratio = f"{unfused_bytes / fused_bytes:.2f}x less" if fused_bytes else "no traffic"
    lines.append(f"  traffic: {fused_bytes} B/element fused, {unfused_bytes} B/element unfused ({ratio})")
    lines.append("  fusion decisions:")
    lines += [f"    {line}" for r in rows for line in r["fusion"]]
    return "\n".join(lines)


def format_ir(compiled: Compiled) -> str:
    """The stage graph and the partition, as text (`fusec compile --emit ir`)."""
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
    for kernel in compiled.plan.kernels:
        stored = ", ".join(a.value for a, _ in kernel.stores)
        loop = f"; iterates {kernel.count} times in registers" if kernel.count is not None else ""
        out.append(f"  kernel {kernel.name}: {', '.join(kernel.stages)}; stores {stored or '(nothing)'}{loop}")
    return "\n".join(out) + "\n"
