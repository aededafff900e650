"""The nvcc tier: every emitted module compiles for sm_90 and no kernel
spills. The register estimate of every variant (fusec.passes.regs, per
VariantShape) is held to ptxas in test_estimate_nvcc.py, over a corpus that
holds these programs in every form."""
import pytest
from estimate_corpus import ptxas_usage
from helpers import compiled, multi_tensor_pipelines, pipelines

from fusec.compiler import CompileOptions

pytestmark = pytest.mark.nvcc
PIPELINES = pipelines()


@pytest.mark.parametrize("form", ["fused", "unfused", "persistent"])
@pytest.mark.parametrize("ident,program,name", PIPELINES, ids=[p[0] for p in PIPELINES])
def test_compiles_without_spills(tmp_path, ident, program, name, form):
    module = compiled(program, name, CompileOptions(fuse=form != "unfused", persistent=form == "persistent"))
    interface = module.interface
    usage = ptxas_usage(module.cuda, str(tmp_path))
    assert set(usage) == {v.name for k in interface.kernels for v in k.variants}
    for launch in interface.kernels:
        for variant in launch.variants:
            spills = usage[variant.name].spill_bytes
            assert spills == 0, f"{variant.name} spills {spills} bytes"


# The pipelines foreach can run: one elementwise kernel, no broadcast.
MULTI_TENSOR = [(ident, c) for ident, _, _, c in multi_tensor_pipelines()]


@pytest.mark.parametrize("ident,module", MULTI_TENSOR, ids=[m[0] for m in MULTI_TENSOR])
def test_multi_tensor_kernel_compiles_without_spills(tmp_path, ident, module):
    """foreach's kernel (a vector loop and an element loop per work item) must
    not spill (its estimate: test_estimate_nvcc.py)."""
    ((launch,),) = [module.interface.kernels]
    (variant,) = launch.variants
    usage = ptxas_usage(module.cuda, str(tmp_path))[variant.name]
    assert usage.spill_bytes == 0, (variant.name, usage)


def test_multi_tensor_kernels_cover_the_examples():
    idents = {ident for ident, _ in MULTI_TENSOR}
    assert {"adam:adam", "scale_bias_relu:scale_bias_relu", "quantize:quantize"} <= idents
    assert "time_step:time_step" not in idents and "bias_gelu:bias_gelu" not in idents


def test_row_max_is_ptx_max_nan_on_sm_90(tmp_path):
    """The row reductions' max and min of floats are PTX's max.NaN.f32 / min.NaN.f32
    on sm_80 and later (one FMNMX.NAN an element, the prelude's fz_max_nan), the
    portable compare-and-select elsewhere (the sim: tests/test_reductions_sim.py)."""
    import subprocess

    from fusec.frontend import check_source
    from fusec.errors import Source
    from fusec.compiler import compile_pipeline
    source = "pipeline p(x: f32[r, c]) -> (hi: f32[r, 1], lo: f32[r, 1]) { hi = row_max(x); lo = row_min(x); }"
    cuda = compile_pipeline(check_source(Source("p.fz", source)), "p").cuda
    (tmp_path / "k.cu").write_text(cuda)
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-w", "-o", str(tmp_path / "k.ptx"), str(tmp_path / "k.cu")],
                   check=True)
    ptx = (tmp_path / "k.ptx").read_text()
    assert "max.NaN.f32" in ptx and "min.NaN.f32" in ptx
