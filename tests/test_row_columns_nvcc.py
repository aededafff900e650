"""The nvcc tier for row kernels holding column sums (RowBlock.chunks): every
variant of a normalisation's backward (two sums) and of test_row_columns_sim's
program (f32 and bf16) compiles for sm_90 without spilling."""
import pytest
from estimate_corpus import ptxas_usage
from helpers import ROOT, load_program
from test_row_columns_sim import PROGRAM

from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import Source
from fusec.frontend import check_source
from fusec.ir.launch import RowBlock

pytestmark = pytest.mark.nvcc


@pytest.mark.parametrize("which", ["norm_grads", "centred f32", "centred bf16"])
def test_every_variant_compiles_without_spills(tmp_path, which):
    if which == "norm_grads":
        program, name = load_program(ROOT / "tests/programs/columns.fz"), "norm_grads"
    else:
        name, t = which.split()
        program = check_source(Source(f"{which}.fz", PROGRAM.format(t=t)))
    module = compile_pipeline(program, name, CompileOptions(fuse="all"))
    (row,) = [k for k in module.interface.kernels if isinstance(k.form, RowBlock)]
    assert row.form.chunks and len(row.variants) >= 4
    usage = ptxas_usage(module.cuda, str(tmp_path))
    for variant in row.variants:
        assert usage[variant.name].spill_bytes == 0, (variant.name, usage[variant.name])
