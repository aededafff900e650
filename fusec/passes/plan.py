"""Launch planning: a partition of the stage graph -> the `ModulePlan` to emit and run."""
from __future__ import annotations

from dataclasses import replace

from ..plan import Buffer, ModulePlan, StageGraph
from .fusion import Partition
from .kernel import build_kernel


def plan_module(graph: StageGraph, partition: Partition, *, fused: bool, max_regs: int) -> ModulePlan:
    kernels = []
    for k, (group, stored) in enumerate(zip(partition.groups, partition.stored)):
        stages = [graph.stages[i] for i in group]
        # Deterministic names; a one-stage kernel also carries the stage's name.
        name = f"{graph.pipeline}_k{k}" + (f"_{stages[0].name}" if len(stages) == 1 else "")
        kernel = build_kernel(graph, stages, set(stored), name)
        decisions = tuple(d for d in partition.decisions if d.kernel == k)
        kernels.append(replace(kernel, decisions=decisions))
    buffers: dict[str, Buffer] = {}
    for kernel in kernels:
        for access in list(kernel.loads) + [a for a, _ in kernel.stores]:
            value = graph.value(access.value)
            buffers.setdefault(value.buffer, Buffer(value.buffer, value.type, value.shape, value.role))
    return ModulePlan(graph.pipeline, fused, tuple(kernels), tuple(buffers.values()), max_regs)
