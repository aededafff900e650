"""Row kernels holding column sums: the cost model's choice (unit tier).

Measured on the H200 (BENCHMARKS.md, "row kernels holding column sums"): the
derived RMSNorm backward at 2^26 took 221-228 µs with its weight's column sums
in the row kernel against 484-486 µs with them in kernels of their own (rows of
1 Ki and 4 Ki, f32), so the model must choose the row kernel; and it prices a
row kernel's variant for the rows it would run (the nominal row length), not
the variant for the shortest rows."""
from helpers import ROOT

from fusec.compiler import CompileOptions, compile_pipeline
from fusec.frontend import load
from fusec.frontend.grad import backward_source
from fusec.ir.launch import RowBlock
from fusec.passes.cost import nominal_dims, nominal_elements, nominal_row, predict, target_costs
from fusec.passes.variants import variant_for_rows


def _backward(example: str):
    program = load(str(ROOT / "examples" / f"{example}.fz"))
    name = program.pipelines[0].name
    return load(backward_source(program, name))


def test_the_norms_backwards_hold_their_column_sums_in_the_row_kernel():
    for example, sums in [("rmsnorm", 1), ("layernorm", 2), ("add_rmsnorm", 1)]:
        program = _backward(example)
        kernels = compile_pipeline(program, program.pipelines[0].name, CompileOptions()).interface.kernels
        rows = [k for k in kernels if isinstance(k.form, RowBlock)]
        assert [k.form.chunks for k in rows] == [128], example
        assert len(kernels) == 1 + sums, example  # the row kernel, then each sum's finish


def test_a_row_kernel_is_priced_in_the_variant_for_its_nominal_rows():
    program = load(str(ROOT / "examples" / "softmax.fz"))
    compiled = compile_pipeline(program, "softmax", CompileOptions())
    (launch,) = compiled.interface.kernels
    dims = nominal_dims(stage.shape for stage in compiled.graph.stages)
    length = nominal_row(launch.kernel, dims)
    assert length == 8192  # 2^26 elements over rows and cols
    priced = variant_for_rows(launch.variants, length)
    assert priced is not launch.variants[0] and priced.max_row >= length
    costs = target_costs("sm_90")
    assert launch.prediction == predict(launch.kernel, priced, nominal_elements(launch.kernel.shape, dims), costs)


def test_a_block_of_one_row_at_a_time_has_512_threads():
    """COLUMN_CHUNKS blocks are one a multiprocessor, so a block that takes its rows one at
    a time is all the warps its SM has behind its loads. LayerNorm's backward (two column
    sums: two rows of 4 Ki at a time do not fit the tile) took 256 threads a row, 8 warps
    an SM: 274 µs at 4 Ki f32 on the H200, 70 % of the copy, where RMSNorm's took 287 µs
    with 256 threads a row and 223 with 512. Now 512 threads, each holding half as much."""
    forward = load(str(ROOT / "examples" / "layernorm.fz"))
    for pipeline, width in [("layernorm", 4), ("layernorm_bf16", 8)]:
        program = load(backward_source(forward, pipeline))
        kernels = compile_pipeline(program, f"{pipeline}_grad", CompileOptions()).interface.kernels
        (launch,) = [k for k in kernels if isinstance(k.form, RowBlock)]
        chosen = variant_for_rows(launch.variants, 4096)
        assert chosen.grid.rows_per_block == 1 and chosen.grid.threads == 512, (pipeline, chosen.name)
        assert chosen.row_resident * 512 * width >= 4096 and chosen.prefetch, (pipeline, chosen.name)
        # every variant that holds one row at a time holds it in 512 threads or more
        assert all(v.grid.threads >= 512 for v in launch.variants if v.row_resident and v.grid.rows_per_block == 1)
    # RMSNorm's backward keeps 2 rows at a time of 256 threads at 4 Ki (221 µs measured)
    program = _backward("rmsnorm")
    (launch,) = [k for k in compile_pipeline(program, "rmsnorm_grad", CompileOptions()).interface.kernels
                 if isinstance(k.form, RowBlock)]
    chosen = variant_for_rows(launch.variants, 4096)
    assert (chosen.grid.rows_per_block, chosen.grid.threads) == (2, 512), chosen.name
