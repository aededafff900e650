"""Programs the random program generator found wrong (sim tier): each one's
exact result on every backend and form, computed here by hand."""
import numpy as np
import pytest

import fusec

pytestmark = pytest.mark.sim
FORMS = [dict(backend="numpy"), dict(backend="sim", fuse="all"), dict(backend="sim", fuse="none"),
         dict(backend="sim", fuse="auto"), dict(backend="sim", persistent=True)]
IDS = ["numpy", "sim-all", "sim-none", "sim-auto", "sim-persistent"]


@pytest.mark.parametrize("form", FORMS, ids=IDS)
def test_a_value_carried_by_two_loops_in_turn_reaches_the_second(form):
    # The first loop's kernel stored nothing: its result is the second loop's entry.
    f = fusec.jit("pipeline p(x: f32[n]) -> (t: f32[n]) { t = x; repeat 2 { t = t * 3.0; } "
                  "repeat 1 { t = t + 1.0; } }", **form)
    np.testing.assert_array_equal(f(np.array([2, 5, -1], np.float32)), np.array([19, 46, -8], np.float32))


@pytest.mark.parametrize("form", FORMS, ids=IDS)
def test_a_temporary_given_a_new_type_and_shape_keeps_its_own_buffer(form):
    # Lowering's versions of t (t.1, t.2) once shared a name with the checker's re-typed t.2:
    # the unfused form wrote b's m*n values into t's n-element buffer.
    f = fusec.jit("pipeline p(a: f64[n], b: f32[m, n]) -> (y: f32[m, n]) "
                  "{ t = a; t = t * 2.0; t = t + 1.0; t = b; y = t + 1.0; }", **form)
    a = np.arange(3.0)
    b = np.arange(6, dtype=np.float32).reshape(2, 3) * 10
    np.testing.assert_array_equal(f(a, b), b + 1)


@pytest.mark.parametrize("form", FORMS, ids=IDS)
def test_a_literal_first_argument_of_a_builtin_takes_the_other_arguments_type(form):
    f = fusec.jit("pipeline p(x: u64[n], h: f16[n]) -> (y: u64[n], t: f16[n]) "
                  "{ y = min(1, x) + x; t = max(0.0, h) * h; }", **form)
    x = np.array([0, 2**63 + 5], np.uint64)
    h = np.array([-2, 3], np.float16)
    y, t = f(x, h)
    np.testing.assert_array_equal(y, np.array([0, 2**63 + 6], np.uint64))
    assert t.dtype == np.float16
    np.testing.assert_array_equal(t, np.array([0, 9], np.float16))


@pytest.mark.parametrize("form", FORMS, ids=IDS)
def test_dims_a_loop_or_one_statement_equates_are_checked_at_the_call(form):
    f = fusec.jit("pipeline p(x: f32[n], y: f32[m]) -> (z: f32[n]) { t = x; repeat 2 { t = t + y; } z = t; }",
                  **form)
    np.testing.assert_array_equal(f(np.ones(3, np.float32), np.arange(3, dtype=np.float32)),
                                  np.array([1, 3, 5], np.float32))
    with pytest.raises(fusec.ArgumentError, match="'n' .*'m'|'m' .*'n'"):
        f(np.ones(3, np.float32), np.ones(4, np.float32))
    g = fusec.jit("stage two(s: f32) -> (u: f32, v: f32) { u = s; v = -s; }\n"
                  "pipeline p(s: f32, q: f32[n], r: f32[m]) -> (a: f32[n], b: f32[m]) { a, b = two(s); }", **form)
    a, b = g(2.0, np.zeros(3, np.float32), np.zeros(3, np.float32))
    np.testing.assert_array_equal(a, [2, 2, 2])
    np.testing.assert_array_equal(b, [-2, -2, -2])
    with pytest.raises(fusec.ArgumentError, match="'n' .*'m'|'m' .*'n'"):
        g(2.0, np.zeros(3, np.float32), np.zeros(2, np.float32))


@pytest.mark.parametrize("form", FORMS, ids=IDS)
def test_a_dead_value_carried_by_two_loops_beside_a_live_one(form):
    # u is dead: the first loop's exit value of u is dropped, and nothing may carry it.
    f = fusec.jit("pipeline p(h: u32[k], inout b: f32[k]) -> (s: f32[k]) {\n"
                  "    u = b * 2.0;\n    repeat 3 { u = u * 3.0; b = b + h; }\n"
                  "    repeat 2 { b = b - 1.0; u = u / 2.0; }\n    s = b;\n}", **form)
    b = np.array([1.0, -4.0], np.float32)
    s = f(np.array([2, 5], np.uint32), b)
    np.testing.assert_array_equal(s, np.array([5.0, 9.0], np.float32))
    np.testing.assert_array_equal(b, s)
