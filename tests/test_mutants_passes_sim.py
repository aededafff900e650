"""Sim tests written for the survivors of the mutation run over the emitter
(benchmarks/mutation_run.py without the golden tests, BENCHMARKS.md: run 4)."""
import numpy as np
import pytest

import fusec

pytestmark = pytest.mark.sim

OUTER = "pipeline outer(r: f32[rows, 1], w: f32[cols], s: f32[d, 1, cols]) -> (z: f32[d, rows, cols]) {\n" \
        "    z = s - (r * 2.0 + w);\n}\n"


def test_a_kernel_that_loads_only_broadcast_arrays():
    """emit #210: every load of the kernel is a broadcast (an outer sum): each element's
    coordinates are computed for those loads, though no load is contiguous."""
    f = fusec.jit(OUTER, backend="sim")
    (launch,) = f.compiled.interface.kernels
    assert launch.kernel.loads and not any(a.contiguous for a in launch.kernel.loads)
    rng = np.random.default_rng(3)
    r = rng.standard_normal((5, 1)).astype(np.float32)
    w = rng.standard_normal(7).astype(np.float32)
    s = rng.standard_normal((3, 1, 7)).astype(np.float32)
    np.testing.assert_array_equal(f(r, w, s), s - (r * np.float32(2.0) + w))
