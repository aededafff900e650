"""row_length(x) in every kernel form that can hold it, on the sim (sim tier): a row
kernel with the row in registers, a warp per row, a block per row, a cluster's row, and
alone (unfused: a row kernel that reads nothing), against the NumPy reference."""
import numpy as np
import pytest
from helpers import load_program  # noqa: F401  (the tier's shared helpers)

import fusec

pytestmark = pytest.mark.sim

SOURCE = """pipeline p(x: f32[r, c], k: i32[r, c], d: f64[r, c]) -> (y: f32[r, c], n: f32[r, 1], m: f64[r, 1], q: f32[r, 1]) {
    y = x / row_length(x) + row_sum(x) / row_length(k);
    n = row_length(x * 2.0);
    m = row_length(d);
    q = row_length(k);
}"""


@pytest.mark.parametrize("options", [{}, {"fuse": "none"}, {"persistent": True}], ids=["fused", "unfused", "persistent"])
@pytest.mark.parametrize("cols,variant", [(5, "_warp"), (64, "_r8_v4"), (1028, "_r128_v4"), (20000, "_c4_r256_v4")])
def test_every_row_kernel_gives_the_length(cols, variant, options):
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    k = rng.integers(0, 5, (3, cols)).astype(np.int32)
    d = rng.standard_normal((3, cols))
    f = fusec.jit(SOURCE, backend="sim", **options)
    found = f(x, k, d)
    want = fusec.jit(SOURCE, backend="numpy")(x, k, d)
    np.testing.assert_allclose(found[0], want[0], rtol=1e-5, atol=1e-6)  # the row sum's order differs
    for got, expected in zip(found[1:], want[1:]):
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == expected.dtype
    if "fuse" not in options:
        assert f._runner.backend.launched[-1].endswith(variant)
