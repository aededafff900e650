"""Column sums (col_sum, unit tier): the reference's fixed order, the two
column kernels of a sum, and the checker's located errors."""
import numpy as np
import pytest
from helpers import ROOT

from fusec.errors import FzError, Source
from fusec.frontend import check_source
from fusec.ir.program import COLUMN_CHUNKS
from fusec.reference import reduce_columns

COLUMNS = ROOT / "tests/programs/columns.fz"


def ordered_sum(x: np.ndarray) -> np.ndarray:
    """The README's order, written out: runs of ceil(rows / 128) rows, each from 0, then the runs in order."""
    rows, per = x.shape[0], -(-x.shape[0] // COLUMN_CHUNKS)
    total = np.zeros(x.shape[1:], x.dtype)
    for chunk in range(COLUMN_CHUNKS):
        part = np.zeros(x.shape[1:], x.dtype)
        for r in range(chunk * per, min(rows, (chunk + 1) * per)):
            part = part + x[r]
        total = total + part
    return total


@pytest.mark.parametrize("rows", [0, 1, 127, 128, 129, 300, 1000])
def test_the_reference_sums_in_the_stated_order(rows):
    rng = np.random.default_rng(rows)
    # Magnitudes far apart: another order rounds differently.
    x = (rng.standard_normal((rows, 5)) * 10.0 ** rng.integers(-6, 7, (rows, 5))).astype(np.float32)
    total = reduce_columns("col_sum", reduce_columns("col_partial", x))
    np.testing.assert_array_equal(total, ordered_sum(x))
    assert total.dtype == np.float32 and total.shape == (5,)


def test_the_order_is_what_the_result_is():
    # Runs of 3 rows [1e8, 1, -1e8] each lose their 1 in f32: the stated order gives 1,
    # where the exact sum is 101.
    x = np.array([[1e8], [1.0], [-1e8]] * 100 + [[1.0]], np.float32)
    assert reduce_columns("col_sum", reduce_columns("col_partial", x))[0] == np.float32(1.0)
    assert np.sum(x, dtype=np.float64) == 101.0


def test_a_column_sum_is_two_column_kernels():
    from fusec.compiler import CompileOptions, compile_pipeline
    from fusec.ir.launch import ColumnReduce
    program = check_source(Source("columns.fz", COLUMNS.read_text()))
    interface = compile_pipeline(program, "bias_relu_grads", CompileOptions()).interface
    assert [k.form.chunks for k in interface.kernels if isinstance(k.form, ColumnReduce)] == [COLUMN_CHUNKS, 1]


def test_statements_over_the_summed_elements_join_the_partial_sums_kernel():
    """The backward of a bias + ReLU: dx is computed, stored and summed in one pass
    over x, b and g (on the H200 the separate kernels stored dx and read it back,
    4 bytes an element over the minimum traffic); the finish sums the partials."""
    from fusec.compiler import CompileOptions, compile_pipeline
    program = check_source(Source("columns.fz", COLUMNS.read_text()))
    partial, finish = (k.kernel for k in compile_pipeline(program, "bias_relu_grads", CompileOptions()).interface.kernels)
    assert partial.stages == ("h", "dx", "col_partial") and finish.stages == ("col_sum",)
    assert [a.buffer for a in partial.loads] == ["x", "b", "g"]
    assert sorted(a.buffer for a, _ in partial.stores) == ["col_partial#0", "dx"]
    # Several column sums over the same elements: one kernel of partial sums, then each finish.
    mix = compile_pipeline(program, "column_f64", CompileOptions()).interface.kernels
    assert [k.kernel.stages for k in mix][:3] == [("col_partial", "col_partial_2"), ("col_sum",), ("col_sum_2",)]


@pytest.mark.parametrize("text,line,col,fragment", [
    ("pipeline p(x: f32[n]) -> (y: f32[1]) {\n  y = col_sum(x);\n}", 2, 7, "an array of two or more dims"),
    ("pipeline p(x: f32[r, c], s: f32) -> (y: f32[c]) {\n  y = col_sum(s) + x;\n}", 2, 7, "its argument is a scalar"),
    ("pipeline p(x: i32[r, c]) -> (y: i32[c]) {\n  y = col_sum(x);\n}", 2, 7, "needs floats, got i32"),
    ("pipeline p(x: f32[r, c]) -> (y: f32[c]) {\n  y = col_sum(x, x);\n}", 2, 7, "takes 1 argument, got 2"),
    ("pipeline p(x: f32[r, c]) -> (y: f32[c]) {\n  repeat 2 { y = col_sum(x); }\n}", 2, 18, "inside 'repeat'"),
    ("stage s(x: f32) -> f32 { return col_sum(x); }\npipeline p(x: f32[n]) -> (y: f32[n]) { y = s(x); }", 1, 33,
     "belongs in a pipeline statement"),
])
def test_what_col_sum_refuses_is_a_located_error(text, line, col, fragment):
    with pytest.raises(FzError) as caught:
        check_source(Source("t.fz", text))
    d = caught.value.diagnostics[0]
    assert fragment in d.message and (d.loc.line, d.loc.col) == (line, col), (d.loc, d.message)


def test_a_column_kernel_takes_its_coordinates_from_the_row_and_its_column():
    """i = row * cols + col in a column kernel: a broadcast operand's coordinates are the
    thread's column's (no division of i at every element), and the row is the first.
    Dividing i cost the backward of bias-GELU about 20 of its 70 instructions an element
    (sm_90 SASS) and made b's load wait on the division."""
    from fusec.compiler import CompileOptions, compile_pipeline
    from fusec.frontend.grad import backward_program
    program = check_source(Source("columns.fz", COLUMNS.read_text()))
    kernel = _column_kernel(compile_pipeline(program, "bias_relu_grads", CompileOptions()).cuda, "bias_relu_grads_k0")
    assert "const long long c1 = col;" in kernel and "fz_rem" not in kernel and "fz_quot" not in kernel
    mlp = check_source(Source("mlp.fz", (ROOT / "examples/mlp.fz").read_text()))
    grad = backward_program(mlp, "bias_gelu")
    kernel = _column_kernel(compile_pipeline(grad, "bias_gelu_grad", CompileOptions()).cuda, "bias_gelu_grad_k0")
    assert "b[c1]" in kernel and "fz_rem" not in kernel
    # Three dims: the row, then the column's own coordinates (a quotient and a remainder of it).
    three = check_source(Source("three.fz", THREE_DIMS))
    kernel = _column_kernel(compile_pipeline(three, "three", CompileOptions()).cuda, "three_k0")
    assert "const long long c0 = row;" in kernel and "fz_rem(col, e2)" in kernel and "fz_quot(col, e2)" in kernel
    assert "fz_rem(i" not in kernel and "fz_quot(i" not in kernel


# A column kernel over three dims with operands broadcast along each: [a, 1, 1], [b, 1], [c].
THREE_DIMS = """pipeline three(x: f32[a, b, c], p: f32[a, 1, 1], u: f32[b, 1], v: f32[c]) -> (y: f32[a, b, c], s: f32[b, c]) {
    y = x * u + v * p;
    s = col_sum(y);
}
"""


def _column_kernel(cuda: str, name: str) -> str:
    start = cuda.index(f"__global__ void {name}(")
    return cuda[start:cuda.index("\n}\n", start)]
