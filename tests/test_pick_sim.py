"""row_pick as one load a row (sim tier): the element at the index, exactly (NaN,
infinities, -0 kept), 0 where the index is outside the row (-100, -1, the length,
far beyond), for bf16 and f64 rows and an i32 index, at lengths the lanes and block
kernels take."""
import ml_dtypes
import numpy as np
import pytest

import fusec

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("length", [5, 3000])
def test_a_picked_element_is_exact_and_zero_outside_the_row(length):
    rng = np.random.default_rng(length)
    index = np.array([0, length - 1, -100, -1, length, 2 ** 40, 1 % length, length // 2], np.int64)[:, None]
    for xt, it, acc in [("bf16", "i64", "f32"), ("f64", "i32", "f64")]:
        source = (f"pipeline p(x: {xt}[r, c], j: {it}[r, 1]) -> (k: {acc}[r, 1], s: {acc}[r, 1]) {{\n"
                  "    k = row_pick(x, j); s = row_max(x) - row_pick(x, j);\n}")
        dtype = {"bf16": ml_dtypes.bfloat16, "f64": np.float64, "f32": np.float32}[xt]
        x = (rng.standard_normal((len(index), length)) * 100).astype(dtype)
        x[6, 1 % length] = np.nan
        x[7, length // 2] = -np.inf
        x[0, 0] = -0.0
        j = np.clip(index, -2 ** 31, 2 ** 31 - 1).astype(np.int32 if it == "i32" else np.int64)
        want = fusec.jit(source, backend="numpy")(x, j)
        got = fusec.jit(source, backend="sim")(x, j)
        for g, w in zip(got, want):
            assert np.asarray(g).tobytes() == np.asarray(w).tobytes(), (xt, it)
