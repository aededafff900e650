"""Fast math (`fast_math=True`, `--fast-math`): which functions become hardware
approximations, the compile flags, and what the cost model makes of them. The
approximations' error is held to the README's bounds in the gpu tier."""
import re

from helpers import ROOT

import fusec
from fusec.codegen.cexpr import FAST_FUNCTIONS, op_expr
from fusec.compiler import CompileOptions, compile_pipeline
from fusec.passes.cost import target_costs
from fusec.runtime.backends import cuda
from fusec.types import BF16, F16, F32, F64

CHAIN = str(ROOT / "examples/transcendental_chain.fz")


def test_only_f32_functions_with_an_approximation_change():
    assert op_expr("exp", F32, F32, ["x"], fast=True) == "__expf(x)"
    assert op_expr("div", F32, F32, ["a", "b"], fast=True) == "__fdividef(a, b)"
    assert op_expr("exp", F64, F64, ["x"], fast=True) == "exp(x)"       # doubles stay accurate
    assert op_expr("erf", F32, F32, ["x"], fast=True) == "fz_erf_fast(x)"  # fusec's own (prelude)
    assert op_expr("erf", F32, F32, ["x"]) == "erff(x)"
    assert op_expr("erf", F64, F64, ["x"], fast=True) == "erf(x)"
    assert op_expr("erf", F32, BF16, ["x"], fast=True) == "fz_erf_fast(x)"  # half types compute in f32
    assert op_expr("erf", F32, F16, ["x"], fast=True) == "fz_erf_fast(x)"
    assert op_expr("log1p", F32, F32, ["x"], fast=True) == "log1pf(x)"
    assert op_expr("exp", F32, F32, ["x"]) == "expf(x)"                  # off by default
    assert op_expr("tanh", F32, F32, ["x"], fast=True) == "fz_tanh_fast(x)"  # PTX tanh.approx.f32
    assert op_expr("tanh", F64, F64, ["x"], fast=True) == "tanh(x)"
    assert set(FAST_FUNCTIONS) == {"exp", "log", "log2", "log10", "sin", "cos", "tan", "tanh", "erf", "pow",
                                   "div", "sigmoid"}


def test_fast_tanh_is_the_hardware_instruction_on_the_gpu_and_accurate_elsewhere():
    """GELU's tanh form: with fast math its tanh is PTX's tanh.approx.f32 on sm_75 and
    later (guarded by __CUDA_ARCH__, so the sim and older targets keep tanhf)."""
    gelu = "pipeline g(x: f32[n]) -> (y: f32[n]) { y = 0.5 * x * (1.0 + tanh(0.79788456 * x)); }"
    fast = fusec.jit(gelu, fast_math=True, backend="numpy").cuda_source
    assert "fz_tanh_fast(" in fast and "tanh.approx.f32" in fast and "__CUDA_ARCH__ >= 750" in fast
    assert "tanh.approx" not in fusec.jit(gelu, backend="numpy").cuda_source


def test_fast_erf_is_the_prelude_helper_only_with_fast_math():
    """GELU's erf form: with fast math, f32 and bf16 alike, erf is the prelude's
    fz_erf_fast (6 FMAs and PTX ex2.approx.ftz.f32); without it, erff."""
    for dtype in ("f32", "bf16", "f16"):
        gelu = f"pipeline g(x: {dtype}[n]) -> (y: {dtype}[n]) {{ y = 0.5 * x * (1.0 + erf(0.70710678 * x)); }}"
        fast = fusec.jit(gelu, fast_math=True, backend="numpy").cuda_source
        assert "__device__ __forceinline__ float fz_erf_fast(float x)" in fast, dtype
        assert "fz_erf_fast(" in fast.split("fz_erf_fast(float x)", 1)[1] and "erff(" not in fast, dtype
        assert "ex2.approx.ftz.f32" in fast and fast.count("fmaf(") == 6, dtype
        plain = fusec.jit(gelu, backend="numpy").cuda_source
        assert "fz_erf_fast" not in plain and "ex2.approx" not in plain and "erff(" in plain, dtype
    f64 = "pipeline g(x: f64[n]) -> (y: f64[n]) { y = erf(x); }"
    assert "fz_erf_fast" not in fusec.jit(f64, fast_math=True, backend="numpy").cuda_source


def test_the_module_says_it_is_fast_and_uses_the_intrinsics(run_cli):
    code, text, _ = run_cli("compile", CHAIN, "--fast-math")
    assert code == 0 and "--fast-math" in text.splitlines()[1] and "flush" in text
    assert {"__expf", "__sinf", "__cosf"} <= set(re.findall(r"__\w+f(?=\()", text))
    assert "fz_erf_fast(" in text and "erff(" not in text and "atan2f(" in text and "log1pf(" in text
    plain = fusec.jit(CHAIN, backend="numpy").cuda_source
    assert "__expf" not in plain and "Fast math" not in plain


def test_nvrtc_flushes_denormals_only_with_fast_math():
    assert "-ftz=false" in cuda.OPTIONS and "-prec-div=true" in cuda.OPTIONS
    assert "-ftz=true" in cuda.FAST_OPTIONS and "-prec-div=false" in cuda.FAST_OPTIONS


def test_the_cost_model_knows_fast_math_is_cheaper():
    program = fusec.frontend.load(CHAIN)
    accurate = compile_pipeline(program, "transcendental_chain").interface.kernels[0].prediction
    fast = compile_pipeline(program, "transcendental_chain", CompileOptions(fast_math=True)).interface.kernels[0]
    assert fast.prediction.compute_us < 0.8 * accurate.compute_us
    assert compile_pipeline(program, "transcendental_chain", CompileOptions(fast_math=True)).interface.fast_math


def test_the_cost_model_prices_fast_math_from_its_measured_table():
    """Each approximated function at its figure measured on the H200 (fast_math.py
    --op-costs), below its accurate one; f64 stays accurate; erf's fast form (fusec's
    fz_erf_fast, no hardware instruction) keeps more than half the accurate cost."""
    accurate, fast = target_costs("sm_90"), target_costs("sm_90", fast_math=True)
    approximated = [op for op, ps in fast.op_ps["f32"].items() if ps != accurate.op_ps["f32"][op]]
    assert {"exp", "log", "sin", "cos", "tanh", "erf", "div", "sigmoid"} <= set(approximated)
    for op in approximated:
        assert fast.op_cost(op, False) < accurate.op_cost(op, False), op
        assert fast.op_cost(op, True) == accurate.op_cost(op, True), op  # f64 stays accurate
    assert 0.5 * accurate.op_cost("erf", False) < fast.op_cost("erf", False) < 0.6 * accurate.op_cost("erf", False)
