"""The nvcc tier of the register estimate: every function of the generated
corpus (tests/estimate_corpus.py: wide, deep, multi-output,
transcendental-heavy, many-live-value, f16/bf16/f64, integer, broadcast and
repeat pipelines, and the examples, each in every form it has) compiled with
`nvcc -cubin -arch=sm_90 -O3 -Xptxas -v`, against fusec's estimate of it
(fusec.passes.regs, per variant)."""
import collections
import re

import pytest
from estimate_corpus import cases, compile_case, far_under, measure, summary, within

pytestmark = pytest.mark.nvcc

FORMS = {"scalar", "vector", "grid-stride", "loop", "multi-tensor", "row", "row-warp", "column"}
FAMILIES = {"simple", "wide", "deep", "multi-output", "transcendental", "many-live", "f16", "bf16", "f64", "integer",
            "broadcast", "loop", "example"}
# Functions where ptxas uses far more registers than the estimate says, for
# reasons the estimate does not model: f64 math in a loop or across the lanes
# of a vector, where ptxas sometimes keeps the expansions' 64-bit constants in
# registers for the whole loop (and sometimes does not: exp alone in a loop
# takes 44 registers, exp and erf together 26). Listed so that the bound below
# holds for everything else, and checked to still be outliers.
OUTLIERS = {
    "trans61_f64_f_k0_v2": "acos -> erf -> sqrt in f64: 52 registers; acos -> erf alone, 28",
    "trans61_f64_m_k0_mt": "the same in the multi-tensor form: 120",
    "loop13_f64_f_k0": "three f64 values iterated 10 times through exp and f64 constants: 53",
}


@pytest.fixture(scope="module")
def corpus():
    """(functions, ptxas usage by function name); nothing is kept between runs."""
    modules, functions = [], []
    for case in cases():
        for cuda, found in compile_case(case):
            modules.append(cuda)
            functions += found
    return functions, measure(modules)


def test_corpus_covers_every_family_and_form(corpus):
    functions, usage = corpus
    assert {f.family for f in functions} == FAMILIES
    assert {f.form for f in functions} == FORMS
    kernels = {(f.family, f.kernel.name) for f in functions}
    assert len(kernels) >= 100
    for form in FORMS:
        assert sum(f.form == form for f in functions) >= 15, form
    assert {f.name for f in functions} <= set(usage)


def test_no_function_spills(corpus):
    """A spilling function's register count is capped, not needed: it would say nothing of the estimate."""
    functions, usage = corpus
    spilling = [(f.name, usage[f.name].spill_bytes) for f in functions if usage[f.name].spill_bytes]
    assert not spilling


def test_estimate_within_bound_for_nine_in_ten(corpus):
    functions, usage = corpus
    results = [(f, usage[f.name].registers) for f in functions]
    share = sum(within(f.estimate, real) for f, real in results) / len(results)
    print("\nregister estimate against ptxas (sm_90), per form:")
    print(summary([(f.form, f.estimate, real) for f, real in results]))
    print("per family:")
    print(summary([(f.family, f.estimate, real) for f, real in results]))
    assert share >= 0.9, f"{100 * share:.1f} % of {len(results)} functions within max(4, 20 %)"
    for form in FORMS:  # and no form far behind
        form_results = [(f, real) for f, real in results if f.form == form]
        assert sum(within(f.estimate, real) for f, real in form_results) / len(form_results) >= 0.8, form


def test_estimate_never_far_under_near_the_budget(corpus):
    functions, usage = corpus
    under = [(f.name, f.estimate, usage[f.name].registers) for f in functions
             if f.name not in OUTLIERS and far_under(f.estimate, usage[f.name].registers)]
    assert not under, under


def test_outliers_are_still_outliers(corpus):
    """The exceptions above stay exactly as many as ptxas makes."""
    functions, usage = corpus
    by_name = {f.name: f for f in functions}
    assert set(OUTLIERS) <= set(by_name)
    assert all(far_under(by_name[n].estimate, usage[n].registers) for n in OUTLIERS)


def test_examples_vector_variants_within_bound(corpus):
    """The 16-byte variant of every example kernel, the kernel that usually runs."""
    functions, usage = corpus
    vectors = [f for f in functions if f.family == "example" and f.form == "vector"]
    assert len(vectors) >= 15
    assert [(f.name, f.estimate, usage[f.name].registers) for f in vectors
            if not within(f.estimate, usage[f.name].registers)] == []


def test_estimates_by_form_differ_where_ptxas_does(corpus):
    """The variants of one kernel are estimated apart: the vector variant above the scalar one."""
    functions, usage = corpus
    by_kernel = collections.defaultdict(dict)
    for f in functions:
        by_kernel[f.kernel.name][f.form] = f
    pairs = [(k["scalar"], k["vector"]) for k in by_kernel.values() if "scalar" in k and "vector" in k]
    assert len(pairs) >= 100
    assert all(v.estimate > s.estimate for s, v in pairs if usage[v.name].registers > usage[s.name].registers + 4)


def test_the_decision_record_reads_each_functions_machine_code_bytes():
    """benchmarks/decision_quality.py keeps each kernel's SASS bytes (from the
    cubin's .text sections) beside its registers: a deep chain's 16-byte vector
    variant unrolls its elements, so its code is several times the one-element
    variant's (the deep32 bf16 miss: one kernel of 120 KiB against two of 60)."""
    import importlib.util

    from helpers import ROOT

    from fusec.compiler import compile_pipeline
    from fusec.errors import Source
    from fusec.frontend import check_source
    from fusec.runtime.backends.cuda import compile_module
    spec = importlib.util.spec_from_file_location("decision_quality", ROOT / "benchmarks" / "decision_quality.py")
    dq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dq)
    compiled = compile_pipeline(check_source(Source("deep", dq.deep(12, "bf16"))), "deep12")
    sizes = dq.sass_bytes(compile_module(compiled.cuda, "sm_90", native=True))
    (launch,) = compiled.interface.kernels
    vector, scalar = (next(v.name for v in launch.variants if (v.elements_per_thread > 1) == wide) for wide in (True, False))
    assert set(sizes) == {v.name for v in launch.variants}
    assert sizes[vector] > 3 * sizes[scalar] > 0
    assert dq.sass_bytes(b"// PTX, not a cubin") == {}


def _row_functions(source: str, pipeline: str, **options):
    """(functions of every row kernel of `pipeline`, the row reductions of each one's
    kernel by function name, ptxas usage by function name)."""
    from estimate_corpus import functions

    from fusec.compiler import CompileOptions, compile_pipeline
    from fusec.errors import Source
    from fusec.frontend import check_source
    from fusec.ir.kernels import ROW_REDUCTIONS
    compiled = compile_pipeline(check_source(Source("t.fz", source)), pipeline, CompileOptions(**options))
    found = [(launch.kernel, f) for launch in compiled.interface.kernels for f in functions("row", launch)
             if f.variant.rows and not f.variant.columns]
    reductions = {f.name: sum(ins.op in ROW_REDUCTIONS for ins in k.body.instrs) for k, f in found}
    return [f for _, f in found], reductions, measure([compiled.cuda])


def _misses(functions, usage) -> list:
    return [(f.name, f.estimate, usage[f.name].registers) for f in functions
            if not within(f.estimate, usage[f.name].registers) or far_under(f.estimate, usage[f.name].registers)]


def test_cross_entropy_row_kernel_within_bound():
    """Cross-entropy's pick at the label is one load a row, not an accumulator and a
    combine, and its warp-per-row loop (an online log-sum-exp, branching at each
    element) is not unrolled further: its warp and block variants were estimated at
    34 and 28 registers where ptxas took 24 and 22."""
    from helpers import ROOT
    source = (ROOT / "examples" / "cross_entropy.fz").read_text()
    for pipeline in ("cross_entropy", "cross_entropy_bf16"):
        functions, _, usage = _row_functions(source, pipeline)
        assert any(f.variant.warp for f in functions)
        assert _misses(functions, usage) == []


def test_row_statistics_keeping_nothing_between_passes_within_bound():
    """A row kernel of which no array and no value is kept from one pass to the next
    uses each unrolled vector as it loads it: its variants "holding the row" in
    registers were estimated for the whole row (RMSNorm's backward statistics, three
    arrays read once: 66 registers in clusters of 256 where ptxas took 34, 42 against
    36 in blocks of 256)."""
    statistics = """
pipeline stats(x: f32[rows, cols], w: f32[cols], g: f32[rows, cols]) -> (r: f32[rows, 1], m: f32[rows, 1]) {
    r = rsqrt(row_mean(x * x) + 0.00001);
    m = row_mean(g * w * x);
}
"""
    functions, _, usage = _row_functions(statistics, "stats", fuse="all")
    resident = [f for f in functions if re.search(r"_r\d+_v\d+$", f.name)]
    assert len(resident) >= 12
    # in blocks of 64 to 1024 ptxas took 22-26 (estimated 34: over, left; blocks of up to 256
    # threads combine through fz_block_combine_warps, compiled for the block's warps: 22)
    over = ("_r64_v4", "_r128_v4", "_r256_v4", "_r512_v4", "_r1024_v4")
    assert [m for m in _misses(resident, usage) if not m[0].endswith(over)] == []
    assert all(estimate > real for _, estimate, real in _misses(resident, usage))


def test_layernorm_normalisation_row_kernel_within_bound():
    """LayerNorm under 64 registers: its normalisation (rstd and y from the statistics,
    x, w and b) is a row kernel of its own, with no reduction and nothing kept between
    passes. Its variants holding the row in registers were estimated for the whole row
    (64 registers in clusters of 256 where ptxas took 34); under __launch_bounds__ the
    loads of all its vectors issue at once (64 registers in blocks of 512 and 1024,
    estimated 48 and 40: far under)."""
    from helpers import ROOT
    layernorm = (ROOT / "examples" / "layernorm.fz").read_text()
    functions, reductions, usage = _row_functions(layernorm, "layernorm", max_regs=64)
    normalise = [f for f in functions if reductions[f.name] == 0]
    assert len(normalise) >= 12, "LayerNorm under 64 registers: its normalisation a row kernel of its own"
    assert _misses(normalise, usage) == []
