"""Fast math in the sim: the emitted intrinsics compile on the host (the shim
computes them accurately), so the sim equals the accurate reference, but for
erf: fast math's erf is fusec's own formula (the prelude's fz_erf_fast), which
the sim runs as written, with exp2f for PTX's ex2.approx.ftz.f32."""
import math

import numpy as np
import pytest
from helpers import ROOT

import fusec

pytestmark = pytest.mark.sim

ERF_BOUND = 2 ** -17  # README: fast math's erf, relative to |erf(x)|


def test_the_sim_runs_fast_math_modules_accurately():
    path = str(ROOT / "examples/transcendental_chain.fz")
    x = np.linspace(-2, 2, 1003).astype(np.float32)
    fast = fusec.jit(path, backend="sim", fast_math=True)(x)
    # y = atan2(erf(f), 1 + a): the fast erf's relative error carries into y at most once
    np.testing.assert_allclose(fast, fusec.jit(path, backend="numpy")(x), rtol=2e-6 + ERF_BOUND, atol=1e-7)


def normal_f32_grid(lo: float, hi: float, n: int) -> np.ndarray:
    """About n f32 values spread evenly through [lo, hi] by bit pattern (as many
    of each binade as the next), with both ends."""
    ends = np.array([lo, hi], np.float32).view(np.int32)
    return np.unique(np.linspace(ends[0], ends[1], n).astype(np.int32)).view(np.float32)


def test_fast_erf_in_the_sim_is_within_its_stated_error_over_a_dense_grid():
    """fz_erf_fast's formula (all of it but ex2.approx, which the README's bound
    allows for) against math.erf: over a million normal f32 of each sign from
    2^-126 to 6 (every binade: the small path's relative error near 0, the switch
    at 0.8125, the tail where erf rounds to 1), odd to the bit, with the limits
    exact. A coefficient off in its fourth digit breaks the bound."""
    pos = normal_f32_grid(2.0 ** -126, 6.0, 1 << 20)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 3.4e38, 0.8125, -0.8125], np.float32)
    x = np.concatenate([pos, -pos, special])
    f = fusec.jit("pipeline p(x: f32[n]) -> (y: f32[n]) { y = erf(x); }", backend="sim", fast_math=True)
    assert "fz_erf_fast(" in f.cuda_source
    y = f(x)
    n = len(pos)
    got, neg, tail = y[:n].astype(np.float64), y[n:2 * n], y[2 * n:]
    truth = np.frompyfunc(math.erf, 1, 1)(pos.astype(np.float64)).astype(np.float64)
    relative = np.abs(got - truth) / truth
    worst = int(np.argmax(relative))
    assert relative[worst] <= ERF_BOUND, (float(pos[worst]), math.log2(relative[worst]))
    assert relative.max() > ERF_BOUND / 2  # the bound is the formula's: measured 2^-17.32 in all
    np.testing.assert_array_equal(neg, -y[:n])  # odd
    assert np.array_equal(tail[:4], [0.0, -0.0, 1.0, -1.0]) and np.signbit(tail[1]) and not np.signbit(tail[0])
    assert np.isnan(tail[4]) and np.array_equal(tail[5:8], [1.0, -1.0, 1.0])
    assert abs(tail[8] - math.erf(0.8125)) <= ERF_BOUND * math.erf(0.8125) and tail[9] == -tail[8]
