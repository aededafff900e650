"""row_position(x): each element's place along the last axis (sim tier and
reference). Exact (integers and selects), in every kernel form that can hold it:
an elementwise kernel (one element and vectors a thread, and the persistent
grid-stride form), a row kernel (each strategy), a column kernel over three dims."""
import numpy as np
import pytest
from helpers import load_program  # noqa: F401  (the tier's shared helpers)

import fusec
from fusec.errors import FzError

pytestmark = pytest.mark.sim

ELEMENTWISE = """pipeline p(x: f32[r, c], j: i64[r, 1], w: f32[c]) -> (y: f32[r, c], z: i64[r, c], u: i64[r, c]) {
    y = row_position(x) == j ? w : 0.0;
    z = row_position(w) * 3 + row_position(j);
    u = row_position(x * 2.0);
}"""


def elementwise_args(rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    j = rng.integers(-1, cols + 1, (rows, 1))
    w = rng.standard_normal(cols).astype(np.float32)
    return x, j, w


@pytest.mark.parametrize("rows,cols", [(3, 37), (5, 64), (1, 1), (4, 8)])
def test_the_reference_places_each_element_along_its_last_axis(rows, cols):
    x, j, w = elementwise_args(rows, cols)
    y, z, u = fusec.jit(ELEMENTWISE, backend="numpy")(x, j, w)
    place = np.arange(cols)
    np.testing.assert_array_equal(y, np.where(place == j, w, 0.0).astype(np.float32))
    np.testing.assert_array_equal(z, np.broadcast_to(place * 3, (rows, cols)))  # j's last axis is a 1: 0
    np.testing.assert_array_equal(u, np.broadcast_to(place, (rows, cols)))


@pytest.mark.parametrize("options", [{"fuse": "auto"}, {"fuse": "none"}, {"persistent": True}],
                         ids=["fused", "unfused", "persistent"])
@pytest.mark.parametrize("rows,cols", [(3, 37), (5, 64), (2, 4)])
def test_elementwise_kernels_give_the_reference_exactly(rows, cols, options):
    args = elementwise_args(rows, cols, seed=rows)
    f = fusec.jit(ELEMENTWISE, backend="sim", **options)
    want = fusec.jit(ELEMENTWISE, backend="numpy")(*args)
    for got, expected in zip(f(*args), want):
        np.testing.assert_array_equal(got, expected)
    if cols % 4 == 0 and options.get("fuse") == "auto":  # whole vectors a row: the vector variant ran
        assert f._runner.backend.launched[-1].endswith(("_v4", "_v2", "_v8"))


ROW = """pipeline q(x: f32[r, c], j: i64[r, 1]) -> (y: f32[r, c]) {
    y = exp(x - row_max(x)) * (row_position(x) == j ? 2.0 : 1.0);
}"""


@pytest.mark.parametrize("length", [5, 64, 300, 1028])
def test_a_row_kernel_places_each_element_along_its_row(length):
    rng = np.random.default_rng(length)
    x = rng.standard_normal((3, length)).astype(np.float32)
    j = rng.integers(0, length, (3, 1))
    f = fusec.jit(ROW, backend="sim")
    got = f(x, j)
    assert len(f.compiled.interface.kernels) == 1  # one row kernel
    base = fusec.jit("pipeline q(x: f32[r, c]) -> (y: f32[r, c]) { y = exp(x - row_max(x)); }", backend="sim")(x)
    hit = np.arange(length) == j  # exactly the element at each row's j doubled (x 2 is exact)
    np.testing.assert_array_equal(got, np.where(hit, base * 2, base))
    np.testing.assert_allclose(got, fusec.jit(ROW, backend="numpy")(x, j), rtol=1e-6)


def test_a_column_kernel_over_three_dims_keeps_the_last_its_own():
    source = """pipeline s(x: f32[a, b, c]) -> (t: f32[b, c], y: f32[a, b, c]) {
    y = x * f32(row_position(x));
    t = col_sum(y);
}"""
    x = np.random.default_rng(3).standard_normal((5, 3, 7)).astype(np.float32)
    got = fusec.jit(source, backend="sim")(x)
    want = fusec.jit(source, backend="numpy")(x)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(want[1], x * np.arange(7, dtype=np.float32))


@pytest.mark.parametrize("source,message", [
    ("pipeline p(s: f32) -> (y: i64[n]) { y = row_position(s); }", "its argument is a scalar"),
    ("pipeline p(x: f32[n]) -> (y: i64[n]) { y = row_position(x, x); }", "takes 1 argument, got 2"),
    ("stage f(a: f32) -> f32 { return f32(row_position(a)); }\npipeline p(x: f32[n]) -> (y: f32[n]) { y = f(x); }",
     "belongs in a pipeline statement"),
])
def test_row_position_used_wrongly_is_a_located_error(source, message):
    with pytest.raises(FzError) as raised:
        fusec.jit(source, backend="numpy")
    assert message in str(raised.value) and "error:" in str(raised.value)


def test_foreach_refuses_a_pipeline_reading_row_position():
    f = fusec.jit("pipeline p(x: f32[r, c]) -> (y: i64[r, c]) { y = row_position(x); }", backend="sim")
    with pytest.raises(ValueError, match="row_position"):
        f.foreach([(np.ones((2, 3), np.float32),)])
