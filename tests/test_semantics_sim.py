"""Conversions and literals on every backend (sim tier): the NumPy reference and
the emitted C run on the CPU, fused, unfused and persistent, give the same bits,
and those bits are the ones computed here independently with `fractions`."""
import functools
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import fusec

pytestmark = pytest.mark.sim
BF16 = ml_dtypes.bfloat16
FORMS = [dict(backend="numpy"), dict(backend="sim"), dict(backend="sim", fuse=False),
         dict(backend="sim", persistent=True)]
FORM_IDS = ["numpy", "sim-fused", "sim-unfused", "sim-persistent"]


def nearest(x: Fraction, dtype) -> float:
    """x rounded to nearest even among the finite values of a 16-bit float type,
    found by search over all of them (no rounding arithmetic to share a bug with)."""
    finite = _finite_values(dtype)
    top = finite[-1]
    ulp = Fraction(top) - Fraction(finite[-2])
    if abs(x) >= Fraction(top) + ulp / 2:
        return float(np.copysign(np.inf, float(x)))
    mag = abs(x)
    k = int(np.searchsorted(finite, float(mag)))  # a float64 neighbourhood; refined exactly below
    near = [Fraction(v) for v in finite[max(k - 2, 0):k + 2]]
    best = min(near, key=lambda v: (abs(v - mag), _odd(v, dtype)))
    return float(best) if x >= 0 else -float(best)


@functools.cache
def _finite_values(dtype) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # the NaN patterns
        patterns = np.arange(0, 0x8000, dtype=np.uint16).view(dtype).astype(np.float64)
    return np.sort(patterns[np.isfinite(patterns)])


def _odd(v: Fraction, dtype) -> int:
    return int(np.array(float(v)).astype(dtype).view(np.uint16)) & 1


# Values between two bf16 numbers whose f32 rounding lands on the tie between them.
BF16_CASES = {
    "f64": [1 + 2 ** -8 + 2 ** -40, -(1 + 2 ** -8 + 2 ** -40), 3 * 2 ** 100 + 2 ** 93 + 2 ** 60, 1 + 2 ** -8 - 2 ** -40],
    "i32": [2 ** 30 + 2 ** 22 + 1, -(2 ** 30 + 2 ** 22 + 1), 2 ** 31 - 1, -2 ** 31, 2 ** 24 + 2 ** 16 + 1],
    "u32": [2 ** 31 + 2 ** 23 + 1, 2 ** 32 - 1, 2 ** 26 + 2 ** 18 + 1, 5],
    "i64": [2 ** 40 + 2 ** 32 + 1, -(2 ** 62 + 2 ** 54 + 1), 2 ** 63 - 1, -2 ** 63, 2 ** 54 + 2 ** 46 + 2 ** 11],
    "u64": [2 ** 63 + 2 ** 55 + 1, 2 ** 64 - 1, 2 ** 60 + 2 ** 52 + 2 ** 10, 2 ** 53 + 2 ** 45 + 1],
}
DTYPES = {"f64": np.float64, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64}


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_conversions_to_bf16_round_once(form):
    names = list(BF16_CASES)
    params = ", ".join(f"{t}: {t}[n_{t}]" for t in names)  # each its own size
    outputs = ", ".join(f"c_{t}: bf16[n_{t}], s_{t}: bf16[n_{t}]" for t in names)
    body = "\n".join(f"    c_{t} = bf16({t});\n    s_{t} = {t};" for t in names)  # a cast, and a store
    f = fusec.jit(f"pipeline p({params}) -> ({outputs}) {{\n{body}\n}}", **form)
    args = [np.array(BF16_CASES[t], DTYPES[t]) for t in names]
    results = f(*args)
    for k, t in enumerate(names):
        expected = [nearest(Fraction(int(v)) if t != "f64" else Fraction(float(v)), BF16) for v in BF16_CASES[t]]
        for out in results[2 * k:2 * k + 2]:
            assert out.astype(np.float64).tolist() == expected, t


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_f64_to_f16_rounds_once(form):
    values = [1 + 2 ** -11 + 2 ** -40, -(1 + 2 ** -11 + 2 ** -40), 65519.99, 65520.0, 2.0 ** -24 * 1.5 + 2.0 ** -60]
    f = fusec.jit("pipeline p(x: f64[n]) -> (y: f16[n], z: f16[n]) { y = f16(x); z = x; }", **form)
    for out in f(np.array(values)):
        assert out.astype(np.float64).tolist() == [nearest(Fraction(v), np.float16) for v in values]


LITERALS = """
stage half(a: f16) -> f16 { return a; }
stage lit() -> bf16 { return 0.1; }
pipeline p(x: f32[n], h: f16[n]) -> (a: f32[n], b: f32[n], c: f32[n], d: f32[n], e: f16[n], g: bf16[n], k: f32[n]) {
    a = x + f32(f16(70000.0));
    b = x + f32(bf16(0.1));
    c = x + f32(half(0.1));
    d = x + f32(lit());
    e = h * 0.1;
    g = 0.1;
    k = x * 3.4028235e38;
}
"""


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_literals_are_rounded_where_stored_and_kept_in_f32_as_f16_operands(form):
    f = fusec.jit(LITERALS, **form)
    a, b, c, d, e, g, k = f(np.ones(300, np.float32), np.full(300, 3, np.float16))
    assert (a == np.inf).all()
    assert (b == 1 + 0.10009765625).all()
    assert (c == np.float32(1) + np.float32(nearest(Fraction(1, 10), np.float16))).all()
    assert (d == np.float32(1) + np.float32(0.10009765625)).all()
    # 3 * f32(0.1), rounded once to f16; not 3 * f16(0.1)
    assert (e == nearest(3 * Fraction(float(np.float32(0.1))), np.float16)).all()
    assert (g.astype(np.float64) == 0.10009765625).all()
    assert (k == np.finfo(np.float32).max).all()


LOOP_ONLY = """
pipeline p(x: f32[n], k: i32) -> (y: f32[n], z: f32[n], w: f32[n]) {
    repeat 2 { w = x + 1.0; }
    repeat k { y = x * 2.0; z = y + w; }
    z = z + y;
}
"""


@pytest.mark.parametrize("form", FORMS[1:], ids=FORM_IDS[1:])
def test_outputs_that_only_a_loop_assigns_reach_memory(form):
    f = fusec.jit(LOOP_ONLY, **form)
    x = np.arange(1000, dtype=np.float32)
    for k in (1, 3):
        y, z, w = f(x, k)
        np.testing.assert_array_equal(w, x + 1)
        np.testing.assert_array_equal(y, x * 2)
        np.testing.assert_array_equal(z, (x * 2 + (x + 1)) + x * 2)


# Scalar-only statements: inlined into their readers (no kernel of their own),
# except where the value must be in memory: carried around a repeat (the entry
# and the loop's statement), and, unfused, what reads it after the loop (fused,
# that cheap statement is recomputed in its reader's kernel). Counts: (fused, unfused).
SCALAR_ONLY = {
    "chain": ("pipeline p(x: f32[n], s: f32, k: i32) -> (y: f32[n]) {\n"
              "    t = s * 2.0;\n    u = t + 1.0;\n    y = x * u + t;\n}", 0),
    "f16_store_rounds": ("pipeline p(x: f32[n], s: f32, k: i32) -> (y: f32[n]) {\n"
                         "    t = f16(s * 0.1);\n    y = x + f32(t) * 1000.0;\n}", 0),
    "narrow_int_wraps": ("pipeline p(x: i32[n], s: f32, k: i32) -> (y: i32[n]) {\n"
                         "    t = i8(k) * i8(100);\n    y = x + i32(t);\n}", 0),
    "stage_two_results": ("stage sc(a: f32) -> (p: f32, q: bf16) { p = a * a; q = a / 3.0; }\n"
                          "pipeline p(x: f32[n], s: f32, k: i32) -> (y: f32[n], z: f32[n]) {\n"
                          "    a, b = sc(s);\n    y = x * a;\n    z = x + f32(b);\n}", 0),
    "dead": ("pipeline p(x: f32[n], s: f32, k: i32) -> (y: f32[n]) {\n    t = s * 2.0;\n    y = x;\n}", 0),
    "in_loop": ("pipeline p(x: f32[n], s: f32, k: i32) -> (y: f32[n]) {\n"
                "    y = x;\n    repeat k { t = s * 0.5; y = y * t + 1.0; }\n}", 0),
    "carried": ("pipeline p(x: f32[n], s: f32, k: i32) -> (y: f32[n]) {\n"
                "    t = s + 1.0;\n    repeat k { t = t * 0.5; }\n    u = t * 3.0;\n    y = x * u;\n}", (2, 3)),
    "loop_emptied": ("pipeline p(x: f32[n], s: f32, k: i32) -> (y: f32[n]) {\n"
                     "    y = x;\n    repeat k { t = s * 0.5; }\n    y = y + 1.0;\n}", 0),
}


@pytest.mark.parametrize("form", FORMS[1:], ids=FORM_IDS[1:])
@pytest.mark.parametrize("name", list(SCALAR_ONLY))
def test_scalar_only_statements_agree_with_the_reference_in_every_form(name, form):
    source, kernels_0d = SCALAR_ONLY[name]
    f, ref = fusec.jit(source, **form), fusec.jit(source, backend="numpy")
    if isinstance(kernels_0d, tuple):
        kernels_0d = kernels_0d[form.get("fuse") is False]
    assert sum(1 for k in f.compiled.interface.kernels if k.kernel.shape == ()) == kernels_0d
    dtype = np.int32 if "x: i32" in source else np.float32
    x = (np.arange(300) - 150).astype(dtype)
    for s, k in ((0.7, 3), (-1.3e4, 1), (2.0, 5)):
        got, expected = f(x, s, k), ref(x, s, k)
        for a, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
            np.testing.assert_array_equal(a, e)


# min, max and clamp follow fminf/fmaxf: a NaN operand yields the other, in either place.
MIN_MAX_TYPES = {"f16": np.float16, "bf16": BF16, "f32": np.float32, "f64": np.float64}
MIN_MAX = (f"pipeline p({', '.join(f'a_{t}: {t}[n_{t}], b_{t}: {t}[n_{t}]' for t in MIN_MAX_TYPES)}) -> ("
           + ", ".join(f"lo_{t}: {t}[n_{t}], hi_{t}: {t}[n_{t}], c_{t}: {t}[n_{t}]" for t in MIN_MAX_TYPES) + ") {\n"
           + "".join(f"    lo_{t} = min(a_{t}, b_{t});\n    hi_{t} = max(a_{t}, b_{t});\n"
                     f"    c_{t} = clamp(a_{t}, b_{t}, 2.0);\n" for t in MIN_MAX_TYPES) + "}")


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_min_max_clamp_yield_the_other_operand_of_a_nan(form):
    f = fusec.jit(MIN_MAX, **form)
    a = [1.0, np.nan, np.nan, -2.0, 0.5, np.inf, 3.0, np.nan]
    b = [np.nan, 3.0, np.nan, -np.inf, 0.25, -1.0, np.nan, -0.5]
    args = []
    for k, dtype in enumerate(MIN_MAX_TYPES.values()):  # each type its own length
        args += [np.array(a[:5 + k], dtype), np.array(b[:5 + k], dtype)]
    results = f(*args)
    for k, t in enumerate(MIN_MAX_TYPES):
        x, y = np.array(a[:5 + k]), np.array(b[:5 + k])
        lo, hi, c = (r.astype(np.float64) for r in results[3 * k:3 * k + 3])
        np.testing.assert_array_equal(lo, np.fmin(x, y), err_msg=f"min {t}")
        np.testing.assert_array_equal(hi, np.fmax(x, y), err_msg=f"max {t}")
        np.testing.assert_array_equal(c, np.fmin(np.fmax(x, y), 2.0), err_msg=f"clamp {t}")


ROUNDED_STORES = """
stage third(a: f16) -> f16 { return a / 3.0; }
stage third_b(a: bf16) -> bf16 { return a / 3.0; }
stage widen(a: f16) -> f32 { return f32(a); }
stage widen_b(a: bf16) -> f32 { return f32(a); }
pipeline p(h: f16[n], g: bf16[m]) -> (r: f32[n], rb: f32[m], a: f32[n], ab: f32[m], s: f32[n], sb: f32[m]) {
    r = f32(third(h));
    rb = f32(third_b(g));
    a = widen(h / 3.0);
    ab = widen_b(g / 3.0);
    t = h / 3.0;
    tb = g / 3.0;
    s = f32(t);
    sb = f32(tb);
}
"""


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_f16_and_bf16_values_are_rounded_where_a_stage_returns_takes_or_a_statement_stores_them(form):
    """Computed in f32, rounded to the storage type at a stage's result, at a
    stage's parameter and at a statement's target, then read back exactly."""
    f = fusec.jit(ROUNDED_STORES, **form)
    values = [1.0, 2.0, 5.0, 7.0, 10.0, 11.0, 13.0, -17.0]
    h, g = np.array(values, np.float16), np.array(values[:-1], BF16)  # each its own size
    r, rb, a, ab, s, sb = f(h, g)
    for got, dtype, n in ((r, np.float16, 8), (a, np.float16, 8), (s, np.float16, 8),
                          (rb, BF16, 7), (ab, BF16, 7), (sb, BF16, 7)):
        quotients = [np.float32(v) / np.float32(3) for v in values[:n]]  # the f32 arithmetic
        assert got.tolist() == [nearest(Fraction(float(q)), dtype) for q in quotients]


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_comparisons_at_equality_and_either_side(form):
    """Each comparison on equal, smaller and larger operands (and NaN), exactly."""
    f = fusec.jit("pipeline p(x: f32[n], y: f32[n]) -> (lt: bool[n], le: bool[n], gt: bool[n], ge: bool[n], "
                  "eq: bool[n], ne: bool[n]) { lt = x < y; le = x <= y; gt = x > y; ge = x >= y; eq = x == y; "
                  "ne = x != y; }", **form)
    x = np.array([1.0, 1.0, 2.0, np.nan, -0.0], np.float32)
    y = np.array([1.0, 2.0, 1.0, 1.0, 0.0], np.float32)
    got = f(x, y)
    want = (x < y, x <= y, x > y, x >= y, x == y, x != y)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
