"""One binder for every backend: a call checked against the pipeline's call signature.

Every backend (cuda, sim, numpy) checks a call here, with the same errors
and the same messages, before anything is allocated, launched or written.
A backend only says how its arrays are read (`ArrayModel`): which objects it
takes, and each array's dtype, shape, layout, writeability, device and span;
and which kind each argument is (`ArrayKind`: NumPy, CuPy, torch). A call
takes arrays of one kind and returns that kind.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Callable, Protocol

import numpy as np

from fusec.errors import ArgumentError
from fusec.ir.launch import CallSignature, SignatureParam
from fusec.ir.program import Shape, fmt_shape
from fusec.types import BY_NAME, F64, INT_RANGE

# A repeat count is a 64-bit signed integer on every backend.
MAX_COUNT = (1 << 63) - 1


class ArrayKind(Protocol):
    """The kind of array a call was made with (NumPy, CuPy, torch tensors): what
    its outputs and temporaries are allocated as (by the caller's library, so
    that torch's caching allocator and CUDA-graph capture see them), what it
    returns, and the stream it runs on."""

    name: str  # in messages: "torch tensors"
    native: bool  # the backend's own arrays: `view` is the identity

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> object:
        """A new array of this kind (dtype: the NumPy dtype of the slot's type)."""

    def view(self, array) -> object:
        """An array of this kind as the backend's array, without a copy."""

    def pointer(self, array) -> int:
        """The address of an array of this kind (a launch passes another kind's arrays by address)."""

    def stream(self) -> object | None:
        """The stream a call without stream= runs on (None: the backend's current one)."""


class OwnArrays:
    """A backend's own arrays (NumPy, CuPy) as an ArrayKind: allocated by the backend, launched as they are."""

    native = True

    def __init__(self, name: str, empty: Callable[[tuple, np.dtype], object], pointer: Callable[[object], int]):
        self.name, self.empty, self.pointer = name, empty, pointer

    @staticmethod
    def view(array):
        return array

    @staticmethod
    def stream():
        return None


class ArrayModel(Protocol):
    """How one backend's arrays are read (the binder's only view of them)."""

    own: ArrayKind  # the backend's own arrays (NumPy, CuPy): a call without arrays returns these

    def kind(self, value) -> ArrayKind:
        """The kind of an argument this model adopted."""

    def adopt(self, value) -> object:
        """`value` as this backend's array type (importing another library's
        array without a copy), or ArgumentError saying why it cannot be (the
        binder prefixes the parameter's name)."""

    def contiguous(self, array) -> bool: ...

    def broadcast(self, array) -> bool:
        """Some dim of more than one element has stride 0 (a broadcast view)."""

    def writeable(self, array) -> bool: ...

    def span(self, array) -> tuple[int, int]:
        """The address range [start, end) the array's elements occupy."""

    def fast(self, param: SignatureParam, dtype: np.dtype) -> Callable[[object], object] | None:
        """A check of the common case in a few attribute reads: the array
        itself, or None where the full check must run. None: no fast check."""


class BoundCall:
    """A checked call: one value per parameter (arrays adopted, scalars as Python
    values), the caller's `out=` arrays (adopted, and as given) or None, the
    stream (stream=, else the kind's), the dims, and the kind of the call's arrays."""

    __slots__ = ("values", "outputs", "out", "stream", "dims", "kind")

    def __init__(self, values: list, outputs: list | None, stream, dims: dict[str, int], kind: ArrayKind,
                 out: list | None = None):
        self.values, self.outputs, self.stream, self.dims = values, outputs, stream, dims
        self.kind, self.out = kind, out if out is not None else outputs


class Binder:
    """Checks calls of one pipeline for one backend.

    What depends only on the signature is prepared once (a checker per
    parameter); what depends on the arrays' shapes (the dims) is cached per
    shape signature.
    """

    def __init__(self, signature: CallSignature, arrays: ArrayModel, stream: Callable[[object], object] | None = None):
        self.signature, self.arrays = signature, arrays
        self.params = signature.params
        names = [p.name for p in self.params]
        # `out=` and `stream=` are call options unless the pipeline has a parameter of that name.
        self.options = tuple(o for o in ("out", "stream") if o not in names)
        self._stream = stream
        self.checkers = [self._array_checker(p) if p.is_array else self._in_memory_checker(p) if p.in_memory
                         else scalar_checker(p) for p in self.params]
        self.array_positions = [i for i, p in enumerate(self.params) if p.is_array]
        # Float scalars read from memory (`SignatureParam.in_memory`): 0-d float64 arrays, of the
        # call's kind and sharing no memory with a written array, as array arguments are.
        self.in_memory_positions = [i for i, p in enumerate(self.params) if p.in_memory]
        # Whose kinds a call's arrays must agree on (`kind_of`): arrays and memory scalars, in order.
        self._kind_positions = sorted(self.array_positions + self.in_memory_positions)
        self.written = [i for i, p in enumerate(self.params) if p.written]
        self.counts = list(signature.counts)
        self._dims: dict[tuple, dict[str, int]] = {}
        # The parameters and outputs as the aliasing check walks them (None: a by-value scalar; a
        # memory scalar spans its 8 bytes).
        self._array_slots = [p if p.is_array or p.in_memory else None for p in self.params] + list(signature.outputs)

    # ---- a whole call
    def bind(self, args: tuple, kwargs: dict) -> BoundCall:
        out = stream = None
        if kwargs:
            kwargs = dict(kwargs)
            if "out" in self.options:
                out = kwargs.pop("out", None)
            if "stream" in self.options:
                stream = self.stream(kwargs.pop("stream", None))
        given = self.split(args, kwargs)
        values = [check(v) for check, v in zip(self.checkers, given)]
        kind, first = self.kind_of(given)
        self.check_counts(values)
        dims = self.dims(values)
        outputs = given_out = None
        if out is not None:
            given_out = list(out) if isinstance(out, (tuple, list)) else [out]
            outputs = self.given_outputs(given_out, dims)
            kind = self.check_output_kinds(given_out, kind, first)
        if self.written or outputs:
            self.check_aliasing(values + (outputs or []))
        if stream is None:
            stream = kind.stream()
        return BoundCall(values, outputs, stream, dims, kind, given_out)

    def split(self, args: tuple, kwargs: dict) -> list:
        """Positional and keyword arguments -> one value per parameter, in order."""
        names = [p.name for p in self.params]
        if not kwargs and len(args) == len(names):
            return list(args)
        call = f"{self.signature.name}()"
        if len(args) > len(names):
            raise ArgumentError(f"{call} takes {len(names)} arguments ({', '.join(names)}), got {len(args)}")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                known = ", ".join(names + list(self.options))
                raise ArgumentError(f"{call} has no parameter '{key}' (parameters: {known})")
            if key in values:
                raise ArgumentError(f"{call} got parameter '{key}' twice")
            values[key] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise ArgumentError(f"{call} is missing parameter{'s' if len(missing) > 1 else ''} "
                                f"{', '.join(repr(m) for m in missing)}")
        return [values[n] for n in names]

    def stream(self, value):
        if self._stream is None:
            if value is not None:
                raise ArgumentError("stream= is for the cuda backend; this backend runs on the CPU")
            return None
        return self._stream(value)

    # ---- arrays
    def _array_checker(self, param: SignatureParam) -> Callable[[object], object]:
        dtype = param.type.numpy_dtype
        full = functools.partial(self.check_array, param)
        fast = self.arrays.fast(param, dtype)
        if fast is None:
            return full

        def check(value):
            array = fast(value)
            return full(value) if array is None else array
        return check

    def check_array(self, param: SignatureParam, value, what: str = "parameter"):
        """The checks every array argument (and out= array) passes: kind, dtype, layout, writeability."""
        try:
            array = self.arrays.adopt(value)
        except ArgumentError as exc:
            raise ArgumentError(f"{what} '{param.name}': {exc}") from None
        dtype = param.type.numpy_dtype
        if array.dtype != dtype:
            raise ArgumentError(f"{what} '{param.name}': expected dtype {param.type} ({dtype}), got {array.dtype}")
        if param.written and self.arrays.broadcast(array):
            raise ArgumentError(f"{what} '{param.name}' is written, but the array is a broadcast view")
        if param.written and not self.arrays.writeable(array):
            raise ArgumentError(f"{what} '{param.name}' is {param.role}, but the array is read-only")
        if not self.arrays.contiguous(array):
            raise ArgumentError(f"{what} '{param.name}': the array is not C-contiguous (strides "
                                f"{tuple(array.strides)}); pass a contiguous copy (ascontiguousarray)")
        return array

    def _in_memory_checker(self, param: SignatureParam) -> Callable[[object], object]:
        """The check of a float scalar the kernels read from memory (`SignatureParam.in_memory`):
        a 0-d float64 array on the call's device (NumPy or a CPU tensor on the sim backend; CuPy
        or a CUDA tensor on the cuda backend), adopted as the backend's array. Its value is read
        by the kernels, converted as a by-value scalar is (but never checked against the
        declared type's range, which would need a synchronization: beyond it is ±inf)."""
        what = (f"parameter '{param.name}' ({param.type}) is read from device memory (scalars_in_memory): pass "
                f"a 0-d float64 array on the call's device")
        adopt, float64 = self.arrays.adopt, np.dtype(np.float64)

        def check(value):
            if isinstance(value, (numbers.Number, np.generic)):
                raise ArgumentError(f"{what}, not a {type(value).__name__} ({value!r})")
            try:
                array = adopt(value)
            except ArgumentError as exc:
                raise ArgumentError(f"{what}; {exc}") from None
            if array.dtype != float64:
                raise ArgumentError(f"{what}; got dtype {array.dtype}")
            if array.ndim != 0:
                raise ArgumentError(f"{what}; got shape {tuple(array.shape)}")
            return array
        return check

    # ---- the kind of a call's arrays
    def kind_of(self, given: list) -> tuple[ArrayKind, tuple | None]:
        """The kind of the array arguments (each already adopted; memory scalars' 0-d arrays
        too), and the first array argument (its description and value); ArgumentError where
        two kinds meet."""
        kind = first = None
        for i in self._kind_positions:
            this = self.arrays.kind(given[i])
            if kind is None:
                kind, first = this, (f"parameter '{self.params[i].name}'", given[i])
            elif this is not kind:
                raise mixed_kinds((f"parameter '{self.params[i].name}'", given[i]), first, kind, this)
        return (kind or self.arrays.own), first

    def check_output_kinds(self, given: list, kind: ArrayKind, first: tuple | None) -> ArrayKind:
        """out= arrays are of the parameters' kind (with no array parameter, of one kind)."""
        for o, value in zip(self.signature.outputs, given):
            this = self.arrays.kind(value)
            if first is None:
                kind, first = this, (f"output '{o.name}'", value)
            elif this is not kind:
                raise mixed_kinds((f"output '{o.name}'", value), first, kind, this)
        return kind

    def given_outputs(self, given: list, dims: dict[str, int]) -> list:
        """The caller's `out=` arrays, checked."""
        outputs = self.signature.outputs
        if len(given) != len(outputs):
            raise ArgumentError(f"out= takes {len(outputs)} array{'s' if len(outputs) != 1 else ''} "
                                f"({', '.join(o.name for o in outputs) or 'the pipeline has no outputs'}), "
                                f"got {len(given)}")
        result = []
        for o, value in zip(outputs, given):
            array = self.check_array(o, value, "output")
            want = concrete(o.shape, dims)
            if tuple(array.shape) != want:
                raise ArgumentError(f"output '{o.name}': out= array has shape {tuple(array.shape)}, expected {want}")
            result.append(array)
        return result

    def check_aliasing(self, arrays: list) -> None:
        """A written array (inout or output) may share no memory with another array of the call."""
        span = self.arrays.span
        spans = [(p, *span(a)) for p, a in zip(self._array_slots, arrays) if p is not None]
        for i, (a, a0, a1) in enumerate(spans):
            if a0 == a1:
                continue
            for b, b0, b1 in spans[i + 1:]:
                if (a.written or b.written) and a0 < b1 and b0 < a1:
                    raise ArgumentError(f"'{a.name}' and '{b.name}' share memory, but "
                                        f"'{a.name if a.written else b.name}' is written: pass separate arrays")

    # ---- shapes
    def dims(self, values: list) -> dict[str, int]:
        """Dim name -> size, from the arrays' shapes (cached per shape signature)."""
        shapes = tuple(tuple(values[i].shape) for i in self.array_positions)
        dims = self._dims.get(shapes)
        if dims is None:
            if len(self._dims) >= 256:  # a caller cycling through many shapes: start afresh
                self._dims.clear()
            dims = self._dims[shapes] = bind_dims(self.signature, dict(zip(
                (self.params[i].name for i in self.array_positions), shapes)))
        return dims

    # ---- repeat counts
    def check_counts(self, values: list) -> None:
        for i in self.counts:
            count = values[i]
            name = self.params[i].name
            if count < 0:
                raise ArgumentError(f"repeat count '{name}' is negative ({count})")
            if count > MAX_COUNT:
                raise ArgumentError(f"repeat count '{name}' is {count}; at most 2^63 - 1 ({MAX_COUNT})")
        for i, outputs, line in self.signature.counts_needing_one:
            if values[i] == 0:
                names = " and ".join(f"'{n}'" for n in outputs)
                raise ArgumentError(f"repeat count '{self.params[i].name}' is 0, but {names} "
                                    f"{'is' if len(outputs) == 1 else 'are'} assigned only inside that 'repeat' "
                                    f"(line {line}) and read after it; pass a count of at least 1")


def allocate(kind: ArrayKind, allocations) -> tuple[list, list]:
    """New arrays of a call's kind, one per (shape, NumPy dtype), and the backend's views of them."""
    arrays = [kind.empty(shape, dtype) for shape, dtype in allocations]
    return arrays, arrays if kind.native else [kind.view(a) for a in arrays]


def mixed_kinds(this: tuple, first: tuple, first_kind: ArrayKind, kind: ArrayKind) -> ArgumentError:
    """Arrays of two kinds in one call: (description, value) of the offending and the first argument."""
    return ArgumentError(f"{this[0]} is a {_type_name(this[1])}, but {first[0]} is a {_type_name(first[1])}: a "
                         f"call takes arrays of one kind ({first_kind.name} or {kind.name}) and returns that kind")


def _type_name(value) -> str:
    kind = type(value)
    return f"{kind.__module__.partition('.')[0]}.{kind.__qualname__}"


def bind_dims(signature: CallSignature, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Dim name -> size, from the shapes of the array parameters; ArgumentError where they disagree."""
    dims: dict[str, int] = {}
    source: dict[str, str] = {}
    for p in signature.params:
        if not p.is_array:
            continue
        shape = tuple(shapes[p.name])
        if len(shape) != len(p.shape):
            raise ArgumentError(f"parameter '{p.name}': expected {len(p.shape)} dim{'s' if len(p.shape) != 1 else ''} "
                                f"{fmt_shape(p.shape)}, got shape {shape}")
        for decl, size in zip(p.shape, shape):
            if isinstance(decl, int):
                if size != decl:
                    raise ArgumentError(f"parameter '{p.name}': expected shape {fmt_shape(p.shape)}, got {shape}")
            elif decl in dims and dims[decl] != size:
                raise ArgumentError(f"parameter '{p.name}': dim '{decl}' is {size} here but {dims[decl]} "
                                    f"from parameter '{source[decl]}'")
            else:
                dims[decl] = size
                source[decl] = p.name
    for eq in signature.dim_equations:
        a, b = size_of(eq.a, dims), size_of(eq.b, dims)
        if a != b:
            raise ArgumentError(f"dims {_dim_text(eq.a)} ({a}) and {_dim_text(eq.b)} ({b}) must be equal: they "
                                f"are broadcast together at line {eq.line} (only a literal 1 broadcasts)")
    return dims


def _dim_text(dim) -> str:
    return f"'{dim}'" if isinstance(dim, str) else f"of literal size {dim}"


def size_of(dim, dims: dict[str, int]) -> int:
    return dim if isinstance(dim, int) else dims[dim]


def concrete(shape: Shape, dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(size_of(d, dims) for d in shape)


# ---- scalars


def check_scalar(p: SignatureParam, value) -> object:
    """A Python or NumPy scalar for a scalar parameter, as a Python value of its kind."""
    t = p.type
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if t.is_bool:
        if not isinstance(value, (bool, np.bool_)):
            raise ArgumentError(f"parameter '{p.name}' is bool; got {type(value).__name__}")
        return bool(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Number):
        raise ArgumentError(f"parameter '{p.name}' is a scalar {t}; got {type(value).__name__}")
    if t.is_int:
        if not isinstance(value, numbers.Integral):
            raise ArgumentError(f"parameter '{p.name}' is {t}; got a {type(value).__name__} ({value!r})")
        lo, hi = INT_RANGE[t]
        if not lo <= int(value) <= hi:
            raise ArgumentError(f"parameter '{p.name}' is {t}; {value} is out of its range ({lo} to {hi})")
        return int(value)
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        raise ArgumentError(f"parameter '{p.name}' is {t}; got a complex number")
    try:
        as_float = float(value)
    except OverflowError:  # an int beyond any float (10**400)
        raise ArgumentError(f"parameter '{p.name}' is {t}; {value} is out of its range") from None
    rounded = _rounded(t.name, as_float)
    if math.isinf(rounded) and not math.isinf(as_float):
        raise ArgumentError(f"parameter '{p.name}' is {t}; {value!r} is out of its range "
                            f"(largest finite {float(np.finfo(t.numpy_dtype).max):g})")
    return rounded


@functools.lru_cache(maxsize=4096)
def _rounded(type_name: str, value: float) -> float:
    """A float rounded once to a scalar type, as the reference converts (bf16
    from f64 without rounding twice); cached, since a pipeline's scalars (a
    learning rate, a scale) repeat from call to call."""
    from fusec.reference import cast  # the oracle's conversion (imported late: it imports the binder)
    with np.errstate(over="ignore"):
        return float(cast(np.asarray(value, np.float64), F64, BY_NAME[type_name]))


def scalar_checker(p: SignatureParam) -> Callable[[object], object]:
    """A fast `check_scalar` for one parameter: plain Python numbers of the
    right kind take a short path; anything else the full check. `check.inline`,
    where there is a short path: it as a condition on a value's expression, for
    generated code (the recorded calls) to take it without a call."""
    t = p.type
    if t.is_float and t.compute == t:  # f32, f64: finite values that stay finite
        limit = float(np.finfo(t.numpy_dtype).max)

        def check(value):
            return value if type(value) is float and -limit <= value <= limit else check_scalar(p, value)
        check.inline = lambda v: f"type({v}) is float and {-limit!r} <= {v} <= {limit!r}"
    elif t.is_int:
        lo, hi = INT_RANGE[t]

        def check(value):
            return value if type(value) is int and lo <= value <= hi else check_scalar(p, value)
        check.inline = lambda v: f"type({v}) is int and {lo!r} <= {v} <= {hi!r}"
    else:
        def check(value):
            return check_scalar(p, value)
    return check
