"""The launch interface: the one contract between the compiler and everything after it.

The planning pass (`passes.plan`) produces a `LaunchInterface` per pipeline;
the CUDA emitter, the sim launcher, the report and the runtimes read it and
nothing else. Per kernel it fixes:

- its **form**, one of a closed set (`Form`): how its threads map onto the
  elements. A consumer dispatches on the form's type (`match`), so a new kind
  (the row reductions to come) is a new class in the `Form` union, and every
  consumer that does not handle it yet fails loudly (`unhandled`);
- its **variants**, the `__global__` functions emitted for it, in the order
  the runtime tries them, each with the elements a thread takes, its grid,
  what it needs of the arrays (alignment, whole vectors per row) and its own
  register estimate; the last variant needs nothing, so one always runs;
- its **parameters**, in order: the C declaration and where the runtime gets
  each value (`ArgSource`), packed once by the form's rules.

Per pipeline, the `CallSignature` is what a caller passes and gets back,
copied out of the IR: the binder checks calls against it alone.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NoReturn, Union

from fusec.ir.kernels import Kernel
from fusec.ir.program import Dim, Pipeline, Repeat, Shape
from fusec.ir.stages import Decision
from fusec.target import ROW_CACHE_BYTES
from fusec.types import ScalarType

# ---- forms -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Elementwise:
    """One thread per element, or per vector of elements: a grid over the iteration space."""


@dataclass(frozen=True, slots=True)
class GridStride:
    """A grid that just fills the device; each thread strides over the elements."""


@dataclass(frozen=True, slots=True)
class RegisterLoop:
    """A `repeat` body as one kernel: grid-stride over the elements, each loaded
    once, iterated `count` times in registers, stored once."""

    count: "int | CountArg"


@dataclass(frozen=True, slots=True)
class MultiTensor:
    """foreach: blocks stride over a table of work items, each a range of one
    set's elements (at most `chunk`), with each array's per-set pointers in a
    device table."""

    chunk: int


@dataclass(frozen=True, slots=True)
class RowBlock:
    """A row kernel: one block per row of the last axis. The block's threads
    stride over the row once per round of reductions (one that needs another's
    result comes a round later: the max before a log-sum-exp's sum), combine
    them across the block (warp shuffles, then shared memory), then store the
    row's elements in a last pass, and its per-row values from one thread.

    With `chunks` (a row kernel holding column sums, ir.program.COLUMN_CHUNKS):
    one block per run of ceil(rows / chunks) consecutive rows instead, taking
    them in order, each thread adding its columns' values of every row to its
    sums (a column's always the same thread's: the order is the column sums'
    own), and storing them at [chunk, column] after the last."""

    chunks: int = 0


@dataclass(frozen=True, slots=True)
class ColumnReduce:
    """A column kernel: each thread takes one column (a coordinate of the
    extents after the first) and one of `chunks` runs of ceil(rows / chunks)
    consecutive rows, computes the body at each of its elements in order and
    adds them up from 0; it stores its sum at [chunk, column] (with one chunk,
    at [column]). A warp's threads read adjacent columns: every access is
    coalesced. The order is ir.program.COLUMN_CHUNKS's, so the reference gives
    the same sums.

    With `total` (a kernel of passes.lower.assign_totals: column sums of one
    column): one block of `chunks` threads, each adding up its run of rows in
    order from 0; the runs' sums (in shared memory) are then added up in order
    by the block's first thread, which finishes each sum (or adds up the 128
    partial sums another kernel stored) and computes the statements over the
    finished sums. The same order, so the same bits, in one kernel."""

    chunks: int
    total: bool = False


Form = Union[Elementwise, GridStride, RegisterLoop, MultiTensor, RowBlock, ColumnReduce]


def unhandled(what: object) -> NoReturn:
    """For the `case _:` of a match over a closed set: a kind this consumer does not know yet."""
    raise NotImplementedError(f"{type(what).__name__} is not handled here")


# ---- grids -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ElementGrid:
    """ceil(elements / elements_per_thread / block) blocks."""


@dataclass(frozen=True, slots=True)
class DeviceFillGrid:
    """As ElementGrid, capped at the blocks that fill every SM at the kernel's occupancy."""


@dataclass(frozen=True, slots=True)
class WorkItemGrid:
    """One block per work item, capped as DeviceFillGrid."""


@dataclass(frozen=True, slots=True)
class RowGrid:
    """`rows_per_block` rows a block (1: a block per row; the block's warps
    otherwise, a warp per row): ceil(rows / rows_per_block) blocks, the rows
    the product of the collapsed extents but the last; blocks of `threads`.
    With `cluster`, a cluster of that many blocks a row: rows * cluster blocks.
    With `chunks` (RowBlock's): that many blocks, each a run of rows in turn.
    With `cluster` and `persistent`: as many clusters as the device runs at once
    (at most one a row), each taking every clusters-th row in turn."""

    rows_per_block: int = 1
    threads: int = 0  # threads a block (0: target.BLOCK_SIZE)
    cluster: int = 0  # blocks a row, one thread-block cluster (0: none; rows_per_block is then 1)
    chunks: int = 0   # blocks in all, each taking a run of rows (0: as rows_per_block says)
    persistent: bool = False  # with cluster: the clusters the device runs at once, each streaming rows


@dataclass(frozen=True, slots=True)
class ColumnGrid:
    """ceil(columns / block) blocks for each of `chunks` runs of rows (columns: the
    product of the collapsed extents after the first; none for no columns).
    With `total` (ColumnReduce.total): one block of `chunks` threads."""

    chunks: int
    total: bool = False


Grid = Union[ElementGrid, DeviceFillGrid, WorkItemGrid, RowGrid, ColumnGrid]


@dataclass(frozen=True, slots=True)
class Variant:
    """One emitted function of a kernel.

    alignment: (slot, bytes) for each array the variant moves as whole vectors.
    whole_rows: with broadcast operands, the innermost extent must be a
    multiple of `elements_per_thread` (a vector never straddles a row).
    row_cache: a row kernel's bytes of shared memory per element of the row
    (its inputs kept from the first pass for the next); the runtime takes the
    variant only where a row's worth fits in target.ROW_CACHE_BYTES.
    max_row: the runtime takes the variant only for rows of at most this many
    elements (None: any length): a row kernel's warp-per-row variant.
    row_resident: a row kernel that holds its row in registers: the vectors of
    `elements_per_thread` each thread keeps (its rows at most that many vectors
    of every thread of the row: a warp's, its RowGrid's block, or its cluster's blocks).
    prefetch: a resident row kernel taking a run of rows (RowGrid.chunks), or a
    streaming cluster's rows (RowGrid.persistent): each row's kept vectors are
    loaded while the rows before it are computed.
    """

    name: str
    elements_per_thread: int
    grid: Grid
    est_regs: int
    alignment: tuple[tuple[int, int], ...] = ()
    whole_rows: bool = False
    row_cache: int = 0
    max_row: int | None = None
    row_resident: int = 0
    prefetch: bool = False

    def takes_rows(self, length: int) -> bool:
        """Whether rows of `length` elements meet this variant's needs of them
        (whole vectors, a shared-memory cache that fits, a longest row); its
        arrays' alignment is the caller's to check."""
        return not ((self.whole_rows and length % self.elements_per_thread)
                    or (self.row_cache and length * self.row_cache > ROW_CACHE_BYTES)
                    or (self.max_row is not None and length > self.max_row))


def cluster_blocks(variant: Variant) -> int:
    """The blocks of one thread-block cluster of `variant` (1: no cluster)."""
    grid = variant.grid
    return grid.cluster if isinstance(grid, RowGrid) and grid.cluster else 1


def block_threads(variant: Variant, default: int) -> int:
    """The threads a block of `variant` is launched with: its RowGrid's, else `default`."""
    grid = variant.grid
    if isinstance(grid, ColumnGrid) and grid.total:
        return grid.chunks
    return grid.threads if isinstance(grid, RowGrid) and grid.threads else default


# ---- parameters --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArrayArg:
    """The address of an array: the call's value at `slot` (parameters, outputs, then temporaries)."""

    slot: int


@dataclass(frozen=True, slots=True)
class ScalarArg:
    """A scalar parameter's value (the call's value at `slot`)."""

    slot: int


@dataclass(frozen=True, slots=True)
class ScalarInMemory:
    """A float scalar parameter read from device memory (compiled with `scalars_in_memory`):
    the address of the call's value at `slot`, a 0-d float64 array on the call's device. The
    kernel reads it once, at its top, and converts it to `type` (the declared type; then to
    its compute type) as the host converts a by-value scalar, so both forms compute the same."""

    slot: int
    type: ScalarType


@dataclass(frozen=True, slots=True)
class CountArg:
    """A repeat count given at call time (the call's value at `slot`, an integer scalar)."""

    slot: int


@dataclass(frozen=True, slots=True)
class ConstArg:
    """A value fixed at compile time (a literal repeat count)."""

    value: int


@dataclass(frozen=True, slots=True)
class NumElements:
    """The number of elements of the kernel's iteration space."""


@dataclass(frozen=True, slots=True)
class Extent:
    """The size of collapsed dim `dim` of the kernel's iteration space (`Kernel.extents`)."""

    dim: int


@dataclass(frozen=True, slots=True)
class PointerTable:
    """foreach: a device table of the array at `slot`'s address in every set."""

    slot: int


@dataclass(frozen=True, slots=True)
class WorkItems:
    """foreach: the device table of work items (`WORK_ITEM` each)."""


@dataclass(frozen=True, slots=True)
class WorkItemCount:
    """foreach: the number of work items."""


ArgSource = Union[ArrayArg, ScalarArg, ScalarInMemory, CountArg, ConstArg, NumElements, Extent, PointerTable, WorkItems,
                  WorkItemCount]

# A multi-tensor kernel's work item: elements [start, end) of one tensor set,
# [start, vector_end) of them in whole vectors (the set's arrays are aligned)
# and the rest one per thread.
WORK_ITEM = ("set", "start", "vector_end", "end")


@dataclass(frozen=True, slots=True)
class KernelParam:
    """One parameter of a kernel's functions, in order.

    c_type and c_name give its C declaration; `pack` is the host type its value
    is packed as (None: an 8-byte device address).
    """

    c_type: str
    c_name: str
    source: ArgSource
    pack: ScalarType | None = None

    @property
    def declaration(self) -> str:
        pointer = self.c_type.endswith("*")
        return f"{self.c_type}{' __restrict__ ' if pointer else ' '}{self.c_name}"


# ---- kernels and pipelines ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prediction:
    """The cost model's time for one kernel over a number of elements (passes.cost)."""

    us: float
    memory_us: float
    compute_us: float
    warps: int
    bytes_per_element: int

    @property
    def bound(self) -> str:
        return "memory" if self.memory_us >= self.compute_us else "compute"

    def describe(self) -> str:
        return (f"{self.us:.1f} µs predicted ({self.bound}-bound: {self.memory_us:.1f} µs moving "
                f"{self.bytes_per_element} B/element, {self.compute_us:.1f} µs of arithmetic; "
                f"{self.warps} warps/SM)")


@dataclass(frozen=True, slots=True)
class KernelLaunch:
    """A kernel as the runtimes see it: its computation, form, variants and parameters."""

    kernel: Kernel
    form: Form
    variants: tuple[Variant, ...]
    params: tuple[KernelParam, ...]
    prediction: Prediction | None = None  # the cost model's, for the variant tried first

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def needs_coordinates(self) -> bool:
        return any(isinstance(p.source, Extent) for p in self.params)


@dataclass(frozen=True, slots=True)
class RepeatSteps:
    """Kernels launched `count` times in a row (a repeat body not made one RegisterLoop kernel)."""

    count: "int | CountArg"
    kernels: tuple[int, ...]


Step = Union[int, RepeatSteps]  # a kernel's index, or a repeated run of kernels


@dataclass(frozen=True, slots=True)
class SignatureParam:
    """A parameter or output of a pipeline's call: an array (`shape` set) or a scalar."""

    name: str
    type: ScalarType
    shape: Shape | None
    role: str  # "in", "inout", "out" or "scalar"
    in_memory: bool = False  # a float scalar passed as a 0-d float64 array, read by the kernels (ScalarInMemory)

    @property
    def is_array(self) -> bool:
        return self.shape is not None

    @property
    def written(self) -> bool:
        return self.role in ("inout", "out")


@dataclass(frozen=True, slots=True)
class DimEquation:
    """Two dims that must be equal at call time: they meet in a broadcast at `line`."""

    a: Dim
    b: Dim
    line: int


@dataclass(frozen=True, slots=True)
class Temporary:
    """An array the runtime allocates for one call: a value one kernel stores and another loads."""

    name: str
    type: ScalarType
    shape: Shape


@dataclass(frozen=True, slots=True)
class CallSignature:
    """What a call of the pipeline takes and returns.

    Values of a call are numbered in one flat list, the *slots*: the
    parameters in declaration order, then the outputs, then the temporaries.
    `counts_needing_one`: (slot, outputs, line) of each repeat count that must
    be at least 1 because the outputs, which only its loop assigns, are read
    after it.
    """

    name: str
    params: tuple[SignatureParam, ...]
    outputs: tuple[SignatureParam, ...]
    dim_equations: tuple[DimEquation, ...]
    temporaries: tuple[Temporary, ...] = ()
    counts: tuple[int, ...] = ()
    counts_needing_one: tuple[tuple[int, tuple[str, ...], int], ...] = ()

    @property
    def slot_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params) + tuple(o.name for o in self.outputs) + \
            tuple(t.name for t in self.temporaries)


@dataclass(frozen=True, slots=True)
class LaunchInterface:
    """One pipeline, compiled: what to call, which kernels, in which order."""

    signature: CallSignature
    kernels: tuple[KernelLaunch, ...]
    steps: tuple[Step, ...]
    fused: bool
    max_regs: int
    arch: str
    notes: tuple[Decision, ...] = ()  # decisions about no kernel: statements dropped as dead
    fast_math: bool = False  # hardware approximations of f32 functions; denormals flushed

    @property
    def pipeline(self) -> str:
        return self.signature.name

    def kernel(self, name: str) -> KernelLaunch:
        return next(k for k in self.kernels if k.name == name)


def call_signature(pipeline: Pipeline, temporaries: tuple[Temporary, ...] = ()) -> CallSignature:
    """What a call of `pipeline` takes and returns, copied out of the IR."""
    names = [p.name for p in pipeline.params]
    counts = [stmt.count for stmt in _repeats(pipeline.body) if isinstance(stmt.count, str)]
    return CallSignature(
        pipeline.name,
        tuple(SignatureParam(p.name, p.type, p.shape, p.role) for p in pipeline.params),
        tuple(SignatureParam(o.name, o.type, o.shape, o.role) for o in pipeline.outputs),
        tuple(DimEquation(eq.a, eq.b, eq.loc.line) for eq in pipeline.dim_eqs),
        temporaries,
        tuple(dict.fromkeys(names.index(c) for c in counts)),
        tuple((names.index(r.count), r.unassigned_if_zero, r.loc.line) for r in _repeats(pipeline.body)
              if isinstance(r.count, str) and r.unassigned_if_zero))


def _repeats(stmts):
    for stmt in stmts:
        if isinstance(stmt, Repeat):
            yield stmt
            yield from _repeats(stmt.body)


def in_memory_scalars(signature: CallSignature, chosen: "bool | tuple[str, ...]") -> tuple[str, ...]:
    """The float scalar parameters `chosen` names (True: every float scalar), checked:
    ValueError for a name that is not a float scalar parameter (integer and bool scalars
    stay by value)."""
    floats = [p.name for p in signature.params if not p.is_array and p.type.is_float]
    if chosen is True:
        return tuple(floats)
    if chosen is False:
        return ()
    for name in chosen:
        param = next((p for p in signature.params if p.name == name), None)
        if param is None:
            raise ValueError(f"scalars_in_memory: pipeline '{signature.name}' has no parameter '{name}'")
        if param.is_array or not param.type.is_float:
            what = "an array" if param.is_array else f"a scalar {param.type}"
            raise ValueError(f"scalars_in_memory: '{name}' is {what}; only float scalars are read from memory "
                             f"(float scalars of '{signature.name}': {', '.join(floats) or 'none'})")
    return tuple(dict.fromkeys(chosen))


def with_scalars_in_memory(interface: LaunchInterface, names: tuple[str, ...]) -> LaunchInterface:
    """The interface with the float scalars `names` read from device memory: each kernel
    that reads one takes `const double* NAME_ptr` (ScalarInMemory) in its by-value
    parameter's place, and the call signature marks it `in_memory` (the binder then takes
    a 0-d float64 array on the call's device for it). No names: the interface as it is."""
    if not names:
        return interface
    if any(isinstance(k.form, MultiTensor) for k in interface.kernels):
        raise ValueError("scalars_in_memory: not for a multi-tensor (foreach) kernel; its scalars stay by value")
    signature = interface.signature
    chosen = {signature.params.index(next(p for p in signature.params if p.name == n)) for n in names}
    kernels = []
    for launch in interface.kernels:
        taken = {p.c_name for p in launch.params}
        params = []
        for p in launch.params:
            if isinstance(p.source, ScalarArg) and p.source.slot in chosen:
                declared = signature.params[p.source.slot].type
                name = f"{p.c_name}_ptr"
                while name in taken:
                    name += "_"
                taken.add(name)
                p = KernelParam("const double*", name, ScalarInMemory(p.source.slot, declared))
            params.append(p)
        kernels.append(replace(launch, params=tuple(params)))
    params = tuple(replace(p, in_memory=True) if i in chosen else p for i, p in enumerate(signature.params))
    return replace(interface, signature=replace(signature, params=params), kernels=tuple(kernels))
