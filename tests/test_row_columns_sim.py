"""A row kernel holding column sums (ir.launch.RowBlock.chunks) on the sim (sim
tier): each way of taking a run of rows (variants.CHUNK_GROUPS, a block a row,
one element a thread), chosen by the row's length, equals the reference bit for
bit: the values summed are exact in both (a product by 1.5, a difference), so
any other order of the sums, a dead row added, a row left out or an empty run
not zeroed changes some bit."""
import ml_dtypes
import numpy as np
import pytest

import fusec
from fusec.bench.harness import chosen
from fusec.ir.launch import RowBlock
from fusec.ir.program import COLUMN_CHUNKS
from fusec.passes.variants import CHUNK_GROUPS

pytestmark = pytest.mark.sim

PROGRAM = """
pipeline centred(x: {t}[rows, cols], b: {t}[cols]) -> (y: {t}[rows, cols], s: f32[cols], d: f32[cols]) {{
    y = x - row_max(x) + b;
    s = col_sum(x * 1.5);
    d = col_sum(x - b);
}}
"""
# (rows, cols): each group's rows (f32: 8 lanes hold 128 elements, ..., 1,024 threads
# 16,384), in runs shorter than a group's rows at a time, longer, and not a multiple of
# them; rows a multiple of the runs' count; a row longer than every group's (a block a
# row, its sums in memory), one of odd length (one element a thread), no rows, one column.
SHAPES = [(300, 128), (384, 64), (1000, 256), (2000, 512), (600, 1024), (300, 2048), (130, 4096), (40, 8192),
          (3, 16384), (50, 16388), (70, 13), (0, 8), (129, 1)]


def _run(t, numpy_type, rows, cols, fuse="all"):
    rng = np.random.default_rng(rows * 7 + cols)
    x = rng.standard_normal((rows, cols)).astype(numpy_type)
    b = rng.standard_normal(cols).astype(numpy_type)
    source = PROGRAM.format(t=t)
    return fusec.jit(source, backend="sim", fuse=fuse), fusec.jit(source, backend="numpy"), (x, b)


@pytest.mark.parametrize("t, numpy_type", [("f32", np.float32), ("bf16", ml_dtypes.bfloat16)])
def test_every_way_of_taking_a_run_of_rows_equals_the_reference(t, numpy_type):
    taken, offered = set(), set()
    for rows, cols in SHAPES:
        fused, reference, args = _run(t, numpy_type, rows, cols)
        kernels = fused.compiled.interface.kernels
        assert [k.form for k in kernels if isinstance(k.form, RowBlock)] == [RowBlock(COLUMN_CHUNKS)]
        assert len(kernels) == 3  # the row kernel, then each column sum's finish
        for got, want in zip(fused(*args), reference(*args)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"{t} {rows}x{cols}")
        taken.add(chosen(fused, cols).split(" ")[0])
        offered = {v.name for k in kernels if isinstance(k.form, RowBlock) for v in k.variants}
    if t == "f32":  # every variant ran: each group's that fits its tile and registers, the block's, the element's
        assert taken == offered
        several = [f"_r{g}x{r}{'p' if p else ''}_v4" for g, r, p in CHUNK_GROUPS if r > 1 and g * r <= 256]
        assert len(several) >= 4 and {f"centred_k0{v}" for v in several + ["_v4", ""]} <= offered


def test_the_cost_model_prices_the_sums_once_a_run_of_rows():
    """The row kernel's column sums are not traffic of each element (the model's
    bytes: x read, y written; b is a column's), and its blocks are COLUMN_CHUNKS
    in all (the model's warps a multiprocessor, whatever its registers allow)."""
    from dataclasses import replace

    from fusec.ir.launch import RowGrid
    from fusec.passes.cost import predict, target_costs
    fused, _, _ = _run("f32", np.float32, 8, 8)
    (row,) = [k for k in fused.compiled.interface.kernels if isinstance(k.form, RowBlock)]
    assert row.prediction.bytes_per_element == 4 + 4
    costs = target_costs("sm_90")
    light = replace(row.variants[-1], est_regs=32, grid=RowGrid(1, 256, 0, COLUMN_CHUNKS))
    assert predict(row.kernel, light, 2 ** 26, costs).warps == round(COLUMN_CHUNKS * 256 / 32 / costs.sms)
    assert predict(row.kernel, replace(light, grid=RowGrid(1, 256)), 2 ** 26, costs).warps == 64


def test_a_column_sum_of_rows_of_one_element_is_summed_apart():
    """Rows of a literal length 1 hold a value a row, not elements the row kernel
    sums (the reviewer's crash: `--fuse all` raised KeyError('col_partial'))."""
    source = """pipeline p(x: f32[rows, 1]) -> (y: f32[rows, 1], s: f32[1]) {
    y = x - row_max(x);
    s = col_sum(x * 1.5);
}"""
    x = np.random.default_rng(5).standard_normal((300, 1)).astype(np.float32)
    fused = fusec.jit(source, backend="sim", fuse="all")
    assert not any(isinstance(k.form, RowBlock) and k.form.chunks for k in fused.compiled.interface.kernels)
    for got, want in zip(fused(x), fusec.jit(source, backend="numpy")(x)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
