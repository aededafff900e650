"""Column sums on the sim (sim tier): the emitted column kernels bit for bit
against the reference in every form, at row counts around the chunking (0, 1,
one past a chunk count, several rows a chunk), dims of distinct sizes."""
import ml_dtypes
import numpy as np
import pytest
from helpers import ROOT

import fusec

pytestmark = pytest.mark.sim
COLUMNS = ROOT / "tests/programs/columns.fz"


@pytest.mark.parametrize("form", [{}, {"fuse": "none"}, {"persistent": True}])
@pytest.mark.parametrize("rows", [0, 1, 129, 700])
def test_the_sim_equals_the_reference_bit_for_bit(rows, form):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 7)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    g = rng.standard_normal((rows, 7)).astype(np.float32)
    for name, args in [("bias_relu_grads", (x, b, g)),
                       ("column_mix", (rng.standard_normal((rows, 3, 5)).astype(np.float16),
                                       rng.standard_normal(5).astype(np.float32), 0.25)),
                       ("column_f64", (rng.standard_normal((rows, 6)),)),
                       ("batch_total", (rng.standard_normal((rows, 1)).astype(ml_dtypes.bfloat16),))]:
        expected = fusec.jit(str(COLUMNS), pipeline=name, backend="numpy")(*args)
        got = fusec.jit(str(COLUMNS), pipeline=name, backend="sim", **form)(*args)
        for e, a in zip(expected if isinstance(expected, tuple) else (expected,),
                        got if isinstance(got, tuple) else (got,)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


