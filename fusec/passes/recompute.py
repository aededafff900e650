"""Recomputing a producer in its readers instead of storing what it computes.

A statement whose values only other statements read (a temporary) costs a
store and, in each reader's kernel, a load; over a smaller iteration space (a
per-column scale read by every row) it is also a kernel of its own, with its
launch. Computing it again inside each reader costs its arithmetic once per
element of the reader instead. The cost model weighs the two: each candidate
producer, in program order, is recomputed where the whole pipeline's best
partition is then predicted faster, and kept otherwise; the decisions say
which and by how much.

The rewrite substitutes the producer's body into every statement that reads
its values (reading the producer's inputs in their place) and removes it from
the graph. It is taken only where that computes the same values: the producer
and its readers are outside `repeat` loops, none of its values must reach
memory, and no statement between it and its last reader writes a buffer it
reads.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from fusec.ir.program import Body, BodyBuilder, Instr
from fusec.ir.stages import Decision, Loop, Stage, StageGraph
from fusec.passes.build_kernel import live_only
from fusec.passes.partitions import Context

if TYPE_CHECKING:
    from fusec.passes.fusion import Best

# A rewrite is kept where it is predicted faster by more than this share: at or below
# it the model cannot tell them apart, and storing is the simpler kernel.
RECOMPUTE_MARGIN = 0.001


def recompute(graph: StageGraph, best: Callable[[StageGraph], "Best"]) -> tuple[StageGraph, list[Decision]]:
    """The graph with the producers worth recomputing substituted into their
    readers, and a decision for each candidate: a producer whose values the
    best partition stores for another kernel. `best(graph)`: the fusion pass's
    pick for a graph (fusion.best_partition)."""
    decisions: list[Decision] = []
    current = best(graph)
    index = 0
    while index < len(graph.stages):
        producer = graph.stages[index]
        readers = _readers(graph, index) if set(producer.outputs) & current.stored else None
        if readers is None:
            index += 1
            continue
        rewritten = substitute(graph, index)
        after = best(rewritten)
        names = [graph.stages[r].name for r in readers]
        ops = sum(1 for ins in producer.body.instrs if ins.op not in ("load", "const"))
        if set(names) & after.over_cap:
            why = f"stored, not recomputed in {', '.join(names)}: that would put a kernel over the register cap"
        elif after.us < current.us * (1 - RECOMPUTE_MARGIN):
            decisions.append(Decision(producer.name, -1, True,
                                      f"recomputed in {', '.join(names)} ({ops} ops an element) instead of stored: "
                                      f"{after.us:.1f} µs predicted against {current.us:.1f} µs"))
            graph, current = rewritten, after
            continue
        else:
            why = (f"stored, not recomputed in {', '.join(names)}: {current.us:.1f} µs predicted against "
                   f"{after.us:.1f} µs recomputing its {ops} ops an element")
        decisions.append(Decision(producer.name, -1, False, why))
        index += 1
    return graph, decisions


def _readers(graph: StageGraph, index: int) -> list[int] | None:
    """The stages that read stage `index`'s values, where recomputing it in them
    computes the same values; None where it may not be recomputed."""
    ctx = Context.of(graph)
    producer = graph.stages[index]
    if index not in ctx.live or graph.loop_of(index) >= 0 or set(producer.outputs) & ctx.must_store \
            or producer.reduce:
        return None
    readers = sorted(j for j, s in enumerate(graph.stages) if set(producer.outputs) & s.reads())
    if not readers or any(graph.loop_of(j) >= 0 for j in readers):
        return None
    read_buffers = {graph.value(v).buffer for v in producer.reads()}
    for j in range(index + 1, readers[-1] + 1):
        if {graph.value(v).buffer for v in graph.stages[j].outputs} & read_buffers:
            return None  # a later statement overwrites what the producer read
    return readers


def substitute(graph: StageGraph, index: int) -> StageGraph:
    """`graph` with stage `index`'s body computed inside every stage that reads
    its values, and the stage (and its values) removed."""
    producer = graph.stages[index]
    stages = []
    for j, stage in enumerate(graph.stages):
        if j == index:
            continue
        if set(producer.outputs) & stage.reads():
            stage = replace(stage, body=_inlined(producer, stage))
        stages.append(stage)
    values = tuple(v for v in graph.values if v.name not in producer.outputs)
    loops = tuple(_shifted(loop, index) for loop in graph.loops)
    return replace(graph, stages=tuple(stages), values=values, loops=loops)


def _inlined(producer: Stage, reader: Stage) -> Body:
    """The reader's body with each load of the producer's values replaced by the
    producer's computation of it (shared where the reader loads several)."""
    b = BodyBuilder()
    made = dict(zip(producer.outputs, producer.body.results))
    computed: list[int] = []
    for ins in producer.body.instrs:
        computed.append(b.emit(replace(ins, args=tuple(computed[a] for a in ins.args))))
    ids: list[int] = []
    for ins in reader.body.instrs:
        if ins.op == "load" and ins.attr in made:
            ids.append(computed[made[ins.attr]])
        else:
            ids.append(b.emit(Instr(ins.op, tuple(ids[a] for a in ins.args), ins.type, ins.attr, loc=ins.loc)))
    results = [ids[r] for r in reader.body.results]
    body, remap = live_only(b.build(results), results)  # drops what the reader does not use
    return Body(body.instrs, tuple(remap[r] for r in results))


def _shifted(loop: Loop, removed: int) -> Loop:
    """A loop's stage range once stage `removed` (outside it) is gone."""
    if removed < loop.start:
        return replace(loop, start=loop.start - 1, stop=loop.stop - 1)
    return loop
