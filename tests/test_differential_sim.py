"""Differential testing: random well-typed programs, compiled fused and
unfused and run in the sim, give exactly what the NumPy reference gives.

The generator uses only operations both sides compute correctly rounded
(+ - * / sqrt, min/max, rounding, comparisons, casts, select, integer
arithmetic), so the comparison is exact, bit for bit; the sim compiles with
no FMA contraction, as the README says."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusec.errors import Source
from fusec.frontend import check_source
from fusec.jit import JitOptions, JitPipeline
from fusec.reference import run as reference

pytestmark = pytest.mark.sim


def floats(ints):
    leaves = st.sampled_from(["a", "s", "f32(b)", "b", "0.5", "3.0", "f32(c)", "(-2.25)"])
    return st.recursive(leaves, lambda sub: st.one_of(
        st.tuples(sub, st.sampled_from(["+", "-", "*", "/"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["sqrt(abs(", "floor(", "round(", "trunc(", "-("]), sub)
          .map(lambda t: f"{t[0]}{t[1]}){')' if t[0].startswith('sqrt') else ''}"),
        st.tuples(st.sampled_from(["min", "max"]), sub, sub).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
        st.tuples(sub, sub, sub).map(lambda t: f"clamp({t[0]}, {t[1]}, {t[2]})"),
        st.tuples(sub, st.sampled_from(["<", ">=", "=="]), sub, sub, sub)
          .map(lambda t: f"({t[0]} {t[1]} {t[2]} ? {t[3]} : {t[4]})"),
        ints.map(lambda i: f"f32({i})"),
    ), max_leaves=8)


def integers():
    leaves = st.sampled_from(["c", "k", "7", "(-3)", "i32(a)", "i32(b * 4.0)"])
    return st.recursive(leaves, lambda sub: st.one_of(
        st.tuples(sub, st.sampled_from(["+", "-", "*", "/", "%"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["abs", "-"]), sub).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(st.sampled_from(["min", "max"]), sub, sub).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
        st.tuples(sub, sub, sub).map(lambda t: f"where({t[0]} > {t[1]}, {t[1]}, {t[2]})"),
    ), max_leaves=6)


@st.composite
def programs(draw):
    ints = integers()
    f = floats(ints)
    body = [
        f"    t = {draw(f)};",
        f"    q = {draw(ints)} + i32(t);",
        f"    w = {draw(f)} * t;",
        f"    z = q * {draw(ints)};",
        f"    y = d * t + {draw(f)};",
        f"    flag = t > {draw(f)} || isnan(t);",
    ]
    return ("pipeline p(a: f32[n], b: f16[n], c: i32[n], d: f32[m, n], s: f32, k: i32)\n"
            "    -> (y: f32[m, n], z: i32[n], w: f16[n], flag: bool[n]) {\n" + "\n".join(body) + "\n}\n")


def arguments(seed: int, n: int = 37, m: int = 3):
    rng = np.random.default_rng(seed)
    special = np.array([0.0, -0.0, 1.5, -2.5, 0.5, np.inf, -np.inf, np.nan], np.float32)
    a = rng.standard_normal(n).astype(np.float32) * 4
    a[:len(special)] = special
    return [a, (rng.standard_normal(n) * 3).astype(np.float16), rng.integers(-9, 10, n).astype(np.int32),
            rng.standard_normal((m, n)).astype(np.float32), 0.75, 3]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(), st.integers(0, 1000))
def test_random_programs_sim_equals_reference_exactly(source, seed):
    assert_sim_equals_reference(source, seed)


def assert_sim_equals_reference(source: str, seed: int) -> None:
    """Fused and unfused, in the sim, bit for bit the reference's outputs."""
    program = check_source(Source("random.fz", source))
    expected = reference(program, "p", *arguments(seed))
    for fuse in (True, False):
        got = JitPipeline(program, "p", JitOptions(fuse=fuse, backend="sim"))(*arguments(seed))
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype
            np.testing.assert_array_equal(g, e, err_msg=f"fuse={fuse}\n{source}")


@st.composite
def broadcasting_programs(draw):
    f = floats(integers())
    pick = st.sampled_from(["a", "r", "f32(col)", "f32(x)", "f32(h)", "s"])
    body = [
        f"    u = {draw(pick)} * {draw(f)} + {draw(pick)};",
        f"    v = f64(u) * x + {draw(st.sampled_from(['x', '1.5', 'f64(s)']))};",
        f"    h = bf16(u) * h + {draw(pick)};",
        "    out64 = v / (x + 3.0);",
        f"    col16 = col * f16({draw(f)});",
    ]
    return ("pipeline p(a: f32[m, n], r: f32[m, 1], col: f16[n], x: f64[n], inout h: bf16[m, n], s: f32,\n"
            "           b: f16[n], c: i32[n], k: i32)\n"
            "    -> (out64: f64[m, n], col16: f16[m, n]) {\n" + "\n".join(body) + "\n}\n")


def broadcast_arguments(seed: int, m: int, n: int):
    import ml_dtypes
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((m, n)).astype(np.float32), rng.standard_normal((m, 1)).astype(np.float32),
            rng.standard_normal(n).astype(np.float16), rng.standard_normal(n),
            rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16), 0.5,
            rng.standard_normal(n).astype(np.float16), rng.integers(-9, 10, n).astype(np.int32), 2]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(broadcasting_programs(), st.integers(0, 1000), st.sampled_from([(3, 8), (2, 16), (5, 7), (1, 1)]))
def test_broadcasting_mixed_types_and_inout_exactly(source, seed, shape):
    program = check_source(Source("random.fz", source))
    expected_args = broadcast_arguments(seed, *shape)
    expected = reference(program, "p", *expected_args)
    for fuse in (True, False):
        args = broadcast_arguments(seed, *shape)
        got = JitPipeline(program, "p", JitOptions(fuse=fuse, backend="sim"))(*args)
        for g, e in list(zip(got, expected)) + [(args[4], expected_args[4])]:
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_array_equal(g.astype(np.float64), e.astype(np.float64),
                                          err_msg=f"fuse={fuse} shape={shape}\n{source}")


@st.composite
def repeat_programs(draw):
    ints = integers()
    f = floats(ints)
    return ("pipeline p(a: f32[n], b: f16[n], c: i32[n], d: f32[m, n], s: f32, k: i32)\n"
            "    -> (y: f32[n], z: i32[n]) {\n"
            f"    y = {draw(f)};\n"
            "    q = c;\n"
            f"    repeat {draw(st.sampled_from(['k', '3', '0']))} {{\n"
            f"        y = y * 0.5 + {draw(f)};\n"
            f"        q = q + i32(y > {draw(f)});\n"
            "    }\n"
            "    z = q * 2;\n"
            "}\n")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(repeat_programs(), st.integers(0, 1000))
def test_random_repeat_programs_exactly(source, seed):
    assert_sim_equals_reference(source, seed)
