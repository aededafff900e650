"""`repeat` counts (unit tier): a literal count fits a signed 64-bit integer; a
value that only a loop assigns may be read after it only if the loop runs:
surely (a literal of at least 1), never (a literal 0: a located error), or as
the call decides (a count parameter: recorded in the IR, and a count of 0 is an
ArgumentError before anything runs)."""
import numpy as np
import pytest

from fusec.errors import ArgumentError, Source
from fusec.frontend import check_source
from fusec.ir.program import Repeat
from fusec.reference import run


def pipeline(text: str):
    return check_source(Source("t.fz", text)).pipelines[0]


def repeats(stmts):
    for s in stmts:
        if isinstance(s, Repeat):
            yield s
            yield from repeats(s.body)


@pytest.mark.parametrize("body,expected", [
    ("repeat k { y = x * 2.0; }", [("k", ("y",))]),                       # returned after the loop
    ("y = x; repeat k { y = y * 2.0; }", [("k", ())]),                     # assigned before: a count of 0 is fine
    ("repeat 3 { y = x * 2.0; }", [(3, ())]),                              # surely runs
    ("repeat k { y = x; } repeat j { y = y + 1.0; }", [("k", ("y",)), ("j", ())]),
    ("repeat 2 { repeat j { y = x; } }", [(2, ()), ("j", ("y",))]),        # the inner loop must run
    ("repeat j { repeat 2 { y = x; } }", [("j", ("y",)), (2, ())]),
    # read inside the outer loop: the inner must run; returned after it: the outer must too
    ("repeat j { repeat k { y = x; } y = y + 1.0; }", [("j", ("y",)), ("k", ("y",))]),
    ("y = x; repeat j { repeat k { y = x; } y = y + 1.0; }", [("j", ()), ("k", ())]),
])
def test_loops_that_alone_assign_a_value_read_after_them_are_recorded(body, expected):
    p = pipeline(f"pipeline p(x: f32[n], k: i32, j: u8) -> (y: f32[n]) {{ {body} }}")
    assert [(r.count, r.unassigned_if_zero) for r in repeats(p.body)] == expected


def test_a_read_inside_the_assigning_loop_needs_nothing_but_a_read_after_it_does():
    p = pipeline("pipeline p(x: f32[n], k: i32) -> (y: f32[n], z: f32[n]) {\n"
                 "    z = x;\n    repeat k { y = x * 2.0; z = z + y; }\n    y = z;\n}")
    assert [r.unassigned_if_zero for r in repeats(p.body)] == [()]
    p = pipeline("pipeline p(x: f32[n], k: i32) -> (y: f32[n], z: f32[n]) {\n"
                 "    repeat k { y = x * 2.0; }\n    z = y + 1.0;\n    y = z;\n}")
    assert [r.unassigned_if_zero for r in repeats(p.body)] == [("y",)]


def test_the_largest_literal_count_is_accepted():
    p = pipeline("pipeline p(x: f32[n]) -> (y: f32[n]) { y = x; repeat 0x7fffffffffffffff { y = y + 1.0; } }")
    assert [r.count for r in repeats(p.body)] == [2 ** 63 - 1]


PROGRAM = check_source(Source("t.fz", """
pipeline p(inout h: f32[n], x: f32[n], k: i32, j: u64) -> (y: f32[n]) {
    h = h + 1.0;
    repeat k { y = x * 2.0; }
    repeat j { h = h * 2.0; }
}"""))


def test_a_count_of_zero_where_the_loop_alone_assigns_a_result_is_an_argument_error_before_anything_runs():
    h, x = np.zeros(5, np.float32), np.arange(5, dtype=np.float32)
    with pytest.raises(ArgumentError, match=r"repeat count 'k' is 0, but 'y' is assigned only inside that "
                                            r"'repeat' \(line 4\) and read after it; pass a count of at least 1"):
        run(PROGRAM, "p", h, x, 0, 1)
    assert (h == 0).all()  # the in-place update before the loop did not run
    y = run(PROGRAM, "p", h, x, 1, 0)  # j == 0 is fine: h has a value before its loop
    np.testing.assert_array_equal(y, x * 2)
    np.testing.assert_array_equal(h, np.ones(5))


def test_a_count_beyond_two_to_the_63_is_an_argument_error():
    h, x = np.zeros(5, np.float32), np.arange(5, dtype=np.float32)
    with pytest.raises(ArgumentError, match=r"repeat count 'j' is 9223372036854775808; at most 2\^63 - 1"):
        run(PROGRAM, "p", h, x, 1, 2 ** 63)
    assert (h == 0).all()
    with pytest.raises(ArgumentError, match="repeat count 'k' is negative"):
        run(PROGRAM, "p", h, x, -1, 1)
