"""`@fusec.jit` on a Python function, on the numpy backend: rounding, the dtypes
of outputs, arguments, the pipeline surface, and what cannot be traced (the
same on the sim: test_trace_sim.py). Unit tier."""
import inspect
import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from helpers import gelu

import fusec
from fusec.errors import Source
from fusec.frontend import check_source

BF16 = np.dtype(ml_dtypes.bfloat16)


# ---- rounding: f16 and bf16 values are carried in f32 and rounded where they are returned


def test_intermediates_are_f32_and_only_outputs_are_f16():
    x = np.ones(4, np.float16)
    program = check_source(Source("<traced>", fusec.jit(gelu, backend="numpy").source(x)))
    slots = program.pipelines[0].slots
    assert {s.type.name for s in slots if s.role == "temp"} == {"f32"}
    assert [(s.name, s.type.name) for s in slots if s.role in ("in", "out")] == [("x", "f16"), ("out0", "f16")]


def test_a_returned_value_read_later_is_not_read_rounded():
    @fusec.jit(backend="numpy")
    def two(x):
        y = x * 3.0
        return y, y * 3.0  # z from the f32 y, as Inductor computes it

    x = np.array([0.1, 1 / 3, 1e-3], np.float16)
    y, z = two(x)
    x32 = x.astype(np.float32)
    np.testing.assert_array_equal(y, (x32 * 3).astype(np.float16))
    np.testing.assert_array_equal(z, (x32 * 3 * 3).astype(np.float16))
    assert not np.array_equal(z, (y.astype(np.float32) * 3).astype(np.float16))  # what rounding y gives


def test_an_explicit_cast_rounds():
    @fusec.jit(backend="numpy")
    def through_f16(x):
        return x.astype(np.float16).astype(np.float32) * 2.0

    x = np.array([0.1, 70000.0, 1 / 3], np.float32)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).astype(np.float32) * 2
    np.testing.assert_array_equal(through_f16(x), expected)


# What PyTorch returns for the same expression on these inputs (torch.result_type's rules).
H, B, S, I8 = np.float16, ml_dtypes.bfloat16, np.float32, np.int8
DTYPES = [
    (lambda x, y: x * 2.0 + y, (H, H), H),
    (lambda x, y: x * 2 - 1, (H, H), H),
    (lambda x, y: np.exp(x) / y, (B, B), B),
    (lambda x, y: np.where(x > 0, x, 0.0), (H, H), H),
    (lambda x, y: np.maximum(x, y), (B, B), B),
    (lambda x, y: x + y, (H, B), S),
    (lambda x, y: x + y, (H, S), S),
    (lambda x, y: x.astype(np.float32) * y, (H, H), S),
    (lambda x, y: (x * y).astype(np.float16), (S, S), H),
    (lambda x, y: x < y, (H, H), np.bool_),
    (lambda x, y: np.sqrt(x) + y, (I8, H), S),
    (lambda x, y: x * 0.5, (I8, I8), S),
    (lambda x, y: x + 1, (I8, I8), I8),
    (lambda x, y: np.exp(x), (I8, I8), S),
]


@pytest.mark.parametrize("fn, dtypes, expected", DTYPES, ids=[str(i) for i in range(len(DTYPES))])
def test_outputs_have_the_dtype_torch_gives(fn, dtypes, expected):
    x, y = (np.ones(3, d) for d in dtypes)
    assert fusec.jit(fn, backend="numpy")(x, y).dtype == np.dtype(expected)


def test_a_python_float_argument_is_weak_and_not_rounded_to_f16():
    @fusec.jit(backend="numpy")
    def axpy(a, x):
        return a * x

    x = np.ones(2, np.float16)
    y = axpy(1 / 3, x)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, np.float16(np.float32(1 / 3)))  # once, from f32: not f16(1/3) * 1 rounded twice
    assert "a: f32" in axpy.source(1 / 3, x)


# ---- NumPy's functions inside, with NumPy's meaning

# Correctly rounded in IEEE arithmetic, or no arithmetic at all: every backend equals NumPy bit for bit.


def test_nan_in_maximum_minimum_and_clip_propagates_as_in_numpy():
    @fusec.jit(backend="numpy")
    def f(x):
        return fusec.maximum(x, 0.0), np.minimum(1.0, x), fusec.clip(x, 0.0, 1.0), fusec.fmax(x, 0.0), \
            fusec.clamp(x, 0.0, 1.0)

    x = np.array([np.nan, -1.0, 2.0], np.float32)
    got = f(x)
    for a, e in zip(got, [[np.nan, 0, 2], [np.nan, -1, 1], [np.nan, 0, 1], [0, 0, 2], [0, 0, 1]]):
        np.testing.assert_array_equal(a, np.array(e, np.float32))


def test_unsupported_numpy_functions_name_themselves_and_list_what_is():
    x = np.ones(3, np.float32)
    cases = [
        (lambda x: np.sum(x), "np.sum inside @fusec.jit reduces each row .*np.sum\\(x, axis=-1, keepdims=True\\)"),
        (lambda x: np.prod(x), "np.prod is not supported"),
        (lambda x: np.hypot(x, x), "np.hypot is not supported"),
        (lambda x: np.add.reduce(x), "np.add.reduce is not supported.*reductions"),
        (lambda x: np.exp(x, out=x), "keyword arguments of NumPy functions"),
        (lambda x: np.where(x > 0), "np.where\\(condition, a, b\\)"),
        (lambda x: np.round(x, 2), "write np.round\\(x \\* 10\\*\\*2\\) / 10\\*\\*2"),
        (lambda x: x + np.ones(3), "must be one of the function's arguments"),
        (lambda x: np.asarray(x), "cannot become a NumPy array"),
    ]
    for fn, message in cases:
        with pytest.raises(fusec.TraceError, match=message):
            fusec.jit(fn, backend="numpy")(x)
    with pytest.raises(fusec.TraceError, match="supported: np.absolute, np.add, .*np.where"):
        fusec.jit(lambda x: np.prod(x), backend="numpy")(x)


def test_reductions_over_the_last_axis_are_row_reductions():
    def softmax(x):
        e = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    x = np.random.default_rng(1).standard_normal((3, 7)).astype(np.float32)
    f = fusec.jit(softmax, backend="numpy")
    text = f.source(x)
    assert "row_max(x)" in text and "row_sum(" in text
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(f(x), e / e.sum(-1, keepdims=True), rtol=1e-6)
    stats = fusec.jit(lambda x: (x.mean(-1, keepdims=True), np.var(x, axis=-1, keepdims=True),
                                 fusec.row_logsumexp(x), x.min(axis=-1, keepdims=True)), backend="numpy")
    mean, var, lse, low = stats(x)
    np.testing.assert_allclose(mean, x.mean(-1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(var, x.var(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(lse, np.log(np.exp(x).sum(-1, keepdims=True)), rtol=1e-6)
    np.testing.assert_array_equal(low, x.min(-1, keepdims=True))
    for fn, message in [(lambda x: x.max(axis=0, keepdims=True), "reduces each row"),
                        (lambda x: x.sum(-1), "keepdims=True"),
                        (lambda x: fusec.row_max(x > 0), "a float array")]:
        with pytest.raises(fusec.TraceError, match=message):
            fusec.jit(fn, backend="numpy")(x)
    half = fusec.jit(lambda h: h.max(-1, keepdims=True), backend="numpy")(x.astype(np.float16))
    assert half.dtype == np.float16  # NumPy's type


# ---- calling: out=, stream=, signatures


def test_arguments_bind_as_in_python():
    @fusec.jit(backend="numpy")
    def f(x, *rest, scale=2.0, **named):
        total = x * scale
        for r in rest:
            total = total + r
        for r in named.values():
            total = total - r
        return total

    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(f(x, x, x), np.full(3, 4, np.float32))
    np.testing.assert_array_equal(f(x, scale=5.0, b=x), np.full(3, 4, np.float32))
    np.testing.assert_array_equal(f(x, a=x, b=x * 2), np.full(3, -1, np.float32))
    np.testing.assert_array_equal(f(x, b=x * 2, a=x), np.full(3, -1, np.float32))
    with pytest.raises(TypeError, match="f\\(\\): missing a required argument: 'x'"):
        f(scale=1.0)


def test_parameters_named_like_builtins_and_a_keyword_argument_order():
    @fusec.jit(backend="numpy")
    def f(exp, e, where, t0):
        return np.exp(exp) * e + where - t0

    x = np.zeros(2, np.float32)
    np.testing.assert_array_equal(f(x, 2.0, x + 1, x), np.full(2, 3, np.float32))
    np.testing.assert_array_equal(f(t0=x, where=x + 1, e=2.0, exp=x), np.full(2, 3, np.float32))


def test_a_traced_function_called_while_tracing_is_traced_inline():
    @fusec.jit(backend="numpy")
    def inner(x, s):
        return x * s

    @fusec.jit(backend="numpy")
    def outer(x):
        return inner(x, 2.0) + 1.0

    x = np.arange(3, dtype=np.float16)
    np.testing.assert_array_equal(outer(x), x * 2 + 1)
    assert outer.source(x).count(";") == 2 and not inner.pipelines
    with pytest.raises(fusec.TraceError, match=r"inner\(\) called inside a traced function takes no out="):
        fusec.jit(lambda x: inner(x, 2.0, out=x), backend="numpy")(x)


# ---- the pipeline surface

def test_cuda_source_report_unfused_and_compile_for():
    @fusec.jit(backend="numpy")
    def bias_relu(x, b):
        """Adds b, then relu."""
        return np.maximum(x + b, 0.0)

    assert bias_relu.__name__ == "bias_relu" and bias_relu.__doc__ == "Adds b, then relu."
    assert bias_relu.__module__ == __name__ and bias_relu.__wrapped__.__qualname__ == bias_relu.__qualname__
    assert str(inspect.signature(bias_relu)) == "(x, b)"
    assert repr(bias_relu).startswith("<fusec traced function test_cuda_source_report_unfused_and_compile_for."
                                      "<locals>.bias_relu (fused, numpy): 0 signatures compiled>")
    for use in (lambda f: f.cuda_source, lambda f: f.report(), lambda f: f.unfused):
        with pytest.raises(RuntimeError, match="not been compiled yet: call it once or use .compile_for"):
            use(bias_relu)
    x32, x16 = np.ones((2, 5), np.float32), np.ones((2, 5), np.float16)
    pipeline = bias_relu.compile_for(x32, np.ones(5, np.float32))
    assert bias_relu.pipelines and pipeline.name == "bias_relu"
    assert bias_relu.cuda_source == pipeline.cuda_source and "__global__" in bias_relu.cuda_source
    assert [row["stages"] for row in bias_relu.report()] == [["t0", "out0"]]
    assert bias_relu.unfused.cuda_source.count("__global__") > bias_relu.cuda_source.count("__global__")
    assert "1 signature compiled" in repr(bias_relu)
    assert bias_relu.compile_for(x32, np.ones(5, np.float32)) is pipeline
    bias_relu(x16, np.ones(5, np.float16))  # the latest signature is the one the surface shows
    assert "__half" in bias_relu.cuda_source and "__half" not in pipeline.cuda_source


def test_options_are_checked_when_decorating():
    with pytest.raises(ValueError, match="backend must be one of"):
        fusec.jit(gelu, backend="opencl")
    with pytest.raises(TypeError, match="pipeline= names a pipeline of a .fz file"):
        fusec.jit(gelu, pipeline="gelu")
    with pytest.raises(TypeError, match="unexpected keyword argument 'fusion'"):
        fusec.jit(fusion=False)(gelu)


def test_auto_without_a_device_warns_once_when_decorating(monkeypatch):
    import fusec.runtime.backends.cuda as cuda
    monkeypatch.setattr(cuda, "available", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = fusec.jit(gelu)
        f(np.ones(2, np.float32))
        f(np.ones(2, np.float16))
    assert f.backend == "numpy" and len(caught) == 1 and "no CUDA device" in str(caught[0].message)
    assert caught[0].filename == __file__


# ---- what cannot be traced: TraceError, saying what to write instead

def test_decorator_rejects_what_cannot_be_traced():
    x = np.ones(3, np.float32)
    cases = [
        (lambda x: x if x > 0 else -x, "control flow.*use np.where\\(cond, a, b\\)"),
        (lambda x: max(x, 0), "min\\(\\), max\\(\\).*np.maximum"),
        (lambda x: x // 2, "`//` floors.*np.floor\\(a / b\\)"),
        (lambda x: np.floor_divide(x, 2), "np.floor\\(a / b\\)"),
        (lambda x: math.exp(x), "Python number.*np.exp\\(x\\)"),
        (lambda x: x[0], "indexing and slicing are not supported"),
        (lambda x: x.astype(np.int32) & 3, "`&` on i32 is bitwise"),
        (lambda x: x.astype(np.uint64) + x.astype(np.int32), "u64 and i32 have no common type"),
        (lambda x: 2.0 * 3.0, "must return arrays.*result 0 is float"),
        (lambda x: None, "result 0 is NoneType"),
    ]
    for fn, message in cases:
        with pytest.raises(fusec.TraceError, match=message):
            fusec.jit(fn, backend="numpy")(x)
    with pytest.raises(fusec.TraceError, match="integer / integer"):
        fusec.jit(lambda i, j: i / j, backend="numpy")(np.ones(3, np.int32), np.ones(3, np.int32))
    with pytest.raises(fusec.TraceError, match="must return arrays.*result 0 is a scalar expression"):
        fusec.jit(lambda x, s: s * 2.0, backend="numpy")(x, 1.0)
    with pytest.raises(fusec.TraceError, match="inside a @fusec.jit"):
        fusec.exp(x)
    with pytest.raises(fusec.TraceError, match="cannot pass a list"):
        fusec.jit(gelu, backend="numpy")([1.0])
    with pytest.raises(fusec.TraceError, match="a 0-d array"):
        fusec.jit(gelu, backend="numpy")(np.zeros((), np.float32))


def test_an_invalid_operation_points_at_the_python_line():
    @fusec.jit(backend="numpy")
    def negated_mask(x):
        return -(x > 0)

    with pytest.raises(fusec.FzError, match="unary '-' needs a number, got bool") as caught:
        negated_mask(np.ones(2, np.float32))
    line = inspect.getsourcelines(negated_mask.__wrapped__)[1] + 2  # the decorator's line, then def
    assert f"test_trace.py:{line}" in str(caught.value)
