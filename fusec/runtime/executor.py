"""Running a compiled pipeline, whatever executes its kernels.

The executor reads the launch interface alone. A call is checked by the
binder (every check before anything is allocated or launched); the outputs
and temporaries are allocated as the kind of array the call was made with
(NumPy, CuPy, torch tensors: `ArrayKind`), by that kind's library; then each
step launches its kernel, on the kind's stream unless the call gives one: the
first variant whose needs the arrays meet, over its grid, with its parameters
filled from their sources. A backend loads the module and launches one
function over a grid (`Backend`).
"""
from __future__ import annotations

import collections
import linecache
import math
import sys
import zlib
from typing import Callable, Protocol

from fusec.ir.launch import (
    ArrayArg,
    ColumnGrid,
    ConstArg,
    CountArg,
    DeviceFillGrid,
    ElementGrid,
    Extent,
    KernelLaunch,
    KernelParam,
    LaunchInterface,
    NumElements,
    PointerTable,
    RepeatSteps,
    ScalarArg,
    ScalarInMemory,
    Variant,
    WorkItemCount,
    RowGrid,
    WorkItemGrid,
    WorkItems,
    block_threads,
    unhandled,
)
from fusec.runtime.binder import ArrayKind, ArrayModel, Binder, BoundCall, allocate, concrete, size_of
from fusec.target import BLOCK_SIZE


class Backend(Protocol):
    """What runs a module's kernels: its arrays, and launching one variant over a grid."""

    arrays: ArrayModel
    by_address: bool  # array arguments are launched as addresses (else the arrays themselves)

    def block(self, variant: str) -> int:
        """Threads per block this function launches with (as many as its registers allow)."""

    def fill_blocks(self, variant: str, block: int) -> int:
        """Blocks that fill every SM at this function's occupancy (a device-filling grid);
        for a cluster variant, the clusters the device runs at once."""

    def packer(self, param: KernelParam) -> Callable[[object], object] | None:
        """How a value becomes this parameter's launch argument (None: passed as it is)."""

    def launcher(self, variant: str, grid: int, block: int, shared_bytes: int = 0) -> Callable[..., None]:
        """fire(args, stream=None): launches the function with packed arguments."""

    def empty(self, shape: tuple[int, ...], dtype) -> object: ...

    def pointer(self, array) -> int:
        """The address of an array's first element."""

    def signature(self, value) -> tuple | None:
        """A cheap key for an array argument, before any check: equal keys mean
        the same memory, shape, strides and dtype (None: no cheap key). Its first
        field is the address (a key without it: the same but for the memory)."""

    def signatures(self, arrays: list) -> object | None:
        """The signatures of many arrays, in any form that compares with ==."""

    def stream(self, value) -> object:
        """The backend's stream for a `stream=` argument (None: the current one)."""

    def table(self, array) -> object:
        """A small NumPy array (pointers, sizes, work items) where kernels can read it (foreach)."""

    # Graph backends only (GraphExecutor):
    def capture(self, launch) -> object:
        """A graph of what launch(stream) enqueues on a capturing stream."""

    def replay(self, graph, stream) -> None: ...


class _Kernel:
    """One kernel's launch, prepared from its `KernelLaunch` for one backend."""

    __slots__ = ("launch", "variants", "sources", "packers", "getters", "packed_getters")

    def __init__(self, launch: KernelLaunch, backend: Backend):
        self.launch = launch
        # (variant, the block size it launches with), in the order they are tried
        self.variants = [(v, backend.block(v.name)) for v in launch.variants]
        self.sources = [p.source for p in launch.params]
        self.packers = [backend.packer(p) for p in launch.params]
        # Each parameter's value from (values, n, extents), decided once per source;
        # and packed for the launch, in one call.
        self.getters = [_getter(source) for source in self.sources]
        self.packed_getters = [get if pack is None or get is None else _packed(get, pack)
                               for get, pack in zip(self.getters, self.packers)]


class Executor:
    """Calls a compiled pipeline.

    What depends only on the pipeline is prepared once (the binder's checkers,
    each kernel's argument sources and packers); what depends on the arrays'
    shapes (allocation shapes, each kernel's sizes) once per shape signature.
    A call (no stream=) whose arrays, out= arrays included, have the
    signatures of two earlier calls (shape, layout, dtype, device; the same
    repeat counts; and the addresses, but in a plain call of a pipeline that
    writes no parameter, where no aliasing can depend on them and the key
    holds each address modulo the widest vector instead, which fixes the
    variants) replays the launches recorded at the second (`_RecordedCall`):
    it checks its scalars, allocates its outputs (unless given; or reuses its
    own dead ones) and launches.
    """

    def __init__(self, interface: LaunchInterface, backend: Backend):
        self.interface, self.backend = interface, backend
        signature = self.signature = interface.signature
        self.binder = Binder(signature, backend.arrays, backend.stream)
        self.params = signature.params
        self.n_outputs = len(signature.outputs)
        self.kernels = [_Kernel(k, backend) for k in interface.kernels]
        self.steps = interface.steps
        self._sizes: dict[tuple, _Sizes] = {}
        self._is_array = [p.is_array for p in self.params]
        self._count_positions = set(signature.counts)
        self._calls: dict[tuple, _RecordedCall] = {}
        self._seen: set[tuple] = set()  # keys of calls seen once (`_call_key`, `_out_key`)
        # A plain call's key holds no addresses where no parameter is written (no aliasing to
        # check): its recorded call takes the arrays' addresses each call (`_RecordedCall.free`).
        self._free = not self.binder.written
        # Where a key holds no address, the address modulo the widest vector any variant moves
        # (a power of two each) is in it: that fixes which variants the arrays are aligned for.
        self._align_mask = max((size for k in interface.kernels for v in k.variants for _, size in v.alignment),
                               default=1) - 1
        # (key, run) of the plain call, and of the call with out=, recorded last (`forget`)
        self._last_plain, self._last_out = [(None, None)], [(None, None)]
        self._generate_calls()

    def _generate_calls(self) -> None:
        """The generated keys and replays (again once torch is imported, whose tensors the
        backend's keys then read inline)."""
        self._torch_known = "torch" in sys.modules
        self._plain_key, self._scalars_key = self._generate_key(False), self._generate_key(True)
        self._out_key = self._generate_key(False, outs=True)
        self.replay = self._generate_replay()
        self.replay_out = self._generate_replay(outs=True)

    def __call__(self, *args, **kwargs):
        if not kwargs:
            result = self.replay(args)
        elif len(kwargs) == 1 and "out" in kwargs:
            result = self.replay_out(args, kwargs["out"])
        else:
            return self.call_missed(args, kwargs)
        return result if type(result) is not Missed else self.call_missed(args, kwargs, result.key)

    def call_missed(self, args: tuple, kwargs: dict, key: tuple | None = None):
        """A call that `replay` did not run (or one with keyword arguments): replayed
        from its key where it can be, else checked in full (and recorded at the
        second sighting of its key). `key`: the call's, where the replay worked it out."""
        if not self._torch_known and "torch" in sys.modules:
            self._generate_calls()
        out = None
        if not kwargs:
            if key is None:
                key = self._plain_key(args)
        elif len(kwargs) == 1 and "out" in kwargs:  # the outputs given: part of the key (None: not given)
            out = kwargs["out"]
            if key is None:
                key = self._call_key(args) if out is None else self._out_key(args, out)
        else:
            key = None
        record = False
        if key is not None:
            try:
                call = self._calls.get(key)
            except TypeError:  # an unhashable repeat count: the checked path says what is wrong
                call = key = None
            if call is not None:
                result = call.run(args, out, *self._addresses(args)) if call.free else call.run(args, out)
                if result is not MISS:  # a new output missed the alignment the launches assume
                    return result
            elif key is not None:  # kept from its second sighting on, so that one-off calls cost no recording
                record = key in self._seen
                if len(self._seen) >= 256:  # a caller cycling through many arrays: start afresh
                    self._seen.clear()
                self._seen.add(key)
        call = self.binder.bind(args, kwargs)
        values, sizes = self._allocate(call)
        launched = [] if record else None
        self._launch_all(values, sizes, call.stream, launched)
        if record:
            if len(self._calls) >= 256:
                self.forget()
            recorded = self._calls[key] = _RecordedCall(self, values, sizes, launched, call.kind,
                                                        call.outputs is not None, self._free and call.outputs is None)
            (self._last_plain if call.outputs is None else self._last_out)[0] = (key, recorded.run)
            if not call.kind.native and getattr(self.backend, "tensors_first", None) is False:
                self.backend.tensors_first = True  # a call of another kind's arrays (torch's): read first
                self._generate_calls()
        return self._result(values)

    def forget(self) -> None:
        """Every recorded call and every key seen dropped: later calls are checked in full."""
        self._calls.clear()
        self._seen.clear()
        self._last_plain[0] = self._last_out[0] = (None, None)

    def _call_key(self, args: tuple, scalars: bool = False) -> tuple | None:
        """A call's key, read before any check (None: not a plain positional
        call, or an array with no cheap signature): each array's signature, and
        each scalar with its type (1, 1.0 and True are different arguments)
        where it matters: all of them with `scalars` (a graph holds their
        values and the addresses), else the repeat counts (a count fixes the
        launch sequence), the signatures then without addresses where no
        parameter is written."""
        return (self._scalars_key if scalars else self._plain_key)(args)

    def _addresses(self, args: tuple) -> list[int]:
        """The addresses of a call's array arguments, each its signature's first field."""
        signature = self.backend.signature
        return [signature(args[i])[0] for i in self.binder.array_positions]

    def _generate_key(self, scalars: bool, outs: bool = False) -> Callable[..., tuple | None]:
        """`_call_key(args, scalars)` as straight-line code for this parameter list (it is
        on every replayed call's path); with `outs`, `_out_key(args, out)`: a call with
        out= as a key, the arguments' and each given output's signature. The arrays'
        addresses are in it but in a plain call's key of a pipeline that writes no parameter."""
        names: dict[str, object] = {}
        lines, key = self._key_lines(scalars, False, "None", names, outs, scalars or outs or not self._free)
        head = "def key(args, out):" if outs else "def key(args):"
        return _compile([head, *lines, f"    return {key}"], names, "fusec call key")["key"]

    def _generate_replay(self, outs: bool = False) -> Callable[..., object]:
        """replay(args): a plain positional call run from its recording (`_RecordedCall`),
        in one frame but for the recording's own; MISS where there is none (the key is
        new, an array is not on this backend's device, or a new output missed the
        alignment the launches assume): `call_missed` takes it from there. With `outs`,
        replay_out(args, out): the same for a call with out= (None: a plain call)."""
        names: dict[str, object] = {"get": self._calls.get, "MISS": MISS, "Missed": Missed,
                                    "LAST": self._last_out if outs else self._last_plain}
        free = self._free and not outs
        lines, key = self._key_lines(False, True, "MISS", names, outs, not free)
        get_device = getattr(self.backend, "get_device", None)
        if get_device is not None:  # a backend of one device: that device is current, or nothing is run
            names.update(get_device=get_device, DEVICE=self.backend.device)
            lines[2:2] = ["    if get_device() != DEVICE:", "        return MISS"]
        if outs:
            names["replay"] = self.replay
            lines = ["    if out is None:", "        return replay(args)", *lines]
        arguments = f"args, {'out' if outs else 'None'}" + \
            ("".join(f", q{i}" for i in self.binder.array_positions) if free else "")
        lines += [f"    key = {key}", "    last = LAST[0]",
                  "    if key == last[0]:  # the call recorded last: compared, where a look-up hashes the key",
                  f"        return last[1]({arguments})",
                  "    try:", "        call = get(key)",
                  "    except TypeError:  # an unhashable repeat count", "        return MISS",
                  "    if call is None:", "        return Missed(key)",
                  f"    return call.run({arguments})"]
        name = "replay_out" if outs else "replay"
        return _compile([f"def {name}(args{', out' if outs else ''}):", *lines], names, f"fusec {name}")[name]

    def _key_lines(self, scalars: bool, on_device: bool, miss: str, names: dict,
                   outs: bool = False, addresses: bool = True) -> tuple[list[str], str]:
        """The lines of a generated function of `args` (and `out`, with `outs`) that compute
        a call's key (`_call_key`, `_out_key`), returning `miss` where it has none; and the
        key's expression. `on_device`: also `miss` where an array is not on the backend's
        device (where it has one). Without `addresses`, each array argument's signature
        without its address (its first field), which `q{position}` is set to."""
        n = len(self._is_array)
        lines = [f"    if len(args) != {n}:", f"        return {miss}"]
        parts = []
        inline = getattr(self.backend, "signature_lines", None)  # the backend's signature, inline
        names["signature"] = self.backend.signature

        def array(value: str, target: str, address: str | None = None) -> None:
            if inline is not None:
                lines.extend(inline(value, target, on_device, names, address))
            else:
                lines.append(f"    {target} = signature({value})")
                if address is not None:
                    lines.extend([f"    if {target} is not None:",
                                  f"        {address}, {target} = {target}[0], {target}[1:]"])
            lines.extend([f"    if {target} is None:", f"        return {miss}"])
            parts.append(target)
            if address is not None and self._align_mask:  # the address's place in the widest vector
                parts.append(f"{address} & {self._align_mask}")
        in_memory = self.binder.in_memory_positions
        for position, is_array in enumerate(self._is_array):
            if is_array:
                array(f"args[{position}]", f"a{position}", None if addresses else f"q{position}")
            elif position in in_memory:  # a memory scalar's type: its kind is the call's (`Binder.kind_of`)
                parts.append(f"type(args[{position}])")
            elif scalars or position in self._count_positions:
                parts += [f"type(args[{position}])", f"args[{position}]"]
        if outs:
            lines += ["    outs = out if type(out) is tuple else (out,)", f"    if len(outs) != {self.n_outputs}:",
                      f"        return {miss}  # the checked path says what is wrong"]
            parts.append("'out'")
            for k in range(self.n_outputs):
                array(f"outs[{k}]", f"o{k}")
        return lines, f"({''.join(p + ', ' for p in parts)})"

    def _allocate(self, call: BoundCall) -> tuple["CallValues", "_Sizes"]:
        """A checked call as one flat list of values (parameters, outputs,
        temporaries: the signature's slots), and its sizes. Outputs and
        temporaries are new arrays of the call's kind, allocated by its library."""
        sizes = self._sizes_for(call.values, call.dims)
        values = CallValues(call.values)
        if call.outputs is not None:
            values.outputs, outputs = call.out, call.outputs
        else:
            values.outputs, outputs = allocate(call.kind, sizes.outputs)
        values += outputs
        values += allocate(call.kind, sizes.temps)[1]
        return values, sizes

    def _sizes_for(self, values: list, dims: dict[str, int]) -> "_Sizes":
        shapes = tuple(values[i].shape for i in self.binder.array_positions)
        sizes = self._sizes.get(shapes)
        if sizes is None:
            if len(self._sizes) >= 256:  # a caller cycling through many shapes: start afresh
                self._sizes.clear()
            sizes = self._sizes[shapes] = self._prepare(dims)
        return sizes

    def _prepare(self, dims: dict[str, int]) -> "_Sizes":
        signature = self.signature
        outputs = [(concrete(o.shape, dims), o.type.numpy_dtype) for o in signature.outputs]
        temps = [(concrete(t.shape, dims), t.type.numpy_dtype) for t in signature.temporaries]
        kernels = []
        for k in self.kernels:
            kernel = k.launch.kernel
            extents = [math.prod(size_of(d, dims) for d in e) for e in kernel.extents]
            kernels.append((math.prod(size_of(d, dims) for d in kernel.shape), extents))
        return _Sizes(outputs, temps, kernels)

    def _launch_all(self, values: list, sizes: "_Sizes", stream, launched: list | None = None) -> None:
        """Every step, in order; `launched` collects (kernel index, variant, grid, arguments) of each launch."""
        for step in self.steps:
            if isinstance(step, RepeatSteps):
                for _ in range(_count(step.count, values)):
                    for k in step.kernels:
                        self._launch(k, values, sizes, stream, launched)
            else:
                self._launch(step, values, sizes, stream, launched)

    def _launch(self, index: int, values: list, sizes: "_Sizes", stream, launched: list | None) -> None:
        kernel = self.kernels[index]
        n, extents = sizes.kernels[index]
        variant, block = self._variant(kernel, values, extents)
        fixed = sizes.launches.get((index, variant.name))
        if fixed is None:  # what the shapes fix of this variant's launch: its grid, shared memory, launcher
            grid = self._grid(variant, block, n, extents)
            shared = extents[-1] * variant.row_cache if variant.row_cache else 0  # bytes of dynamic shared memory
            fire = self.backend.launcher(variant.name, grid, block, shared) if grid else None
            fixed = sizes.launches[index, variant.name] = (grid, shared, fire)
        grid, shared, fire = fixed
        if grid == 0:
            return
        if launched is None:
            packed = [get(values, n, extents) for get in kernel.packed_getters]
        else:  # recorded: the values as well as their packing
            args = [get(values, n, extents) for get in kernel.getters]
            packed = [a if pack is None else pack(a) for pack, a in zip(kernel.packers, args)]
        if stream is None:
            fire(packed)
        else:
            fire(packed, stream=stream)
        if launched is not None:
            launched.append((index, variant, grid, block, shared, args))

    def _variant(self, kernel: _Kernel, values: list, extents: list[int]) -> tuple[Variant, int]:
        """The first variant whose arrays are aligned as it needs (and, with
        broadcasts, whose rows hold whole vectors); the last needs nothing."""
        pointer = self.backend.pointer
        length = extents[-1] if extents else 0  # (a kernel of no dims has no rows to need anything of)
        for variant, block in kernel.variants:
            if not variant.takes_rows(length):
                continue
            if variant.row_resident and block < block_threads(variant, BLOCK_SIZE):
                continue  # its rows are at most its vectors of all its threads
            for slot, size in variant.alignment:
                if pointer(values[slot]) % size:
                    break
            else:
                return variant, block
        raise AssertionError(f"{kernel.launch.name}: no variant without needs")  # the plan always ends with one

    def _grid(self, variant: Variant, block: int, n: int, extents: list[int]) -> int:
        """Blocks for `n` elements (for a WorkItemGrid, `n` work items; for a
        RowGrid, a block per row or per rows_per_block rows: rows of no elements
        still get their result)."""
        match variant.grid:
            case RowGrid(chunks=chunks) if chunks:  # a block a run of rows (empty runs store zero sums)
                return chunks
            case RowGrid(_, _, cluster, persistent=True):  # the clusters at once, each streaming its rows
                return min(math.prod(extents[:-1]), self.backend.fill_blocks(variant.name, block)) * cluster
            case RowGrid(rows_per_block, _, cluster):
                return -(-math.prod(extents[:-1]) // rows_per_block) * max(cluster, 1)
            case ColumnGrid(total=True):  # one block, a thread a run of rows
                return 1
            case ColumnGrid(chunks):  # columns of no rows still get their sum (0)
                return -(-math.prod(extents[1:]) // block) * chunks
            case ElementGrid():
                return -(-(-(-n // variant.elements_per_thread)) // block)
            case DeviceFillGrid():
                blocks = -(-(-(-n // variant.elements_per_thread)) // block)
                return min(blocks, self.backend.fill_blocks(variant.name, block))
            case WorkItemGrid():
                return min(n, self.backend.fill_blocks(variant.name, block))
            case grid:
                unhandled(grid)

    def _result(self, values: "CallValues"):
        return as_result(values.outputs)


def _count(count, values: list) -> int:
    return count if isinstance(count, int) else values[count.slot]


def _packed(get: Callable, pack: Callable) -> Callable[[list, int, list], object]:
    return lambda values, n, extents: pack(get(values, n, extents))


def _getter(source) -> Callable[[list, int, list], object] | None:
    """get(values, n, extents): a parameter's value for one launch."""
    match source:
        case ArrayArg(slot) | ScalarArg(slot) | ScalarInMemory(slot) | CountArg(slot):
            return lambda values, n, extents: values[slot]
        case ConstArg(value):
            return lambda values, n, extents: value
        case NumElements():
            return lambda values, n, extents: n
        case Extent(dim):
            return lambda values, n, extents: extents[dim]
        case PointerTable() | WorkItems() | WorkItemCount():
            return None  # a foreach launch's: MultiTensorExecutor fills them
        case _:
            unhandled(source)


class CallValues(list):
    """A call's values, one per slot, as the backend launches them; and
    `outputs`, the call's outputs as the caller gets them back (arrays of the
    call's kind: the out= arrays as given, or torch tensors where the slots hold
    the backend's views of them)."""

    __slots__ = ("outputs",)


def as_result(outputs: list):
    """A call's return value: its one output, a tuple of several, or None."""
    return outputs[0] if len(outputs) == 1 else tuple(outputs) if outputs else None


class _Sizes:
    """What one shape signature fixes: output and temporary shapes, and each kernel's sizes."""

    __slots__ = ("outputs", "temps", "kernels", "launches")

    def __init__(self, outputs, temps, kernels):
        self.outputs, self.temps, self.kernels = outputs, temps, kernels
        self.launches: dict[tuple[int, str], tuple] = {}  # (kernel, variant) -> (grid, shared bytes, launcher)


class _RecordedCall:
    """A call seen twice, replayed for calls with its key (`Executor._call_key`, or
    `_out_key` with out=):
    every check that depends on the arrays was made then, and each launch is
    fixed but for the scalars and the new outputs and temporaries (or the
    caller's out= arrays, when the key holds them), and with `free` (a key
    without addresses, but for their places in the widest vector) the arrays'
    addresses. Input arrays are held by address only, if at all, so nothing
    is kept alive. The key fixes the kind of the
    arrays (their types are in it): outputs are allocated as that kind, and the
    launches go to its stream (torch tensors: torch's current stream, where
    they were produced; no stream hand-off is needed), read once a call.

    `run(args, out=None)` is generated for the call (`_generate`): straight-line
    code with the launches' fixed arguments as constants, since this is the
    path whose host time a small kernel's call is made of. Where the backend
    gives a launch as source text (`launch_source`: the cuda backend's driver
    launch), the launches are written out in it too, with no list of arguments
    and no frame of their own; the common scalars are checked inline."""

    MISALIGNED = None  # run()'s answer when a new output misses the alignment the launches assume: MISS

    def __init__(self, executor: Executor, values: list, sizes: _Sizes, launched: list, kind: ArrayKind,
                 given_outputs: bool = False, free: bool = False):
        backend, first = executor.backend, len(executor.params)
        self.free = free  # the arrays' addresses are arguments of run(args, out, q...), not in its key
        n_outputs = len(sizes.outputs)
        # Slot k of the outputs and temporaries: new each call (given: the caller's outputs).
        allocations = list(enumerate(sizes.outputs)) if not given_outputs else []
        allocations += [(n_outputs + t, size) for t, size in enumerate(sizes.temps)]
        checkers = executor.binder.checkers
        scalar_params = [i for i, is_array in enumerate(executor._is_array) if not is_array]
        alignment: set[tuple[int, int]] = set()
        inline = getattr(backend, "launch_source", None)
        launches = []  # per launch: (fire, [its arguments as Python expressions]), or its source text
        names: dict[str, object] = {}

        def constant(value) -> str:
            names[f"c{len(names)}"] = value
            return f"c{len(names) - 1}"
        for index, variant, grid, block, shared, args in launched:
            kernel = executor.kernels[index]
            arguments = []
            for source, pack, value in zip(kernel.sources, kernel.packers, args):
                if isinstance(source, ArrayArg) and source.slot >= first:  # an output or temporary: new each call
                    arguments.append(f"n{source.slot - first}")
                elif isinstance(source, ArrayArg):
                    arguments.append(f"q{source.slot}" if free else constant(backend.pointer(value)))
                elif isinstance(source, (ScalarArg, ScalarInMemory)):  # checked each call (by `checkers`)
                    scalar = f"s{scalar_params.index(source.slot)}"
                    arguments.append(scalar if pack is None else f"{constant(pack)}({scalar})")
                else:
                    arguments.append(constant(value if pack is None else pack(value)))
            alignment |= {(slot - first, size) for slot, size in variant.alignment if slot >= first}
            if inline is not None:
                launch_names, text = inline(variant.name, grid, block, shared, f"l{len(launches)}_")
                names.update(launch_names)
                launches.append(text.replace("{args}", ", ".join(arguments)))
            else:
                launches.append((constant(backend.launcher(variant.name, grid, block, shared)), arguments))
        # The backend's own arrays are launch arguments as they are, unless it launches
        # by address; another kind's (torch's) go by address, which costs less than a view of each.
        by_address = not kind.native or backend.by_address
        stream = None if inline is None else backend.stream_source(kind)
        addresses = executor.binder.array_positions if free else None
        # The memory the caller gave that the call writes (inout arrays, out= arrays: their addresses
        # are in the key): a memory scalar overlapping it is refused each call, as the checked path
        # refuses it (`Binder.check_aliasing`), which the call then takes (MISS).
        binder, written = executor.binder, []
        if binder.in_memory_positions:
            spans = [values[i] for i in binder.written] + (values[first:first + n_outputs] if given_outputs else [])
            written = [span for span in map(binder.arrays.span, spans) if span[0] != span[1]]
        self.run, self.source = _generate(names, n_outputs, given_outputs, allocations, sorted(alignment),
                                          by_address, [(position, checkers[position]) for position in scalar_params],
                                          launches, kind, stream, addresses,
                                          {position: written for position in binder.in_memory_positions if written},
                                          binder.arrays.span)


# A recorded call keeps its dead arrays for reuse (`_generate`) where they take at most this
# many bytes together: the calls whose host time an allocation is a large part of.
RECYCLE_BYTES = 1 << 18


def _generate(names: dict, n_outputs: int, given_outputs: bool, allocations: list, alignment: list,
              by_address: bool, scalars: list, launches: list, kind: ArrayKind,
              stream: tuple[dict, str] | None = None, addresses: list[int] | None = None,
              overlaps: dict[int, list[tuple[int, int]]] | None = None,
              span: Callable | None = None) -> tuple[Callable, str]:
    """One recorded call's run(args, out=None), compiled, and its source. `launches`:
    (fire, argument expressions) each, or with `stream` (the names and the expression
    of the stream handle) each launch's source text, `handle` its stream. With
    `addresses` (the array arguments' positions), run(args, out, q...) takes their
    addresses (the key fixed each one's alignment). `overlaps`: scalar position -> the
    address ranges [start, end) the call writes that its value (a memory scalar's
    array, whose `span`) must not overlap: MISS where it does (the checked path refuses it).

    Recycling (a kind that says which allocator is in use and when an array is `unused`,
    the launches written out, the new arrays small, the GIL on): the call keeps the sets of arrays it allocated (outputs and temporaries, up to two sets, a
    set taken by one call at a time) and takes one again, instead of allocating, where
    nothing but the set references any of its arrays, their memory pointers or memory (no
    weak reference either), each still has the shape and layout it was allocated with,
    and the call runs on the stream and with the allocator the set was allocated on and
    with: what the memory pool would hand out again (its memory, freed on that stream),
    with no allocation and no new array. It reads the allocator in use once; where it
    allocates, it takes the memory from that allocator and makes the array over it
    (`array_over`), as the kind's library would (cupy.ndarray asks for the allocator again).
    A torch tensor's call allocates each time (no `allocator_in_use`: autograd's saved
    tensors and record_stream hold a tensor where Python's reference counts cannot see),
    through its kind's `allocator`."""
    names.update(empty=kind.empty, pointer=kind.pointer, get_stream=kind.stream, MISALIGNED=MISS)
    lines = [f"def run(args, out=None{''.join(f', q{i}=None' for i in addresses or ())}):"]
    if given_outputs and n_outputs:
        targets = "".join(f"v{k}, " for k in range(n_outputs))
        lines.append(f"    {targets}= out if type(out) is tuple else (out,)")
    for j, (position, check) in enumerate(scalars):  # checked first: a bad call allocates nothing
        names[f"check{j}"] = check
        lines.append(f"    s{j} = args[{position}]")
        fast = getattr(check, "inline", None)  # the checker's fast case as a condition on its value
        condition = None if fast is None else fast(f"s{j}")
        lines.append(f"    s{j} = check{j}(s{j})" if condition is None else
                     f"    if not ({condition}):\n        s{j} = check{j}(s{j})")
        if overlaps and position in overlaps:
            names.update(span=span, SHARED=MISS)
            lines.append(f"    r0, r1 = span(s{j})")
            lines += [f"    if r0 < {end} and {start} < r1:\n        return SHARED  # the checked path refuses it"
                      for start, end in overlaps[position]]
    if stream is not None:
        stream_names, handle = stream
        names.update(stream_names)
        lines.append(f"    handle = {handle}")
    new_bytes = sum(math.prod(shape) * dtype.itemsize for _, (shape, dtype) in allocations)
    recycle = stream is not None and getattr(kind, "allocator_in_use", None) is not None and \
        0 < new_bytes <= RECYCLE_BYTES and getattr(sys, "_is_gil_enabled", lambda: True)()  # the counts need the GIL
    allocator = getattr(kind, "allocator", None)  # a new array of a shape and dtype in one C-level call
    # Recycling kinds: memory from the allocator in use (read once a call, for the spares' checks
    # too), then an array over it (`array_over`: its bytes and the array's constructor); the
    # address is read from the memory, and no array is made for memory that misses an alignment.
    over = getattr(kind, "array_over", None) if recycle else None
    new_lines, arrays = [], []
    for k, (shape, dtype) in allocations:
        if over is not None:
            nbytes, names[f"array{k}"] = over(shape, dtype)
            new_lines += [f"d{k} = alloc({nbytes})", f"p{k} = d{k}.ptr"]
            arrays.append(f"v{k} = array{k}(d{k})")
        elif allocator is not None:
            names[f"new{k}"] = allocator(shape, dtype)
            new_lines.append(f"v{k} = new{k}()")
        else:
            names[f"shape{k}"], names[f"dtype{k}"] = shape, dtype
            new_lines.append(f"v{k} = empty(shape{k}, dtype{k})")
    if over is None:
        new_lines += [f"p{k} = pointer(v{k})" for k, _ in allocations]
    for k, size in alignment:
        if not (given_outputs and k < n_outputs):  # given outputs: their addresses are in the key
            new_lines.append(f"if p{k} % {size}:\n    return MISALIGNED")
    new_lines += arrays
    if given_outputs:
        lines += [f"    p{k} = pointer(v{k})" for k in range(n_outputs)]
    if not recycle:
        lines += ["    " + line.replace("\n", "\n    ") for line in new_lines]
    else:
        spares = collections.deque(maxlen=2)
        names.update(spares=spares, take=spares.popleft, keep=spares.append, allocator_in_use=kind.allocator_in_use,
                     NO_SPARE=(None, None, None))
        # A set is free where nothing else references its arrays: its first array's count read
        # first (what fails where the caller holds its results), then the stream and allocator.
        unused = []
        for j, (k, (shape, dtype)) in enumerate(allocations):
            names[f"shape{k}"] = shape
            unused.append(kind.unused(f"spare[{2 + j}]", f"v{k}", f"d{k}", f"shape{k}", names))
        free = " and ".join([unused[0], "spare[0] == handle", "spare[1] is alloc", *unused[1:]])
        lines += ["    alloc = allocator_in_use()  # the allocator a new array takes its memory from",
                  "    try:  # the oldest set kept: reused, or kept again",
                  "        spare = take()",
                  "    except IndexError:",
                  "        spare = NO_SPARE",
                  f"    if not ({free}):",
                  "        if spare is not NO_SPARE:  # referenced still: kept, the older set first",
                  "            keep(spare)",
                  "            try:  # the other set kept, if any",
                  "                spare = take() if len(spares) == 2 else NO_SPARE",
                  "            except IndexError:",
                  "                spare = NO_SPARE",
                  f"            if not ({free}):",
                  "                if spare is not NO_SPARE:",
                  "                    keep(spare)",
                  "                spare = NO_SPARE",
                  "    if spare is not NO_SPARE:", *[f"        p{k} = d{k}.ptr" for k, _ in allocations], "    else:",
                  *["        " + line.replace("\n", "\n        ") for line in new_lines],
                  f"        spare = (handle, alloc, {''.join(f'v{k}, ' for k, _ in allocations)})"]
    for k in range(n_outputs + len(allocations) - (0 if given_outputs else n_outputs)):
        lines.append(f"    n{k} = p{k}" if by_address else f"    n{k} = v{k}")
    if stream is None:
        lines.append("    stream = get_stream()")
        for fire, arguments in launches:
            call = f"[{', '.join(arguments)}]"
            lines.append(f"    {fire}({call}) if stream is None else {fire}({call}, stream=stream)")
    else:  # the stream's handle read once, each launch written out
        lines += [text.rstrip("\n") for text in launches]
    if recycle:
        lines.append("    keep(spare)")
    result = "None" if not n_outputs else "v0" if n_outputs == 1 else \
        "(" + "".join(f"v{k}, " for k in range(n_outputs)) + ")"
    lines.append(f"    return {result}")
    return _compile(lines, names, "fusec recorded call")["run"], "\n".join(lines) + "\n"


def _compile(lines: list[str], names: dict, what: str) -> dict:
    """Generated code run in `names`; named by its text (the same text, one entry) and
    kept where tracebacks read it."""
    source = "\n".join(lines) + "\n"
    filename = f"<{what} {zlib.crc32(source.encode()):08x}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), names)
    return names


class Missed:
    """A generated replay's answer where it ran nothing (`Executor.replay`,
    `_RecordedCall.run`): with the call's key where it worked that out and no call
    was recorded for it (`Executor.call_missed` takes it), else None (`MISS`)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple | None):
        self.key = key

    def __repr__(self) -> str:
        return "MISS" if self.key is None else f"Missed({self.key!r})"


MISS = _RecordedCall.MISALIGNED = Missed(None)
