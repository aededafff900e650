"""The compiler driver: the passes, listed once, in order.

    checked IR --lower--> StageGraph --row reciprocals--> StageGraph --recompute--> StageGraph
        --fuse--> Partition --plan--> LaunchInterface --emit--> CUDA C

(The derived backward and the torch peers start from `lower`'s graph: they print
and run the source's arithmetic, not the kernels' division by a reciprocal.)

`compile_pipeline` runs them all and keeps every stage's output, so that
`fusec compile --emit ir|report|cuda` can show any of them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from fusec.codegen.emit import emit_module
from fusec.ir.launch import LaunchInterface, in_memory_scalars, with_scalars_in_memory
from fusec.ir.program import Program
from fusec.ir.stages import StageGraph
from fusec.passes.fusion import FUSE_MODES, FusionOptions, Partition, best_partition, fuse
from fusec.passes.lower import lower
from fusec.passes.plan import PlanOptions, plan_launches
from fusec.passes.recompute import recompute
from fusec.passes.row_reciprocals import divide_by_row_reciprocals
from fusec.target import DEFAULT_ARCH, check_arch, check_max_regs


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """What a user may choose; every entry point (CLI, `fusec.jit`, `fusec bench`) builds one."""

    fuse: bool | str = "auto"    # "auto" (the cost model decides), "all", "none"; True and False mean auto and none
    max_regs: int | None = None  # a register cap on every fused kernel; None: the cost model alone decides
    arch: str = DEFAULT_ARCH
    persistent: bool = False     # every kernel grid-stride over a device-filling grid
    multi_tensor: bool = False   # the pipeline's one kernel, over many sets of arrays (foreach)
    partition: tuple[tuple[int, ...], ...] | None = None  # stage indices per kernel, chosen elsewhere (tuning)
    observed: tuple = ()  # passes.guard.Observation: real registers of kernels compiled before
    fast_math: bool = False  # f32 functions as their hardware approximations; denormals flushed (README)
    # Float scalars the kernels read from device memory (a 0-d float64 array each call: ScalarInMemory),
    # by name, or True for every float scalar; the default () passes every scalar by value.
    scalars_in_memory: bool | tuple[str, ...] = ()

    def __post_init__(self):
        check_arch(self.arch)
        if self.max_regs is not None:
            check_max_regs(self.max_regs)
        mode = {True: "auto", False: "none"}.get(self.fuse, self.fuse) if isinstance(self.fuse, bool) else self.fuse
        if mode not in FUSE_MODES:
            raise ValueError(f"fuse: expected one of {', '.join(FUSE_MODES)} (or True/False), got {self.fuse!r}")
        object.__setattr__(self, "fuse", mode)
        if isinstance(self.scalars_in_memory, (list, str)):
            names = [self.scalars_in_memory] if isinstance(self.scalars_in_memory, str) else self.scalars_in_memory
            object.__setattr__(self, "scalars_in_memory", tuple(names))

    def auto_fusion(self) -> FusionOptions:
        """The fusion pass's options for ranking this compile's partitions as the
        auto mode does (its cap, target, fast math and observed registers)."""
        return FusionOptions(mode="auto", max_regs=self.max_regs, arch=self.arch, fast_math=self.fast_math,
                             observed=self.observed)


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
    graph = divide_by_row_reciprocals(lower(program, pipeline))
    fusion = FusionOptions(mode=options.fuse, max_regs=options.max_regs, arch=options.arch, fast_math=options.fast_math)
    recomputed: list = []
    if options.fuse == "auto":
        graph, recomputed = recompute(graph, functools.partial(best_partition, options=fusion))
    partition = fuse(graph, replace(fusion, groups=options.partition, observed=options.observed))
    partition = replace(partition, decisions=tuple(recomputed) + partition.decisions)
    interface = plan_launches(pipeline, graph, partition,
                              PlanOptions(fused=options.fuse != "none", max_regs=options.max_regs, arch=options.arch,
                                          grid_stride=options.persistent, multi_tensor=options.multi_tensor,
                                          observed=options.observed, fast_math=options.fast_math))
    if options.scalars_in_memory:
        interface = with_scalars_in_memory(interface, in_memory_scalars(interface.signature, options.scalars_in_memory))
    return Compiled(program, graph, partition, interface, emit_module(interface, program.source.name))
