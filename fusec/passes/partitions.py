"""Candidate partitions of a stage graph into kernels, and what makes one legal.

A partition groups the live stages into kernels. A stage may join a kernel if
its iteration space is the kernel's and no `repeat` boundary lies between
them; joining a kernel before the last moves the stage up past the kernels in
between, so it must not read what they produce nor write a buffer they touch.

Two generators: `greedy` (each stage, in program order, joins the latest
kernel it may join and `accept` allows: under a register cap, or unlimited for
--fuse all) and `segments` (the cheapest split of each run of stages into
consecutive kernels, by dynamic programming over a price per group).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fusec.ir.program import fmt_shape
from fusec.ir.stages import Decision, Stage, StageGraph
from fusec.passes.liveness import live_stages

Group = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Context:
    """What every candidate of one graph shares."""

    graph: StageGraph
    live: frozenset[int]
    producer: dict[str, int]
    readers: dict[str, frozenset[int]]   # value -> live stages reading it
    must_store: frozenset[str]           # results, loop entries, loop exit values

    @staticmethod
    def of(graph: StageGraph) -> "Context":
        live = live_stages(graph)
        producer = {v: i for i, s in enumerate(graph.stages) for v in s.outputs}
        readers: dict[str, set[int]] = {}
        for j in live:
            for v in graph.stages[j].reads():
                readers.setdefault(v, set()).add(j)
        # Pipeline results, what a loop reads from its buffers when it starts, and each
        # iteration's exit values (the next iteration reads them from memory).
        must_store = set(graph.results) | set(graph.loop_inputs) | {e for lp in graph.loops for _, e in lp.carried}
        return Context(graph, live, producer, {v: frozenset(r) for v, r in readers.items()}, frozenset(must_store))

    def stored(self, group: Group) -> frozenset[str]:
        """Values produced in the group that must reach memory: results, loop
        values, and those a stage outside the group reads."""
        inside = set(group)
        produced = [v for j in group for v in self.graph.stages[j].outputs]
        return frozenset(v for v in produced if v in self.must_store or self.readers.get(v, frozenset()) - inside)

    def dropped(self) -> list[Decision]:
        return [Decision(s.name, -1, False, "dropped: nothing the pipeline returns reads it")
                for i, s in enumerate(self.graph.stages) if i not in self.live]


# accept(group so far, the stage joining) -> None (it may join) or why not
Accept = Callable[[Group, int], "str | None"]


def greedy(ctx: Context, accept: Accept) -> tuple[list[list[int]], list[Decision]]:
    """Each live stage joins the latest kernel it may join; the reasons of every choice."""
    graph, stages = ctx.graph, ctx.graph.stages
    groups: list[list[int]] = []
    decisions: list[Decision] = []
    for i, stage in enumerate(stages):
        if i not in ctx.live:
            continue
        refusals: list[str] = []
        joined = None
        for k in range(len(groups) - 1, -1, -1):
            members = [stages[j] for j in groups[k]]
            if graph.loop_of(groups[k][0]) != graph.loop_of(i):
                refusals.append(f"not fused with k{k}: a 'repeat' boundary lies between them")
                break
            if members[0].space != stage.space:
                refusals.append(f"not fused with k{k}: {_space_difference(stage, members[0])}")
            else:
                refused = accept(tuple(groups[k]), i)
                if refused:
                    refusals.append(f"not fused with k{k}: {refused}")
                    break
                joined = k
                decisions.append(Decision(stage.name, k, True, f"fused into k{k} ({relation(ctx, stage, members)})"))
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
    return groups, decisions


def segments(ctx: Context, price: Callable[[Group], float]) -> list[list[int]]:
    """The cheapest split of each run of live stages (same iteration space, same
    loop, consecutive in program order) into consecutive kernels."""
    graph = ctx.graph
    order = [i for i in range(len(graph.stages)) if i in ctx.live]
    runs: list[list[int]] = []
    for i in order:
        if runs and graph.stages[runs[-1][-1]].space == graph.stages[i].space \
                and graph.loop_of(runs[-1][-1]) == graph.loop_of(i):
            runs[-1].append(i)
        else:
            runs.append([i])
    groups: list[list[int]] = []
    for run in runs:
        best = [0.0] + [float("inf")] * len(run)
        cut = [0] * (len(run) + 1)
        for end in range(1, len(run) + 1):
            for start in range(end):
                total = best[start] + price(tuple(run[start:end]))
                if total < best[end]:
                    best[end], cut[end] = total, start
        pieces, end = [], len(run)
        while end > 0:
            pieces.append(run[cut[end]:end])
            end = cut[end]
        groups += reversed(pieces)
    return groups


def illegal(ctx: Context, groups: list[list[int]]) -> str | None:
    """Why launching `groups` in order (each kernel running its stages in program
    order) would not compute what the program says, or None where it would."""
    graph, stages = ctx.graph, ctx.graph.stages
    kernel_of = {}
    for k, group in enumerate(groups):
        if not group:
            return f"kernel {k} is empty"
        for i in group:
            if i in kernel_of or i not in ctx.live:
                return f"stage {i} is {'in two kernels' if i in kernel_of else 'dead'}"
            kernel_of[i] = k
        first = stages[group[0]]
        for i in group[1:]:
            if stages[i].space != first.space or graph.loop_of(i) != graph.loop_of(group[0]):
                return f"stages {group[0]} and {i} differ in iteration space or loop"
    if set(kernel_of) != set(ctx.live):
        return "not every live stage is in a kernel"
    order = sorted(kernel_of)
    for a_pos, a in enumerate(order):
        for b in order[a_pos + 1:]:
            if kernel_of[a] <= kernel_of[b]:
                continue  # runs before (or with) b, as in the program
            if _conflict(graph, stages[b], [stages[a]]) or set(stages[a].reads()) & set(stages[b].outputs):
                return f"stage {stages[b].name} would run before {stages[a].name}, which it depends on"
    return None


def decisions_for(ctx: Context, groups: list[list[int]]) -> list[Decision]:
    """Why each stage is in its kernel, for a partition found by `segments`."""
    stages = ctx.graph.stages
    out = []
    for k, group in enumerate(groups):
        for n, i in enumerate(group):
            if n == 0:
                out.append(Decision(stages[i].name, k, False, f"starts k{k}"))
            else:
                members = [stages[j] for j in group[:n]]
                out.append(Decision(stages[i].name, k, True,
                                    f"fused into k{k} ({relation(ctx, stages[i], members)})"))
    return out


def relation(ctx: Context, stage: Stage, members: list[Stage]) -> str:
    made_here = {v: s for s in members for v in s.outputs}
    for v in sorted(stage.reads()):
        if v in made_here:
            return f"vertical: reads {v} from {made_here[v].name}"
    for v in sorted(stage.reads()):
        for s in members:
            if v in s.reads() and v not in ctx.producer:
                return f"sibling: shares input {v} with {s.name}"
    return "horizontal: same iteration space, no shared data"


def _space_difference(stage: Stage, other: Stage) -> str:
    finish = next((s for s in (stage, other) if s.space[0] == "columns"), None)
    if finish is not None:
        return f"{finish.name} finishes a column sum over its partial sums: a kernel of its own"
    per_row = next((s for s in (stage, other) if s.reduce == "col_partial" and not s.rows), None)
    if per_row is not None and (stage.rows or other.rows):
        return (f"{per_row.name} sums values of {fmt_shape(per_row.shape)} over the rows: a row kernel takes "
                "column sums only of its rows' elements")
    if stage.rows != other.rows and (stage.rows or other.rows):
        lead, length = stage.rows or other.rows
        return (f"iteration space {fmt_shape(stage.shape)} differs from {fmt_shape(other.shape)}, and only "
                f"{fmt_shape(lead + (length,))} and {fmt_shape(lead + (1,))} share a row kernel")
    return f"iteration space {fmt_shape(stage.shape)} differs from {fmt_shape(other.shape)}"


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


def neighbours(ctx: Context, groups: list[list[int]]) -> list[list[list[int]]]:
    """Every legal partition one move from `groups`: a stage moved to the kernel
    before or after its own, a kernel split in two, or two neighbouring kernels merged."""
    out = []
    for k, group in enumerate(groups):
        for i in group:
            for other in (k - 1, k + 1):
                if 0 <= other < len(groups):
                    moved = [list(g) for g in groups]
                    moved[k].remove(i)
                    moved[other] = sorted(moved[other] + [i])
                    out.append([g for g in moved if g])
        for cut in range(1, len(group)):
            out.append(groups[:k] + [group[:cut], group[cut:]] + groups[k + 1:])
        if k + 1 < len(groups):
            out.append(groups[:k] + [sorted(group + groups[k + 1])] + groups[k + 2:])
    unique = {tuple(map(tuple, p)): p for p in out if illegal(ctx, p) is None}
    unique.pop(tuple(map(tuple, groups)), None)
    return list(unique.values())


def random_partition(ctx: Context, rng) -> list[list[int]]:
    """Each run of stages (as `segments` sees them) cut at random places."""
    graph = ctx.graph
    groups: list[list[int]] = []
    for i in sorted(ctx.live):
        same = groups and graph.stages[groups[-1][-1]].space == graph.stages[i].space \
            and graph.loop_of(groups[-1][-1]) == graph.loop_of(i)
        if same and rng.random() < 0.6:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
