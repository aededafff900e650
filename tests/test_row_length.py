"""row_length(x): the length of each row (the last axis) of an array, [..., 1], in the
accumulation type (unit tier): the language's rules with their located errors, the NumPy
reference, how it is planned (free in a row kernel: read from the shape, x never computed),
traced functions, and its derivative (none). tests/test_row_length_sim.py runs it in every
row kernel form on the sim."""
import ml_dtypes
import numpy as np
import pytest

import fusec
from fusec.compiler import compile_pipeline
from fusec.errors import FzError, Source
from fusec.frontend import check_source

P = "pipeline p(x: f32[r, c], k: i32[r, c], d: f64[r, c], s: f32) -> (y: f32[r, 1]) {\n"


def errors(source: str) -> list[tuple[int, int, str]]:
    with pytest.raises(FzError) as caught:
        check_source(Source("t.fz", source))
    return [(d.loc.line, d.loc.col, d.message) for d in caught.value.diagnostics]


@pytest.mark.parametrize("body,col,fragment", [
    ("y = row_length(s);", 9, "row_length() is the length of each row of an array; its argument is a scalar"),
    ("y = row_length(2.0);", 9, "its argument is a scalar"),
    ("y = row_length(x, x);", 9, "row_length() takes 1 argument, got 2"),
    ("y = row_lenght(x);", 9, "did you mean 'row_length'"),
    ("repeat 2 { y = row_length(x); }", 20, "row_length() inside 'repeat' is not supported yet"),
])
def test_row_length_used_wrongly_is_a_located_error(body, col, fragment):
    found = errors(P + "    " + body + "\n}")
    assert any(line == 2 and c == col and fragment in message for line, c, message in found), found


def test_row_length_in_a_stage_is_a_located_error():
    found = errors("stage f(a: f32) -> f32 { return row_length(a); }\n"
                   "pipeline p(x: f32[n]) -> (y: f32[n]) { y = f(x); }")
    assert found == [(1, 33, "row_length() reduces the rows of an array: it belongs in a pipeline statement; "
                             "a stage computes one element")]


SOURCE = """pipeline p(x: f32[r, c], k: i32[r, c], d: f64[r, c], h: bf16[a, r, c]) -> (n: f32[r, 1], m: f64[r, 1], q: f32[r, 1], t: f32[a, r, 1], y: f32[r, c]) {
    n = row_length(x * 2.0);
    m = row_length(d);
    q = row_length(k);
    t = row_length(h);
    y = x / row_length(x) - row_sum(x) / row_length(k);
}"""


@pytest.mark.parametrize("rows,cols", [(3, 5), (1, 1), (2, 0), (4, 64)])
def test_the_reference_gives_the_rows_length_in_the_accumulation_type(rows, cols):
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    k = rng.integers(0, 5, (rows, cols)).astype(np.int32)
    d = rng.standard_normal((rows, cols))
    h = np.ones((2, rows, cols), ml_dtypes.bfloat16)
    n, m, q, t, y = fusec.jit(SOURCE, backend="numpy")(x, k, d, h)
    assert n.dtype == np.float32 and m.dtype == np.float64 and q.dtype == np.float32
    for found, shape in ((n, (rows, 1)), (m, (rows, 1)), (q, (rows, 1)), (t, (2, rows, 1))):
        np.testing.assert_array_equal(found, np.full(shape, cols))
    with np.errstate(all="ignore"):
        want = x / np.float32(cols) - x.sum(-1, keepdims=True, dtype=np.float32) / np.float32(cols)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def test_a_row_kernel_reads_the_length_from_the_shape():
    """Fused: one row kernel; its operand x * 2.0 is never computed. Alone (unfused), a row
    kernel that reads nothing and writes each row's length."""
    program = check_source(Source("t.fz", "pipeline p(x: f32[r, c]) -> (y: f32[r, c], n: f32[r, 1]) {\n"
                                          "    n = row_length(x * 2.0);\n    y = x * row_mean(x) / n;\n}"))
    fused = compile_pipeline(program, "p")
    assert len(fused.interface.kernels) == 1
    alone = check_source(Source("t.fz", "pipeline p(x: f32[r, c]) -> (n: f32[r, 1]) { n = row_length(x * 2.0); }"))
    (kernel,) = compile_pipeline(alone, "p").interface.kernels
    assert kernel.kernel.loads == () and "reads nothing; writes n" in compile_pipeline(alone, "p").cuda


def test_a_traced_function_reads_row_length():
    f = fusec.jit(lambda x: x / fusec.row_length(x), backend="numpy")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(f(x), x / np.float32(4))
