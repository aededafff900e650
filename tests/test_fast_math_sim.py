"""Fast math in the sim: the emitted intrinsics compile on the host (the shim
computes them accurately), so the sim equals the accurate reference."""
import numpy as np
import pytest
from helpers import ROOT

import fusec

pytestmark = pytest.mark.sim


def test_the_sim_runs_fast_math_modules_accurately():
    path = str(ROOT / "examples/transcendental_chain.fz")
    x = np.linspace(-2, 2, 1003).astype(np.float32)
    fast = fusec.jit(path, backend="sim", fast_math=True)(x)
    np.testing.assert_allclose(fast, fusec.jit(path, backend="numpy")(x), rtol=2e-6, atol=1e-7)
