"""The compiler driver: the passes, listed once, in order.

    checked IR --lower--> StageGraph --fuse--> Partition --plan--> LaunchInterface --emit--> CUDA C

`compile_pipeline` runs them all and keeps every stage's output, so that
`fusec compile --emit ir|report|cuda` can show any of them.
"""
from __future__ import annotations

from dataclasses import dataclass

from fusec.codegen.emit import emit_module
from fusec.ir.launch import LaunchInterface
from fusec.ir.program import Program
from fusec.ir.stages import StageGraph
from fusec.passes.fusion import FusionOptions, Partition, fuse
from fusec.passes.lower import lower
from fusec.passes.plan import PlanOptions, plan_launches
from fusec.target import DEFAULT_ARCH, check_arch, check_max_regs, default_max_regs


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """What a user may choose; every entry point (CLI, `fusec.jit`, `fusec bench`) builds one."""

    fuse: bool = True
    max_regs: int | None = None  # the fusion budget; None: the target's default for `arch`
    arch: str = DEFAULT_ARCH
    persistent: bool = False     # every kernel grid-stride over a device-filling grid
    multi_tensor: bool = False   # the pipeline's one kernel, over many sets of arrays (foreach)

    def __post_init__(self):
        check_arch(self.arch)
        if self.max_regs is not None:
            check_max_regs(self.max_regs)

    @property
    def budget(self) -> int:
        return self.max_regs if self.max_regs is not None else default_max_regs(self.arch)


@dataclass(frozen=True, slots=True)
class Compiled:
    """One pipeline, compiled: every stage's output."""

    program: Program
    graph: StageGraph
    partition: Partition
    interface: LaunchInterface
    cuda: str


def compile_pipeline(program: Program, name: str, options: CompileOptions = CompileOptions()) -> Compiled:
    pipeline = program.pipeline(name)
    graph = lower(program, pipeline)
    partition = fuse(graph, FusionOptions(fuse=options.fuse, max_regs=options.budget))
    interface = plan_launches(pipeline, graph, partition,
                              PlanOptions(fused=options.fuse, max_regs=options.budget, arch=options.arch,
                                          grid_stride=options.persistent, multi_tensor=options.multi_tensor))
    return Compiled(program, graph, partition, interface, emit_module(interface, program.source.name))
