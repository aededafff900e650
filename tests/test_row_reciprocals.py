"""Division by a per-row sum lowered to a reciprocal once a row (passes/row_reciprocals.py):
which divisions are rewritten, and the rewrite's arithmetic against IEEE division in NumPy
(the sim tier runs the emitted kernels: tests/test_row_reciprocals_sim.py)."""
import numpy as np
import pytest
from helpers import check_source, ulp_distance

from fusec.errors import Source
from fusec.passes.lower import lower
from fusec.passes.row_reciprocals import SCALE, divide_by_row_reciprocals


def divisions(body: str, params: str = "x: f32[r, c]", outputs: str = "y: f32[r, c]") -> list[tuple[bool, bool]]:
    """Per division left in the lowered pipeline: (its dividend a constant, its divisor per row)."""
    program = check_source(Source("t.fz", f"pipeline p({params}) -> ({outputs}) {{ {body} }}"))
    graph = divide_by_row_reciprocals(lower(program, program.pipeline("p")))
    shapes = {v.name: v.shape for v in graph.values}
    found = []
    for stage in graph.stages:
        instrs = stage.body.instrs
        for ins in instrs:
            if ins.op == "div":
                a, d = (instrs[i] for i in ins.args)
                per_row = all(shapes[j.attr][-1] == 1 for j in instrs[:ins.args[1] + 1] if j.op == "load"
                              and instrs.index(j) <= ins.args[1])
                found.append((a.op == "const", d.op != "load" or per_row))
    return found


def test_softmax_divides_once_a_row():
    """Its only division left is 1 / (sum * scale), a value per row."""
    assert divisions("m = row_max(x); e = exp(x - m); y = e / row_sum(e);") == [(True, True)]


@pytest.mark.parametrize("divisor", ["row_mean(x)", "sqrt(row_var(x)) + 1.0", "row_logsumexp(x) * 2.0"])
def test_every_inexact_reduction_is_divided_by_its_reciprocal(divisor):
    assert divisions(f"y = x / ({divisor});") == [(True, True)]


@pytest.mark.parametrize("body", [
    "y = x / row_max(x);",                     # an exact divisor: the division stays (its result exact)
    "y = x / (row_pick(x, j) + 1.0);",
    "y = x / row_length(x);",
    "y = x / (row_sum(x) * w);",               # a divisor varying along the row
])
def test_exact_or_per_element_divisors_keep_their_division(body):
    found = divisions(body, "x: f32[r, c], j: i64[r, 1], w: f32[c]")
    assert found and not any(constant for constant, _ in found)


def test_a_value_per_row_divided_by_one_keeps_its_division():
    assert divisions("s = row_sum(x); m = s / row_sum(x * x); y = x * m;") == [(False, True)]


def rewritten(a: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The rewrite's arithmetic, step by step in a's type (what the kernels compute)."""
    t = a.dtype.type
    magnitude = np.abs(d)
    scale = np.where(magnitude < t(1 / SCALE), t(SCALE), np.where(magnitude > t(SCALE), t(1 / SCALE), t(1)))
    with np.errstate(all="ignore"):
        return (a * scale) * (t(1) / (d * scale))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_rewrite_is_within_two_ulp_of_the_division_and_the_same_at_its_ends(dtype):
    """Over divisors from the smallest subnormal to the largest finite value (and 0, inf, NaN),
    dividends of every magnitude: within 2 ulp of IEEE a / d, the same non-finite results and
    zeros. Without the scale a subnormal divisor's reciprocal overflows (1 / 1e-40 in f32)."""
    rng = np.random.default_rng(7)
    info = np.finfo(dtype)
    bits = np.uint32 if dtype == np.float32 else np.uint64
    n = 200_000
    a = rng.integers(0, np.iinfo(bits).max, n, dtype=bits).view(dtype)
    d = rng.integers(0, np.iinfo(bits).max, n, dtype=bits).view(dtype)
    d[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, info.smallest_subnormal, info.max, -info.smallest_normal]
    a[8:16] = [0.0, 1.0, np.inf, info.max, info.smallest_subnormal, -2.5, np.nan, 1e-3]
    d[8:16] = info.smallest_subnormal * 3
    with np.errstate(all="ignore"):
        want = a / d
    got = rewritten(a, d)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    assert np.max(ulp_distance(got[finite], want[finite])) <= 2
    with np.errstate(over="ignore"):
        assert not np.isfinite(dtype(1) / info.smallest_subnormal)  # the overflow the scale avoids
