"""Launch planning: a partition of the stage graph -> the `ModulePlan` to emit and run."""
from __future__ import annotations

from dataclasses import replace

from fusec.ir.kernels import Buffer, ModulePlan, RepeatSteps
from fusec.ir.stages import StageGraph
from fusec.passes.build_kernel import build_kernel
from fusec.passes.fusion import Partition


def plan_module(graph: StageGraph, partition: Partition, *, fused: bool, max_regs: int,
                persistent: bool = False) -> ModulePlan:
    """persistent: every kernel in its grid-stride form over a grid that fills the device."""
    loop_kernels = {members[0]: n for n, (members, one) in enumerate(partition.loops) if one}
    kernels = []
    for k, (group, stored) in enumerate(zip(partition.groups, partition.stored)):
        stages = [graph.stages[i] for i in group]
        # Deterministic names; a one-stage kernel also carries the stage's name.
        name = f"{graph.pipeline}_k{k}" + (f"_{stages[0].name}" if len(stages) == 1 else "")
        if k in loop_kernels:
            loop = graph.loops[loop_kernels[k]]
            kernel = build_kernel(graph, stages, _needed_after(graph, loop), name, loop=loop)
        else:
            kernel = build_kernel(graph, stages, set(stored), name, persistent=persistent)
        decisions = tuple(d for d in partition.decisions if d.kernel == k)
        kernels.append(replace(kernel, decisions=decisions))
    buffers: dict[str, Buffer] = {}
    for kernel in kernels:
        for access in list(kernel.loads) + [a for a, _ in kernel.stores]:
            value = graph.value(access.value)
            buffers.setdefault(value.buffer, Buffer(value.buffer, value.type, value.shape, value.role))
    return ModulePlan(graph.pipeline, fused, tuple(kernels), tuple(buffers.values()), max_regs,
                      _steps(graph, partition, loop_kernels))


def _needed_after(graph: StageGraph, loop) -> set[str]:
    """Loop values that must reach memory: pipeline results, or read by stages after the loop."""
    later = {v for s in graph.stages[loop.stop:] for v in s.reads()}
    return {lv for lv, _ in loop.carried if lv in graph.results or lv in later}


def _steps(graph: StageGraph, partition: Partition, loop_kernels: dict[int, int]) -> tuple:
    """The launch order: kernels in order, a loop's kernels as one Repeat (unless one loop kernel)."""
    in_loop = {k: n for n, (members, _) in enumerate(partition.loops) for k in members}
    steps, done = [], set()
    for k in range(len(partition.groups)):
        if k in loop_kernels or k not in in_loop:
            steps.append(k)
        elif in_loop[k] not in done:
            done.add(in_loop[k])
            steps.append(RepeatSteps(graph.loops[in_loop[k]].count, partition.loops[in_loop[k]][0]))
    return tuple(steps)
