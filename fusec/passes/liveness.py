"""Which stages of a stage graph compute something the pipeline's results depend on.

A statement whose value nobody reads (a dead temporary, or every statement of
a pipeline with no outputs) is dropped from the fused form: a kernel that
stores nothing has no effect. The unfused form keeps one kernel per statement.
"""
from __future__ import annotations

import functools

from fusec.ir.stages import Loop, StageGraph


def live_stages(graph: StageGraph) -> frozenset[int]:
    """Stage indices whose outputs reach a pipeline result, through other stages or around a loop."""
    return _liveness(graph)[0]


def live_values(graph: StageGraph) -> frozenset[str]:
    """The values a pipeline result depends on (a loop value's entry and exit values with it)."""
    return _liveness(graph)[1]


@functools.lru_cache(maxsize=256)
def _liveness(graph: StageGraph) -> tuple[frozenset[int], frozenset[str]]:
    producer = {v: i for i, s in enumerate(graph.stages) for v in s.outputs}
    # A loop value is what the slot holds when an iteration starts: its entry value
    # (before the first) and its exit value (after each) are live when it is.
    feeds = {}
    for loop in graph.loops:
        for (loop_value, exit_value), entry in zip(loop.carried, loop.entries):
            feeds[loop_value] = (exit_value, entry)
    live_values: set[str] = set()
    live: set[int] = set()
    work = list(graph.results)
    while work:
        value = work.pop()
        if value in live_values:
            continue
        live_values.add(value)
        work.extend(feeds.get(value, ()))
        stage = producer.get(value)
        if stage is not None and stage not in live:
            live.add(stage)
            work.extend(graph.stages[stage].reads())
    return frozenset(live), frozenset(live_values)


def needed_after(graph: StageGraph, loop: Loop, live: frozenset[int]) -> set[str]:
    """A loop's values that must reach memory: pipeline results, read by live
    stages after it, or the entry value of a later loop's live value (that loop
    reads it from the slot's buffer when it starts)."""
    later = {v for j in range(loop.stop, len(graph.stages)) if j in live for v in graph.stages[j].reads()}
    alive = live_values(graph)
    later |= {entry for other in graph.loops if other.start >= loop.stop
              for (loop_value, _), entry in zip(other.carried, other.entries) if loop_value in alive}
    return {lv for lv, _ in loop.carried if lv in graph.results or lv in later}
