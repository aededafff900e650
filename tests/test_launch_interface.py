"""The launch interface is the one contract after the compiler: what the report
lists is what the module emits, every form has its variants and estimates, and
the two entry points (CLI and fusec.jit) give the same kernels for a target."""
import json
import re

import pytest
from helpers import ROOT, compiled, pipelines

import fusec
from fusec.compiler import CompileOptions, compile_pipeline
from fusec.ir.launch import ColumnReduce, Elementwise, GridStride, MultiTensor, RegisterLoop, RowBlock
from fusec.passes.plan import PlanError
from fusec.report import report

PIPELINES = pipelines()
FORMS = {"fused": CompileOptions(), "unfused": CompileOptions(fuse=False),
         "persistent": CompileOptions(persistent=True), "multi_tensor": CompileOptions(multi_tensor=True)}


def emitted_functions(cuda: str) -> list[str]:
    return re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(', cuda)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("ident,program,name", PIPELINES, ids=[p[0] for p in PIPELINES])
def test_report_lists_exactly_the_emitted_variants_each_with_its_estimate(ident, program, name, form):
    try:
        module = compiled(program, name, FORMS[form])
    except PlanError:
        assert form == "multi_tensor"  # foreach takes one elementwise kernel only
        return
    rows = report(module.interface)
    listed = [v["name"] for row in rows for v in row["variants"]]
    assert sorted(listed) == sorted(emitted_functions(module.cuda))
    for row, launch in zip(rows, module.interface.kernels):
        assert all(v["name"].startswith(row["name"]) for v in row["variants"])
        # Each function's own estimate is written beside it in the module.
        for v in row["variants"]:
            assert v["est_regs"] > 0
            assert f"// {v['name']}: " in module.cuda
            comment = re.search(rf"// {v['name']}: [^\n]*estimated (\d+) registers", module.cuda)
            assert comment and int(comment.group(1)) == v["est_regs"], v["name"]
        expected_form = {"fused": (Elementwise, RegisterLoop), "unfused": (Elementwise,),
                         "persistent": (GridStride, RegisterLoop), "multi_tensor": (MultiTensor,)}[form]
        # A row kernel is one in every form: a block per row (whatever --persistent says); so is a column kernel.
        assert isinstance(launch.form, RowBlock if launch.kernel.rows else ColumnReduce if launch.kernel.columns
                          else expected_form)
        if not isinstance(launch.form, MultiTensor):  # its work items meet the alignment set by set
            # The last variant needs nothing of the arrays, so one always runs.
            assert launch.variants[-1].alignment == () and not launch.variants[-1].whole_rows


def test_a_vector_variant_is_estimated_for_its_own_code():
    program = fusec.frontend.load(str(ROOT / "examples/scale_bias_relu.fz"))
    vector, scalar = compile_pipeline(program, "scale_bias_relu").interface.kernels[0].variants
    assert vector.elements_per_thread == 4 and scalar.elements_per_thread == 1
    assert vector.est_regs > scalar.est_regs  # four lanes keep four elements of x and y live


def _wide(inputs: int) -> str:
    """A pipeline whose one fused kernel keeps every input live: its estimate grows with `inputs`."""
    params = ", ".join(f"x{i}: f32[n]" for i in range(inputs))
    total = " + ".join(f"sin(x{i})" for i in range(inputs))
    return (f"pipeline deep({params}) -> (o: f32[n]) {{\n    s = {total};\n"
            f"    o = s * ({' + '.join(f'x{i}' for i in range(inputs))});\n}}\n")


# Fused, its estimate lies between the sm_90 half-occupancy budget (64) and the sm_86 one (80).
BUDGET_DECIDES = _wide(28)


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90"])
def test_cli_and_jit_give_the_same_kernels_for_a_target(tmp_path, run_cli, arch):
    source = tmp_path / "deep.fz"
    source.write_text(BUDGET_DECIDES)
    code, cuda, _ = run_cli("compile", str(source), "--arch", arch)
    assert code == 0
    f = fusec.jit(str(source), arch=arch, backend="numpy")
    assert f.compiled.cuda == cuda
    code, stdout, _ = run_cli("compile", str(source), "--arch", arch, "--emit", "report")
    assert all(row["arch"] == arch for row in json.loads(stdout))
    code, capped, _ = run_cli("compile", str(source), "--arch", arch, "--max-regs", "48")
    assert code == 0 and capped == fusec.jit(str(source), arch=arch, max_regs=48, backend="numpy").compiled.cuda


def test_the_target_decides_the_occupancy_the_model_assumes():
    from fusec.passes.cost import target_costs, warps_per_sm
    assert target_costs("sm_90").max_warps_per_sm == 64 and target_costs("sm_86").max_warps_per_sm == 48
    assert warps_per_sm(24, target_costs("sm_90")) == 64 and warps_per_sm(24, target_costs("sm_86")) == 48
    light = "pipeline p(a: f32[n], b: f32[n]) -> (y: f32[n]) { y = a * b + 1.0; }"
    program = fusec.frontend.check_source(fusec.errors.Source("light.fz", light))
    warps = {arch: compile_pipeline(program, "p", CompileOptions(arch=arch)).interface.kernels[0].prediction.warps
             for arch in ("sm_86", "sm_90")}
    assert warps == {"sm_86": 48, "sm_90": 64}


@pytest.mark.parametrize("bad,message", [
    ({"max_regs": 0}, "max_regs= expected a register count from 16 to 255"),
    ({"max_regs": 300}, "max_regs= expected a register count from 16 to 255"),
    ({"max_regs": 64.0}, "max_regs= expected a register count"),
    ({"arch": "sm90"}, "arch= expected an architecture like sm_90"),
    ({"backend": "opencl"}, "backend must be one of"),
])
def test_jit_options_are_checked_like_the_cli(bad, message):
    with pytest.raises(ValueError, match=message):
        fusec.jit(str(ROOT / "examples/scale_bias_relu.fz"), **bad)


def test_jit_flags_must_be_bools():
    with pytest.raises(ValueError, match="fuse= takes 'auto', 'all', 'none', True or False; got 'no'"):
        fusec.jit(str(ROOT / "examples/scale_bias_relu.fz"), fuse="no")
    with pytest.raises(TypeError, match="fuse= takes .* got 3"):
        fusec.jit(str(ROOT / "examples/scale_bias_relu.fz"), fuse=3)
    with pytest.raises(TypeError, match="graph= takes True or False"):
        fusec.jit(str(ROOT / "examples/scale_bias_relu.fz"), graph=1)
