"""Launch planning: a partition of the stage graph -> the `LaunchInterface`.

The one place that decides each kernel's form, its variants and its
parameters, and copies the pipeline's call signature out of the IR.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from fusec.codegen.names import Namer
from fusec.ir.kernels import Kernel
from fusec.ir.launch import (
    ArrayArg,
    ColumnReduce,
    ConstArg,
    Extent,
    Form,
    KernelLaunch,
    KernelParam,
    LaunchInterface,
    MultiTensor,
    NumElements,
    PointerTable,
    RegisterLoop,
    RepeatSteps,
    RowBlock,
    ScalarArg,
    Temporary,
    WorkItemCount,
    WorkItems,
    call_signature,
)
from fusec.ir.program import Pipeline
from fusec.ir.stages import Loop, StageGraph
from fusec.passes.build_kernel import build_kernel
from fusec.passes.cost import nominal_dims, nominal_elements, nominal_row, predict, target_costs
from fusec.passes.forms import count_of, form_of
from fusec.passes.fusion import Partition, observed_registers
from fusec.passes.liveness import live_stages, needed_after
from fusec.passes.variants import plan_variants, variant_for_rows
from fusec.types import I64


@dataclass(frozen=True, slots=True)
class PlanOptions:
    fused: bool
    max_regs: int | None
    arch: str
    grid_stride: bool = False   # every kernel grid-stride over a device-filling grid (`--persistent`)
    multi_tensor: bool = False  # the pipeline's one kernel over many sets of arrays (foreach)
    observed: tuple = ()        # passes.guard.Observation: real registers of kernels compiled before
    fast_math: bool = False


class PlanError(ValueError):
    """The pipeline cannot take the form asked for (e.g. foreach of several kernels)."""


def plan_launches(pipeline: Pipeline, graph: StageGraph, partition: Partition, options: PlanOptions) -> LaunchInterface:
    loop_kernels = {members[0]: n for n, (members, one) in enumerate(partition.loops) if one}
    live = live_stages(graph)
    kernels: list[Kernel] = []
    loops: dict[int, Loop] = {}
    for k, (group, stored) in enumerate(zip(partition.groups, partition.stored)):
        stages = [graph.stages[i] for i in group]
        # Deterministic names; a one-stage kernel also carries the stage's name.
        name = f"{graph.pipeline}_k{k}" + (f"_{stages[0].name}" if len(stages) == 1 else "")
        if k in loop_kernels:
            loops[k] = graph.loops[loop_kernels[k]]
            kernel = build_kernel(graph, stages, needed_after(graph, loops[k], live), name, loop=loops[k])
        else:
            kernel = build_kernel(graph, stages, set(stored), name)
        kernels.append(replace(kernel, decisions=tuple(d for d in partition.decisions if d.kernel == k)))
    signature = call_signature(pipeline, _temporaries(pipeline, kernels))
    slots = {name: i for i, name in enumerate(signature.slot_names)}
    steps = _steps(graph, partition, loop_kernels, slots)
    if options.multi_tensor:
        _check_multi_tensor(graph, kernels, steps)
    costs = target_costs(options.arch, options.fast_math)
    observed = observed_registers(options.observed)
    dims = nominal_dims(stage.shape for stage in graph.stages)
    launches = []
    for k, kernel in enumerate(kernels):
        form = form_of(kernel, options.multi_tensor, options.grid_stride, loops.get(k), slots)
        variants = plan_variants(kernel, form, slots.__getitem__, costs, observed.get(tuple(partition.groups[k])))
        iterations = form.count if isinstance(form, RegisterLoop) and isinstance(form.count, int) else 1
        priced = variant_for_rows(variants, nominal_row(kernel, dims))
        prediction = predict(kernel, priced, nominal_elements(kernel.shape, dims), costs, iterations)
        launches.append(KernelLaunch(kernel, form, variants, _params(kernel, form, slots), prediction))
    notes = tuple(d for d in partition.decisions if d.kernel < 0)
    return LaunchInterface(signature, tuple(launches), steps, options.fused, options.max_regs, options.arch, notes,
                           options.fast_math)


def _check_multi_tensor(graph: StageGraph, kernels: list[Kernel], steps: tuple) -> None:
    pipeline = graph.pipeline
    if any(k.rows or k.columns for k in kernels):
        raise PlanError(f"foreach needs an elementwise pipeline; {pipeline} has a reduction")
    if any(k.has_position for k in kernels):  # each set's own rows: not one place along a dim
        raise PlanError(f"foreach needs an elementwise pipeline of values alone; {pipeline} reads row_position")
    if len(kernels) != 1 or steps != (0,) or graph.loops:
        raise PlanError(f"foreach needs a pipeline that fuses into one kernel; {pipeline} has "
                        f"{len(kernels)} kernels (or a repeat)")
    if not all(a.contiguous for a in kernels[0].loads):
        raise PlanError(f"foreach needs every array of {pipeline} over the same elements "
                        "(no broadcasting, no repeat)")


def _temporaries(pipeline: Pipeline, kernels: list[Kernel]) -> tuple[Temporary, ...]:
    """The arrays a call allocates for its kernels: values one kernel stores and another loads."""
    declared = {s.name for s in pipeline.params} | {s.name for s in pipeline.outputs}
    found: dict[str, Temporary] = {}
    for kernel in kernels:
        for access in kernel.accesses:
            if access.buffer not in declared and access.buffer not in found:
                slot = pipeline.slot(access.buffer)
                found[access.buffer] = Temporary(slot.name, slot.type, slot.shape)
    return tuple(found.values())


def _params(kernel: Kernel, form: Form, slots: dict[str, int]) -> tuple[KernelParam, ...]:
    """The kernel's parameters, in order: its arrays (loads first), its scalars, then sizes."""
    namer = Namer()
    written = {a.buffer for a, _ in kernel.stores}
    params: list[KernelParam] = []
    seen: set[str] = set()
    for access in kernel.accesses:
        if access.buffer in seen:
            continue
        seen.add(access.buffer)
        const = "" if access.buffer in written else "const "
        pointer = f"{const}{access.type.c}*"
        name = namer.user(access.buffer)
        if isinstance(form, MultiTensor):  # a table of the array's address in every set
            params.append(KernelParam(f"{pointer} const*", namer.fresh(f"{name}_ptrs"),
                                      PointerTable(slots[access.buffer])))
        else:
            params.append(KernelParam(pointer, name, ArrayArg(slots[access.buffer])))
    types = {ins.attr: ins.type for ins in kernel.body.instrs if ins.op == "load"}
    for scalar in kernel.scalars:  # passed in its compute type (an f16 scalar as a float)
        packed = types[scalar].compute
        params.append(KernelParam(f"const {packed.c}", namer.user(scalar), ScalarArg(slots[scalar]), packed))
    size = "const long long"
    if isinstance(form, MultiTensor):
        return tuple(params) + (KernelParam("const long long*", namer.fresh("table"), WorkItems()),
                                KernelParam(size, namer.fresh("chunks"), WorkItemCount(), I64))
    params.append(KernelParam(size, namer.fresh("n"), NumElements(), I64))
    # Every extent: a column kernel's rows, columns and coordinates; a row kernel's
    # rows (the warp-per-row variant bounds its rows by them), length and coordinates.
    if isinstance(form, (ColumnReduce, RowBlock)):
        return tuple(params) + tuple(KernelParam(size, namer.fresh(f"e{j}"), Extent(j), I64)
                                     for j in range(len(kernel.extents)))
    if isinstance(form, RegisterLoop):
        count = form.count
        params.append(KernelParam(size, namer.fresh("count"), ConstArg(count) if isinstance(count, int) else count, I64))
    if kernel.needs_coordinates:
        params += [KernelParam(size, namer.fresh(f"e{j}"), Extent(j), I64) for j in range(1, len(kernel.extents))]
    return tuple(params)


def _steps(graph: StageGraph, partition: Partition, loop_kernels: dict[int, int], slots: dict[str, int]) -> tuple:
    """The launch order: kernels in order, a loop's kernels as one RepeatSteps (unless one loop kernel)."""
    in_loop = {k: n for n, (members, _) in enumerate(partition.loops) for k in members}
    steps, done = [], set()
    for k in range(len(partition.groups)):
        if k in loop_kernels or k not in in_loop:
            steps.append(k)
        elif in_loop[k] not in done:
            done.add(in_loop[k])
            loop = graph.loops[in_loop[k]]
            steps.append(RepeatSteps(count_of(loop.count, slots), partition.loops[in_loop[k]][0]))
    return tuple(steps)
