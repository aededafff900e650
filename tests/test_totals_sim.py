"""Totals over the rows on the sim (sim tier): the column sums of one column, their
finishes and the statements over them in one kernel of one block (a thread a run of
rows, the runs' sums added up in order by its first thread) give the reference's
bits: the order README's column sums fix, at odd row counts, one row, and all rows
ignored (0 / 0: NaN). Fused (one kernel) and unfused (a kernel a stage: the runs'
sums stored, then finished from memory)."""
import numpy as np
import pytest
from helpers import ROOT

import fusec
from fusec.reference import reduce_columns

pytestmark = pytest.mark.sim
TOTALS = str(ROOT / "tests/programs/totals.fz")


def _bits_equal(got, expected):
    for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
        assert np.asarray(g).dtype == np.asarray(e).dtype
        assert np.asarray(g).tobytes() == np.asarray(e).tobytes(), (g, e)


@pytest.mark.parametrize("fuse", ["auto", "none"])
@pytest.mark.parametrize("rows", [1, 3, 129, 301])
def test_a_masked_mean_equals_the_reference_bit_for_bit(rows, fuse):
    rng = np.random.default_rng(rows)
    # magnitudes over several decades, so that another order of additions rounds otherwise
    loss = (rng.standard_normal((rows, 1)) * 10.0 ** rng.integers(-3, 4, (rows, 1))).astype(np.float32)
    label = rng.integers(-1, 50, (rows, 1)).astype(np.int64)
    label[::4] = -100
    expected = fusec.jit(TOTALS, pipeline="masked_mean", backend="numpy")(loss, label)
    _bits_equal(fusec.jit(TOTALS, pipeline="masked_mean", backend="sim", fuse=fuse)(loss, label), expected)
    label[:] = -100  # every row ignored: 0 / 0
    got = fusec.jit(TOTALS, pipeline="masked_mean", backend="sim", fuse=fuse)(loss, label)
    assert np.isnan(got[0][0]) and got[1][0] == 0.0


@pytest.mark.parametrize("n", [1, 130, 515])
def test_an_f64_total_equals_the_reference_bit_for_bit(n):
    x = np.random.default_rng(n).standard_normal((n, 1)) * 1e3
    _bits_equal(fusec.jit(TOTALS, pipeline="total_f64", backend="sim")(x, 0.5),
                fusec.jit(TOTALS, pipeline="total_f64", backend="numpy")(x, 0.5))


@pytest.mark.parametrize("rows", [1, 257])
def test_cross_entropy_mean_is_the_fixed_order_sum_of_its_losses(rows):
    """The row kernel's losses agree with the reference to its bounds; the mean over
    them is the fixed order's, bit for bit, of the losses the sim computed."""
    rng = np.random.default_rng(rows)
    logits = rng.standard_normal((rows, 40)).astype(np.float32)
    label = rng.integers(0, 40, (rows, 1)).astype(np.int64)
    label[::3] = -100
    loss, mean = fusec.jit(str(ROOT / "examples/cross_entropy.fz"), pipeline="cross_entropy", backend="sim")(logits, label)
    counted = np.where(label == -100, 0.0, 1.0).astype(np.float32)

    def total(x):  # the 128 runs' sums, then those in order
        return reduce_columns("col_sum", reduce_columns("col_partial", x))
    expected = total(np.asarray(loss)) / total(counted)
    assert np.asarray(mean).tobytes() == np.asarray(expected, np.float32).tobytes()
