"""`@fusec.jit` on a Python function, on the numpy backend and the sim: a traced
chain rounds once, NumPy's functions and operators mean what they mean in
NumPy, out= and stream=, the decorator's stages and signatures. Sim tier (g++)."""
import ml_dtypes
import numpy as np
import pytest
from helpers import gelu

import fusec
from fusec.errors import ArgumentError

pytestmark = pytest.mark.sim
BF16 = np.dtype(ml_dtypes.bfloat16)


def fz_gelu(dtype: str) -> str:
    return (f"pipeline gelu(x: {dtype}[n]) -> (y: {dtype}[n]) {{\n"
            f"    y = 0.5 * x * (1.0 + tanh(0.7978845608 * (x + 0.044715 * x * x * x)));\n}}\n")


def relative_error(actual, truth) -> float:
    return float(np.max(np.abs(actual.astype(np.float64) - truth) / np.maximum(np.abs(truth), 1e-3)))


UNARY = ("sqrt cbrt exp exp2 expm1 log log2 log10 log1p sin cos tan arcsin arccos arctan sinh cosh tanh floor ceil "
         "trunc rint absolute fabs negative positive square reciprocal sign isnan isinf isfinite logical_not"
         ).split()
BINARY = ("add subtract multiply divide power remainder fmod maximum minimum fmax fmin arctan2 equal not_equal less "
          "less_equal greater greater_equal logical_and logical_or logical_xor").split()
INEXACT = set("cbrt exp exp2 expm1 log log2 log10 log1p sin cos tan arcsin arccos arctan sinh cosh tanh power "
              "arctan2".split())
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.nan, np.inf, -np.inf, 1e-30, 7.0]
def every_ufunc(x, y):
    return (*(getattr(np, name)(x) for name in UNARY), *(getattr(np, name)(x, y) for name in BINARY),
            np.where(x > y, x, y), np.where(x, y, 2.0), np.clip(x, -1.0, y), np.clip(x, None, 2.0),
            np.clip(x, min=-0.5), np.round(x), np.around(y), np.abs(x), abs(x), x % y, -7.0 % y, x ** 2)


def numpy_values(x, y):
    with np.errstate(all="ignore"):
        return every_ufunc(x, y)


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between f32 arrays (NaN and NaN: 0)."""
    def ordered(v):
        i = v.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    both_nan = np.isnan(a) & np.isnan(b)
    return np.where(both_nan, 0, np.abs(ordered(a) - ordered(b)))


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("backend", ["numpy", "sim"])
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["f16", "bf16"])
def test_a_traced_chain_rounds_once_like_one_fz_statement(dtype, backend, fuse):
    x = (np.random.default_rng(0).standard_normal(3000) * 3).astype(dtype)
    traced = fusec.jit(gelu, backend=backend, fuse=fuse)(x)
    one_statement = fusec.jit(fz_gelu("f16" if dtype == np.float16 else "bf16"), backend=backend, fuse=fuse)(x)
    assert traced.dtype == dtype
    np.testing.assert_array_equal(traced.view(np.uint16), one_statement.view(np.uint16))
    # The error of rounding once: below one unit in the last place of the storage type.
    truth = gelu(x.astype(np.float64))
    assert relative_error(traced, truth) == relative_error(one_statement, truth) < ml_dtypes.finfo(dtype).eps


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_numpy_functions_and_operators_mean_what_they_mean_in_numpy(backend):
    rng = np.random.default_rng(3)
    x = np.concatenate([SPECIAL, rng.standard_normal(300) * 4]).astype(np.float32)
    y = np.concatenate([SPECIAL[::-1], rng.standard_normal(300) * 4]).astype(np.float32)
    actual = fusec.jit(every_ufunc, backend=backend)(x, y)
    expected = numpy_values(x, y)
    names = UNARY + BINARY + ["where", "where_truth", "clip", "clip_hi", "clip_min", "round", "around", "abs",
                              "abs()", "%", "rmod", "**"]
    assert len(actual) == len(expected) == len(names)
    for name, a, e in zip(names, actual, expected):
        assert a.dtype == e.dtype, name
        if backend == "numpy" or name not in INEXACT:
            np.testing.assert_array_equal(a, e, err_msg=name)
        else:  # the C library's math functions against NumPy's: CUDA's are within 4 ulp too
            assert ulps(a, e).max() <= 4, name


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_integer_operators_mean_what_they_mean_in_numpy(backend):
    def ints(i, j):
        return i % j, i % 3, -7 % j, np.fmod(i, j), np.maximum(i, j), np.minimum(i, 2), np.sign(i), \
            np.power(i, 2), i ** 3, abs(i), np.remainder(i, -4), np.floor(i), (i > 0) & (j > 0), ~(i > j), \
            (i > 0) ^ (j > 0), np.logical_and(i, j), np.logical_not(i)

    i = np.array([-7, -3, 0, 3, 7, 9, -9, 100], np.int32)
    j = np.array([2, -2, 5, -5, 3, -3, 4, 7], np.int32)
    for a, e in zip(fusec.jit(ints, backend=backend)(i, j), ints(i, j)):
        assert a.dtype == e.dtype or e.dtype == np.float64  # NumPy's floor of an int is a float; fusec keeps it
        np.testing.assert_array_equal(a, e)


def test_out_and_stream_are_call_options():
    @fusec.jit(backend="sim")
    def polar(x, y):
        return np.sqrt(x * x + y * y), np.arctan2(y, x)

    x, y = np.full(5, 3.0, np.float32), np.full(5, 4.0, np.float32)
    r, a = np.empty(5, np.float32), np.empty(5, np.float32)
    got = polar(x, y, out=(r, a))
    assert got[0] is r and got[1] is a
    np.testing.assert_array_equal(r, np.full(5, 5, np.float32))
    with pytest.raises(ArgumentError, match="out= takes 2 arrays"):
        polar(x, y, out=r)
    with pytest.raises(ArgumentError, match="out= array has shape \\(4,\\), expected \\(5,\\)"):
        polar(x, y, out=(r[:4], a))
    with pytest.raises(ArgumentError, match="stream= is for the cuda backend"):
        polar(x, y, stream=object())

    @fusec.jit(backend="sim")
    def scaled(x, out):  # a parameter of that name is the function's own
        return x * out

    np.testing.assert_array_equal(scaled(x, out=2.0), np.full(5, 6, np.float32))


def test_decorator_traces_each_operation_as_a_stage():
    @fusec.jit(backend="sim")
    def gelu_bias(h, b):
        x = h + b
        return 0.5 * x * (1.0 + fusec.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

    h = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(33).astype(np.float32)
    x = h + b
    expected = 0.5 * x * (1 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x * x * x)))
    np.testing.assert_allclose(gelu_bias(h, b), expected, rtol=1e-5, atol=1e-6)
    program_text = gelu_bias.source(h, b)
    assert program_text.count(";") == 10  # ten array operations, ten stages
    assert "test_trace_sim.py:" in program_text  # each statement names the Python line that made it
    unfused = fusec.jit(program_text, backend="sim", fuse=False)
    assert len(unfused.compiled.interface.kernels) == 10
    assert len(fusec.jit(program_text, backend="sim").compiled.interface.kernels) == 1


def test_decorator_signatures_and_scalars():
    @fusec.jit(backend="sim")
    def axpy(a, x, y):
        return a * x + y

    x32, y32 = np.ones(3, np.float32), np.full(3, 2, np.float32)
    np.testing.assert_array_equal(axpy(3.0, x32, y32), np.full(3, 5, np.float32))
    x16 = np.ones(3, np.float16)
    assert axpy(3.0, x16, x16).dtype == np.float16
    assert len(axpy.pipelines) == 2
    with pytest.raises(ArgumentError, match="dims 'x_0' \\(3\\) and 'y_0' \\(4\\) must be equal"):
        axpy(1.0, x32, np.ones(4, np.float32))
