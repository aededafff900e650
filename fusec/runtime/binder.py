"""Binding call arguments to a pipeline's parameters, with clear errors.

Shared by every backend: dims are bound from the arrays' shapes, scalars are
checked against their declared kinds, and each mistake raises an
`ArgumentError` that names the parameter.
"""
from __future__ import annotations

import functools
import numbers

import numpy as np

from fusec.errors import ArgumentError
from fusec.ir.program import Pipeline, Shape, Slot, fmt_shape
from fusec.types import BY_NAME, INT_RANGE, ScalarType


def numpy_dtype(t: ScalarType) -> np.dtype:
    if t.name == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    names = {"bool": "bool", "f16": "float16", "f32": "float32", "f64": "float64"}
    if t.name in names:
        return np.dtype(names[t.name])
    return np.dtype(("int" if t.kind == "int" else "uint") + str(t.bits))


def split_args(pipeline: Pipeline, args: tuple, kwargs: dict) -> list:
    """Positional and keyword arguments -> one value per parameter, in order."""
    names = [p.name for p in pipeline.params]
    if len(args) > len(names):
        raise ArgumentError(f"{pipeline.name}() takes {len(names)} arguments ({', '.join(names)}), "
                            f"got {len(args)}")
    values = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise ArgumentError(f"{pipeline.name}() has no parameter '{key}' (parameters: {', '.join(names)})")
        if key in values:
            raise ArgumentError(f"{pipeline.name}() got parameter '{key}' twice")
        values[key] = value
    missing = [n for n in names if n not in values]
    if missing:
        raise ArgumentError(f"{pipeline.name}() is missing parameter{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(repr(m) for m in missing)}")
    return [values[n] for n in names]


def bind_dims(pipeline: Pipeline, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Dim name -> size, from the shapes of the array parameters."""
    dims: dict[str, int] = {}
    source: dict[str, str] = {}
    for p in pipeline.params:
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
    for eq in pipeline.dim_eqs:
        a, b = size_of(eq.a, dims), size_of(eq.b, dims)
        if a != b:
            raise ArgumentError(f"dims '{eq.a}' ({a}) and '{eq.b}' ({b}) must be equal: they are broadcast "
                                f"together at line {eq.loc.line} (only a literal 1 broadcasts)")
    return dims


def size_of(dim, dims: dict[str, int]) -> int:
    return dim if isinstance(dim, int) else dims[dim]


def concrete(shape: Shape, dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(size_of(d, dims) for d in shape)




def check_scalar(p: Slot, value) -> object:
    """A Python or NumPy scalar for a scalar parameter, as a Python value."""
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
    return _rounded(t.name, float(value))


@functools.lru_cache(maxsize=4096)
def _rounded(type_name: str, value: float) -> float:
    """A float rounded to a scalar type (1e6 as f16 is inf); cached, since a
    pipeline's scalars (a learning rate, a scale) repeat from call to call."""
    with np.errstate(over="ignore"):
        return float(np.asarray(value, numpy_dtype(BY_NAME[type_name])))


def scalar_checker(p: Slot):
    """A fast `check_scalar` for one parameter: plain Python numbers of the
    right kind take a short path; anything else the full check."""
    t = p.type
    if t.is_float and t.compute == t:  # f32, f64: the launch rounds to the parameter's type
        def check(value):
            return value if type(value) is float else check_scalar(p, value)
    elif t.is_int:
        lo, hi = INT_RANGE[t]

        def check(value):
            return value if type(value) is int and lo <= value <= hi else check_scalar(p, value)
    else:
        def check(value):
            return check_scalar(p, value)
    return check
