"""Kernels and the module plan: the IR after planning (`passes.plan`).

The kernels to emit, each with the values it loads and stores, and the
buffers and launches a runtime needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fusec.ir.program import Body, Dim, Shape
from fusec.ir.stages import Decision, _by_name
from fusec.types import ScalarType


@dataclass(frozen=True, slots=True)
class Access:
    """A load or store of one value by a kernel.

    `present` has one flag per collapsed dim of the kernel's iteration space:
    whether the value varies along it (False: broadcast along that dim).
    """

    value: str
    buffer: str
    type: ScalarType
    present: tuple[bool, ...]

    @property
    def contiguous(self) -> bool:
        return all(self.present)


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    stages: tuple[str, ...]
    shape: Shape                          # iteration space
    extents: tuple[tuple[Dim, ...], ...]  # collapsed dims, each a product of dims
    body: Body                            # loads first, then computation
    loads: tuple[Access, ...]
    stores: tuple[tuple[Access, int], ...]  # (where, body instruction stored)
    scalars: tuple[str, ...]              # scalar values read (by name)
    est_regs: int
    vector: int = 1                       # elements per thread of the 16-byte vector variant
    decisions: tuple[Decision, ...] = field(default=())
    # A persistent loop kernel: the body runs `count` times per element in
    # registers; `carried` pairs each loop value's load with its exit value
    # (body instructions), the load standing for the variable the loop updates.
    count: int | str | None = None
    carried: tuple[tuple[int, int], ...] = ()
    persistent: bool = False              # grid-stride over a grid that just fills the device
    multi_tensor: bool = False            # foreach: many sets of arrays in one launch, by (tensor, chunk)


@dataclass(frozen=True, slots=True)
class Buffer:
    """Memory a launch touches: a parameter, an output, or a temporary the plan allocates."""

    name: str
    type: ScalarType
    shape: Shape
    role: str


@dataclass(frozen=True, slots=True)
class RepeatSteps:
    """Kernels launched `count` times in a row (a repeat body not made one persistent kernel)."""

    count: int | str
    kernels: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModulePlan:
    pipeline: str
    fused: bool
    kernels: tuple[Kernel, ...]
    buffers: tuple[Buffer, ...]   # every array buffer any kernel touches
    max_regs: int
    steps: tuple["int | RepeatSteps", ...] = ()  # the launch order: a kernel's index, or a Repeat

    def buffer(self, name: str) -> Buffer:
        return _by_name(self.buffers, name)


@dataclass(frozen=True, slots=True)
class KernelParam:
    """One parameter of an emitted kernel, in order: how the runtime fills it.

    kind: "array" (key = buffer), "scalar" (key = value name), "numel" (the
    number of elements of the iteration space), "count" (a loop kernel's
    iterations: key = a literal or a scalar's name), "extent" (key = index of
    a collapsed dim).
    """

    kind: str
    key: str | int
    type: ScalarType | None = None
    written: bool = False


# A multi-tensor kernel's work item: elements [start, end) of one tensor set,
# [start, vector_end) of them in 16-byte vectors (the set's arrays are aligned)
# and the rest one per thread.
WORK_ITEM = ("set", "start", "vector_end", "end")


def kernel_params(kernel: Kernel) -> list[KernelParam]:
    """A multi-tensor kernel takes, per array, a table of pointers (kind
    "pointers", one per tensor set), then "table" (the work items, four
    integers each: see `WORK_ITEM`) and "chunks" (their number)."""
    params: dict[str, KernelParam] = {}
    written = {a.buffer for a, _ in kernel.stores}
    kind = "pointers" if kernel.multi_tensor else "array"
    for access in list(kernel.loads) + [a for a, _ in kernel.stores]:
        params.setdefault(access.buffer, KernelParam(kind, access.buffer, access.type, access.buffer in written))
    out = list(params.values())
    types = {ins.attr: ins.type for ins in kernel.body.instrs if ins.op == "load"}
    out += [KernelParam("scalar", name, types[name]) for name in kernel.scalars]
    if kernel.multi_tensor:
        return out + [KernelParam("table", "table"), KernelParam("chunks", "chunks")]
    out.append(KernelParam("numel", "n"))
    if kernel.count is not None:
        out.append(KernelParam("count", kernel.count))
    if needs_coordinates(kernel):
        out += [KernelParam("extent", j) for j in range(1, len(kernel.extents))]
    return out


def needs_coordinates(kernel: Kernel) -> bool:
    """Whether some operand is read along only some dims (a broadcast needing index arithmetic)."""
    return any(any(a.present) and not all(a.present) for a in kernel.loads)


def vector_alignment(kernel: Kernel) -> list[tuple[str, int]]:
    """(buffer, bytes) each array must be aligned to for the vector variant:
    every access that moves a whole vector."""
    if kernel.persistent and not kernel.multi_tensor:  # one form only: no vector variant to align for
        return []
    inner = len(kernel.extents) - 1
    out = []
    for access in list(kernel.loads) + [a for a, _ in kernel.stores]:
        if access.contiguous or access.present[inner]:
            out.append((access.buffer, kernel.vector * access.type.itemsize))
    return out


def variant_names(kernel: Kernel) -> tuple[str, str]:
    """The emitted functions: (one element per thread, one 16-byte vector per thread).
    A loop kernel has one form, grid-stride over a persistent grid."""
    if kernel.multi_tensor:
        return f"{kernel.name}_mt", f"{kernel.name}_mt"
    if kernel.persistent:
        return kernel.name, kernel.name
    return kernel.name, f"{kernel.name}_v{kernel.vector}"
