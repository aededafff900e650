"""The compiler driver: the passes, listed once, in order.

    checked IR --lower--> StageGraph --fuse--> Partition --plan--> ModulePlan --emit--> CUDA C

`compile_pipeline` runs them all and keeps every stage's output, so that
`fusec compile --emit ir|report|cuda` can show any of them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from fusec.codegen.emit import emit_module
from fusec.ir.kernels import ModulePlan
from fusec.ir.program import Program
from fusec.ir.stages import StageGraph
from fusec.passes.fusion import DEFAULT_MAX_REGS, FusionOptions, Partition, fuse
from fusec.passes.lower import lower
from fusec.passes.plan import plan_module


@dataclass(frozen=True, slots=True)
class CompileOptions:
    fuse: bool = True
    max_regs: int = DEFAULT_MAX_REGS
    persistent: bool = False  # every kernel grid-stride over a device-filling grid
    multi_tensor: bool = False  # the one kernel of the pipeline, over many sets of arrays (foreach)


@dataclass(frozen=True, slots=True)
class Compiled:
    """One pipeline, compiled: every stage's output."""

    program: Program
    graph: StageGraph
    partition: Partition
    plan: ModulePlan
    cuda: str


def multi_tensor_plan(plan: ModulePlan) -> ModulePlan:
    """The plan's one kernel as a multi-tensor kernel, or a ValueError saying why it cannot be."""
    if len(plan.kernels) != 1 or plan.steps not in ((0,), ()):
        raise ValueError(f"foreach needs a pipeline that fuses into one kernel; {plan.pipeline} has "
                         f"{len(plan.kernels)} kernels (or a repeat)")
    (kernel,) = plan.kernels
    if kernel.count is not None or not all(a.contiguous for a in kernel.loads):
        raise ValueError(f"foreach needs every array of {plan.pipeline} over the same elements "
                         "(no broadcasting, no repeat)")
    return replace(plan, kernels=(replace(kernel, multi_tensor=True, persistent=True),))


def compile_pipeline(program: Program, name: str, options: CompileOptions = CompileOptions()) -> Compiled:
    graph = lower(program, program.pipeline(name))
    partition = fuse(graph, FusionOptions(fuse=options.fuse, max_regs=options.max_regs))
    plan = plan_module(graph, partition, fused=options.fuse, max_regs=options.max_regs,
                       persistent=options.persistent)
    if options.multi_tensor:
        plan = multi_tensor_plan(plan)
    cuda = emit_module(plan, program.source.name)
    return Compiled(program, graph, partition, plan, cuda)
