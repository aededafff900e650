"""The fusion pass: partitions a stage graph into kernels.

Each stage, in program order, joins the latest kernel it may join:
 - the kernel's iteration space must equal the stage's (every value then
   flows between stages at the same index, i.e. within one thread);
 - joining a kernel before the last one moves the stage up past the kernels
   in between, so it must not read what they produce nor write a buffer they
   read or write;
 - the merged kernel's register estimate must stay within the budget.
Values that only stages of the same kernel read stay in registers; a value
read by another kernel, or a pipeline result, is still stored. Every choice
is recorded as a `Decision` for the report.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fusec.ir.program import fmt_shape
from fusec.ir.stages import Decision, Stage, StageGraph
from fusec.passes.build_kernel import build_kernel
from fusec.passes.liveness import live_stages
from fusec.passes.variants import kernel_registers
from fusec.target import default_max_regs


@dataclass(frozen=True, slots=True)
class FusionOptions:
    fuse: bool = True
    max_regs: int = field(default_factory=default_max_regs)  # registers per thread a kernel may use


@dataclass(frozen=True, slots=True)
class Partition:
    groups: tuple[tuple[int, ...], ...]   # stage indices per kernel, in launch order
    stored: tuple[frozenset[str], ...]    # values each kernel writes to memory
    decisions: tuple[Decision, ...]
    # Per loop of the graph: its kernels (group indices), and whether they are one
    # persistent kernel iterating in registers (else they are launched `count` times).
    loops: tuple[tuple[tuple[int, ...], bool], ...] = ()


def fuse(graph: StageGraph, options: FusionOptions = FusionOptions()) -> Partition:
    stages = graph.stages
    if not options.fuse:
        groups = [[i] for i in range(len(stages))]
        decisions = [Decision(s.name, i, False, "unfused form: one kernel per stage") for i, s in enumerate(stages)]
        loops = tuple((tuple(range(loop.start, loop.stop)), False) for loop in graph.loops)
        return Partition(tuple(map(tuple, groups)), tuple(frozenset(s.outputs) for s in stages), tuple(decisions),
                         loops)

    live = live_stages(graph)
    producer = {v: i for i, s in enumerate(stages) for v in s.outputs}
    readers: dict[str, set[int]] = {}
    for j in live:
        for v in stages[j].reads():
            readers.setdefault(v, set()).add(j)
    # Pipeline results, what a loop reads from its buffers when it starts, and each
    # iteration's exit values (the next iteration reads them from memory).
    must_store = set(graph.results) | set(graph.loop_inputs) | {e for lp in graph.loops for _, e in lp.carried}
    groups: list[list[int]] = []
    decisions: list[Decision] = []
    for i, stage in enumerate(stages):
        if i not in live:
            decisions.append(Decision(stage.name, -1, False, "dropped: nothing the pipeline returns reads it"))
            continue
        refusals: list[str] = []
        joined = None
        for k in range(len(groups) - 1, -1, -1):
            members = [stages[j] for j in groups[k]]
            if graph.loop_of(groups[k][0]) != graph.loop_of(i):
                refusals.append(f"not fused with k{k}: a 'repeat' boundary lies between them")
                break
            if members[0].shape != stage.shape:
                refusals.append(f"not fused with k{k}: iteration space {fmt_shape(stage.shape)} differs from "
                                f"{fmt_shape(members[0].shape)}")
            else:
                candidate = build_kernel(graph, members + [stage], _stored(graph, readers, must_store, groups[k] + [i]))
                regs = kernel_registers(candidate)
                if regs > options.max_regs:
                    refusals.append(f"not fused with k{k}: estimated {regs} registers "
                                    f"> budget {options.max_regs}")
                    break
                joined = k
                decisions.append(Decision(stage.name, k, True,
                                          f"fused into k{k} ({_relation(stage, members, producer)})"))
                break
            conflict = _conflict(graph, stage, members)
            if conflict:
                refusals.append(f"cannot move before k{k}: {conflict}")
                break
        if joined is None:
            groups.append([i])
            reason = "; ".join(refusals) if refusals else "first stage"
            decisions.append(Decision(stage.name, len(groups) - 1, False, f"starts k{len(groups) - 1} ({reason})"))
        else:
            groups[joined].append(i)
            decisions.extend(Decision(stage.name, joined, False, r) for r in refusals)
    loops = []
    for n, loop in enumerate(graph.loops):
        members = tuple(k for k, g in enumerate(groups) if graph.loop_of(g[0]) == n)
        # One kernel for the whole body: it iterates in registers, a persistent kernel.
        body = [j for j in range(loop.start, loop.stop) if j in live]
        loops.append((members, len(members) == 1 and len(groups[members[0]]) == len(body)))
        if not loops[-1][1] and members:
            decisions.append(Decision(stages[loop.start].name, members[0], False,
                                      f"repeat body is {len(members)} kernels, launched {loop.count} times: "
                                      "not one persistent kernel"))
    return Partition(tuple(map(tuple, groups)), tuple(_stored(graph, readers, must_store, g) for g in groups),
                     tuple(decisions), tuple(loops))


def _stored(graph: StageGraph, readers: dict[str, set[int]], must_store: set[str],
            group: list[int]) -> frozenset[str]:
    """Values produced in the group that must reach memory: those in `must_store`,
    and those a stage outside the group reads (`readers`: value -> stages reading it)."""
    inside = set(group)
    produced = [v for j in group for v in graph.stages[j].outputs]
    return frozenset(v for v in produced if v in must_store or readers.get(v, set()) - inside)


def _relation(stage: Stage, members: list[Stage], producer: dict[str, int]) -> str:
    made_here = {v: s for s in members for v in s.outputs}
    for v in sorted(stage.reads()):
        if v in made_here:
            return f"vertical: reads {v} from {made_here[v].name}"
    for v in sorted(stage.reads()):
        for s in members:
            if v in s.reads() and v not in producer:
                return f"sibling: shares input {v} with {s.name}"
    return "horizontal: same iteration space, no shared data"


def _conflict(graph: StageGraph, stage: Stage, members: list[Stage]) -> str:
    """Why `stage` cannot be moved before these stages, or ''."""
    written = {v: s for s in members for v in s.outputs}
    for v in sorted(stage.reads()):
        if v in written:
            return f"reads {v}, which {written[v].name} produces"
    its_buffers = {graph.value(v).buffer for v in stage.outputs}
    for s in members:
        touched = {graph.value(v).buffer for v in s.reads() | set(s.outputs)}
        for buf in sorted(its_buffers & touched):
            return f"writes {buf}, which {s.name} also uses"
    return ""
