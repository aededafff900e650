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




@pytest.mark.parametrize("rows", [1, 129])
def test_a_column_kernel_reads_broadcast_operands_at_its_row_and_column(rows, tmp_path):
    """Operands broadcast along each dim of a three-dim column kernel ([a, 1, 1], [b, 1],
    [c]), read at coordinates from the row and the thread's column, bit for bit."""
    from test_columns import THREE_DIMS
    path = tmp_path / "three.fz"
    path.write_text(THREE_DIMS)
    rng = np.random.default_rng(rows)
    args = (rng.standard_normal((rows, 3, 5)).astype(np.float32), rng.standard_normal((rows, 1, 1)).astype(np.float32),
            rng.standard_normal((3, 1)).astype(np.float32), rng.standard_normal(5).astype(np.float32))
    expected = fusec.jit(str(path), backend="numpy")(*args)
    got = fusec.jit(str(path), backend="sim")(*args)
    for e, a in zip(expected, got):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))
