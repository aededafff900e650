"""A division by a per-row sum, as the kernels compute it (sim tier): a reciprocal once a
row (passes/row_reciprocals.py), within 2 ulp of IEEE division for divisors from the
smallest subnormal to the largest finite value, and the same 0, infinities and NaN; fused
and unfused the same bits. Each row's sum is exact here (one nonzero element; a row of
zeros sums to +0), so the division alone is measured."""
import numpy as np
import pytest
from helpers import ulp_distance
from test_reductions_sim import STRATEGIES, force

import fusec

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("strategy", ["warp-resident", "block-resident", "block"])
@pytest.mark.parametrize("t", ["f32", "f64"])
def test_division_by_a_row_sum_against_ieee_division(t, strategy, monkeypatch):
    assert strategy in STRATEGIES
    force(monkeypatch, strategy)
    dtype = np.float32 if t == "f32" else np.float64
    info = np.finfo(dtype)
    source = f"pipeline p(a: {t}[r, c], x: {t}[r, c]) -> (y: {t}[r, c]) {{ y = a / row_sum(x); }}"
    rows, length = 24, 64
    rng = np.random.default_rng(3)
    divisors = np.array([info.smallest_subnormal, -info.smallest_subnormal * 5, info.smallest_normal / 3,
                         info.smallest_normal, 2.0 ** -64 * 0.75, 2.0 ** -64, 1.0, -3.0, 2.0 ** 64, 2.0 ** 64 * 1.5,
                         info.max / 7, info.max, -info.max, 0.0, np.inf, -np.inf, np.nan,
                         *rng.standard_normal(7)], dtype)
    x = np.zeros((rows, length), dtype)
    x[np.arange(rows), rng.integers(0, length, rows)] = divisors
    bits = np.uint32 if t == "f32" else np.uint64
    a = rng.integers(0, np.iinfo(bits).max, (rows, length), dtype=bits).view(dtype)
    a[:, :6] = [0.0, 1.0, info.max, info.smallest_subnormal, np.inf, -info.max / 3]
    with np.errstate(all="ignore"):
        want = a / divisors[:, None]
    got = fusec.jit(source, backend="sim")(a, x)
    unfused = fusec.jit(source, backend="sim", fuse="none")(a, x)
    np.testing.assert_array_equal(got.view(bits), unfused.view(bits))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    finite = np.isfinite(want)
    assert np.isfinite(got[finite]).all()
    assert ulp_distance(got[finite], want[finite]).max() <= 2
