"""Row reductions (unit tier): the language's rules with their located errors,
the NumPy reference against hand-written per-row arithmetic, and how they are
planned (a kernel of their own, one block per row)."""
import math
import re

import ml_dtypes
import numpy as np
import pytest

import fusec
from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import FzError, Source
from fusec.frontend import check_source
from fusec.ir.launch import RowGrid, RowBlock

P = "pipeline p(x: f32[r, c], h: bf16[r, c], d: f64[r, c], k: i32[r, c], j: i64[r, 1], s: f32) -> (y: f32[r, 1]) {\n"


def errors(source: str) -> list[tuple[int, int, str]]:
    with pytest.raises(FzError) as caught:
        check_source(Source("t.fz", source))
    return [(d.loc.line, d.loc.col, d.message) for d in caught.value.diagnostics]


@pytest.mark.parametrize("body,col,fragment", [
    ("y = row_sum(s);", 9, "row_sum() reduces each row of an array; its argument is a scalar"),
    ("y = row_sum(1.5);", 9, "its argument is a scalar"),
    ("y = row_max(k);", 9, "row_max() needs floats, got i32; convert with f32(...)"),
    ("y = row_sum(x, x);", 9, "row_sum() takes 1 argument, got 2"),
    ("y = row_pick(x);", 9, "row_pick() takes 2 arguments, got 1"),
    ("y = row_pick(x, x);", 9, "the index of row_pick() must be an integer, got f32"),
    ("y = row_pick(x, k);", 9, "the index of row_pick() must be one per row, of shape [..., 1]; it is [r, c]"),
    ("y = x;", 5, "does not fit 'y'"),
    ("repeat 2 { y = row_sum(x); }", 20, "row_sum() inside 'repeat' is not supported yet"),
    ("y = sum(x);", 9, "a reduction over each row (the last axis) is row_sum(x)"),
    ("y = max(x);", 9, "the maximum of each row is row_max(x)"),
    ("y = row_summ(x);", 9, "did you mean 'row_sum'"),
])
def test_a_reduction_used_wrongly_is_a_located_error(body, col, fragment):
    found = errors(P + "    " + body + "\n}")
    assert any(line == 2 and c == col and fragment in message for line, c, message in found), found


def test_a_reduction_in_a_stage_is_a_located_error():
    found = errors("stage f(a: f32) -> f32 { return row_sum(a); }\n"
                   "pipeline p(x: f32[n]) -> (y: f32[n]) { y = f(x); }")
    assert found == [(1, 33, "row_sum() reduces the rows of an array: it belongs in a pipeline statement; "
                             "a stage computes one element")]


def test_the_result_has_a_trailing_1_and_broadcasts_back():
    program = check_source(Source("t.fz", "pipeline p(x: f32[a, b, c]) -> (y: f32[a, b, c], m: f32[a, b, 1]) {\n"
                                          "    m = row_max(x);\n    y = x - m + row_sum(x * 2.0);\n}"))
    p = program.pipelines[0]
    reductions = [s for s in p.body if s.reduce]
    assert [(s.reduce, s.shape, p.slot(s.targets[0]).shape) for s in reductions] == [
        ("max", ("a", "b", "c"), ("a", "b", 1)), ("sum", ("a", "b", "c"), ("a", "b", 1))]
    assert reductions[0].targets == ("m",)  # `m = row_max(x);` stores into m: no copy statement
    assert len(p.body) == 3


def test_the_accumulation_type_is_f32_for_narrow_floats_and_f64_for_f64():
    p = check_source(Source("t.fz", "pipeline p(h: bf16[r, c], d: f64[r, c]) -> (a: f32[r, 1], b: f64[r, 1]) "
                                    "{ t = row_sum(h); u = row_sum(d); a = t; b = u; }")).pipelines[0]
    assert (p.slot("t").type.name, p.slot("u").type.name) == ("f32", "f64")


# ---- the reference, against per-row arithmetic written out here

def rows_of(x):
    return [list(map(float, row)) for row in np.asarray(x, np.float64).reshape(-1, x.shape[-1])]


def per_row(fn, x):
    return np.array([fn(row) for row in rows_of(x)])


def exact_sum(row):
    return math.fsum(row)


def row_max(row):
    return math.nan if any(math.isnan(v) for v in row) else max(row, default=-math.inf)


def row_min(row):
    return math.nan if any(math.isnan(v) for v in row) else min(row, default=math.inf)


def row_var(row):
    if not row:
        return math.nan
    mean = math.fsum(row) / len(row)
    return math.fsum((v - mean) ** 2 for v in row) / len(row)


def row_logsumexp(row):
    m = row_max(row)
    if math.isnan(m) or math.isinf(m):
        return m
    return m + math.log(math.fsum(math.exp(v - m) for v in row))


RNG = np.random.default_rng(3)
EDGES = {
    "one": np.array([[2.5], [-1.0]], np.float32),
    "odd": RNG.standard_normal((3, 257)).astype(np.float32),
    "inf_and_nan": np.array([[1.0, -np.inf, 3.0], [np.nan, 1.0, 2.0], [-np.inf, -np.inf, -np.inf],
                             [np.inf, 1.0, 0.0]], np.float32),
    "all_equal": np.full((2, 9), 0.1, np.float32),
    "huge": np.array([[3e38, 3e38, -3e38, 1e38], [-1e30, -1e30, -2e30, -1e30]], np.float32),
    "wide": (RNG.standard_normal((2, 5000)) * 100).astype(np.float32),
}


def reference(op: str, x: np.ndarray, index=None):
    call = "row_pick(x, j)" if op == "pick" else f"row_{op}(x)"
    params = "x: f32[r, c]" + (", j: i64[r, 1]" if op == "pick" else "")
    f = fusec.jit(f"pipeline p({params}) -> (y: f32[r, 1]) {{ y = {call}; }}", backend="numpy")
    return (f(x, index) if op == "pick" else f(x)).reshape(-1)


def sum_bound(x):
    """The README's bound for a sum: rows * eps * the sum of magnitudes."""
    return x.shape[-1] * np.finfo(np.float32).eps * per_row(lambda r: math.fsum(map(abs, r)), x)


@pytest.mark.parametrize("name", EDGES)
def test_max_min_are_exact_and_propagate_nan(name):
    x = EDGES[name]
    np.testing.assert_array_equal(reference("max", x), per_row(row_max, x).astype(np.float32))
    np.testing.assert_array_equal(reference("min", x), per_row(row_min, x).astype(np.float32))


@pytest.mark.parametrize("name", ["one", "odd", "all_equal", "wide"])
def test_sum_mean_var_within_the_stated_bound(name):
    x = EDGES[name]
    length = x.shape[-1]
    exact = per_row(exact_sum, x)
    bound = sum_bound(x)
    assert np.all(np.abs(reference("sum", x) - exact) <= bound)
    assert np.all(np.abs(reference("mean", x) - exact / length) <= bound / length + 1e-45)
    var = per_row(row_var, x)
    # The mean's error, and the sum of squared deviations' own.
    var_bound = 2 * length * np.finfo(np.float32).eps * (var + per_row(lambda r: (math.fsum(map(abs, r)) / len(r)) ** 2, x))
    assert np.all(np.abs(reference("var", x) - var) <= var_bound + 1e-45)


def test_a_sum_overflowing_or_meeting_nan_and_inf_follows_ieee():
    np.testing.assert_array_equal(reference("sum", EDGES["huge"])[:1], [np.inf])
    got = reference("sum", EDGES["inf_and_nan"])
    np.testing.assert_array_equal(got, np.array([-np.inf, np.nan, -np.inf, np.inf], np.float32))


@pytest.mark.parametrize("name", EDGES)
def test_logsumexp_is_stable_and_keeps_infinities(name):
    x = EDGES[name]
    got = reference("logsumexp", x).astype(np.float64)
    want = per_row(row_logsumexp, x)
    special = ~np.isfinite(want)
    np.testing.assert_array_equal(got[special], want[special])  # -inf rows, +inf and NaN: exactly
    finite = ~special
    assert np.all(np.isfinite(got[finite]))  # 3e38 does not overflow: shifted by the max
    assert np.all(np.abs(got[finite] - want[finite]) <= 4e-7 * np.maximum(1, np.abs(want[finite])) + x.shape[-1] * 1.2e-7)


def test_pick_is_exact_and_zero_outside_the_row():
    x = np.array([[1.5, -0.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [np.nan, 1.0, 2.0]], np.float32)
    index = np.array([[1], [2], [-100], [3]], np.int64)
    got = reference("pick", x, index)
    np.testing.assert_array_equal(got, np.array([-0.0, 6.0, 0.0, 0.0], np.float32))
    assert np.signbit(got[0])  # the element itself, -0 kept


def test_empty_rows_give_the_identity_or_nan():
    x = np.zeros((3, 0), np.float32)
    np.testing.assert_array_equal(reference("sum", x), [0, 0, 0])
    np.testing.assert_array_equal(reference("max", x), [-np.inf] * 3)
    np.testing.assert_array_equal(reference("min", x), [np.inf] * 3)
    assert np.isnan(reference("mean", x)).all() and np.isnan(reference("var", x)).all()
    np.testing.assert_array_equal(reference("logsumexp", x), [-np.inf] * 3)
    np.testing.assert_array_equal(reference("pick", x, np.zeros((3, 1), np.int64)), [0, 0, 0])


def test_bf16_rows_are_reduced_in_f32_from_their_values():
    x = np.array([[1.0, 2.0 ** -9, 2.0 ** -9]], ml_dtypes.bfloat16)  # 1 + 2^-8 is not a bf16
    f = fusec.jit("pipeline p(x: bf16[r, c]) -> (y: f32[r, 1], z: bf16[r, 1]) { y = row_sum(x); z = row_sum(x); }",
                  backend="numpy")
    y, z = f(x)
    assert y[0, 0] == np.float32(1 + 2 ** -8)
    assert z[0, 0] == np.float32(1.0)  # rounded once, where it is stored as bf16 (to even)


# ---- planning

def compile_text(text: str, fuse: str = "auto"):
    program = check_source(Source("t.fz", text))
    return compile_pipeline(program, program.pipelines[0].name, CompileOptions(fuse=fuse))


SOFTMAX = "pipeline p(x: f32[r, c]) -> (y: f32[r, c]) {\n    m = row_max(x);\n    e = exp(x - m);\n    y = e / row_sum(e);\n}"


def test_softmax_is_one_row_kernel_reading_x_and_writing_y_only():
    compiled = compile_text(SOFTMAX)
    (launch,) = compiled.interface.kernels
    # x (read in three passes) held in registers, 16 elements a thread as 16-byte vectors
    # (four f32): rows of up to 128 and 256 elements 8 and 16 lanes each, 512 a warp each, then
    # a block of 64 ... 1,024 threads up to 16 elements each, then a cluster of 4 to 16 blocks
    # of 256 (or 16 of 512) threads up to 32 elements each; else (an odd length, an
    # unaligned array) rows of up to 4 KiB a warp each, longer ones a block each, where x is
    # kept in shared memory where it fits, 4 bytes an element; longer rows of whole vectors a
    # block each reading them again (a vector warp or shared-memory kernel would never run:
    # the registers take every row it could).
    assert [(v.name, v.grid, v.row_cache, v.max_row, v.elements_per_thread, v.row_resident)
            for v in launch.variants] == [
        ("p_k0_r8_v4", RowGrid(32), 0, 128, 4, 4), ("p_k0_r16_v4", RowGrid(16), 0, 256, 4, 4),
        ("p_k0_r32_v4", RowGrid(8), 0, 512, 4, 4), ("p_k0_r64_v4", RowGrid(1, 64), 0, 1024, 4, 4),
        ("p_k0_r128_v4", RowGrid(1, 128), 0, 2048, 4, 4), ("p_k0_r256_v4", RowGrid(1, 256), 0, 4096, 4, 4),
        ("p_k0_r512_v4", RowGrid(1, 512), 0, 8192, 4, 4), ("p_k0_r1024_v4", RowGrid(1, 1024), 0, 16384, 4, 4),
        ("p_k0_c4_r256_v4", RowGrid(1, 256, 4), 0, 32768, 4, 8),
        ("p_k0_c8_r256_v4", RowGrid(1, 256, 8), 0, 65536, 4, 8),
        ("p_k0_c16_r256_v4", RowGrid(1, 256, 16), 0, 131072, 4, 8),
        ("p_k0_c16_r512_v4", RowGrid(1, 512, 16), 0, 262144, 4, 8),
        ("p_k0_warp", RowGrid(8), 0, 1024, 1, 0), ("p_k0_cached", RowGrid(), 4, None, 1, 0),
        ("p_k0_v4", RowGrid(), 0, None, 4, 0), ("p_k0", RowGrid(), 0, None, 1, 0)]
    assert launch.form == RowBlock() and all(v.whole_rows for v in launch.variants if v.elements_per_thread > 1)
    assert [a.buffer for a in launch.kernel.loads] == ["x"]
    assert [a.buffer for a, _ in launch.kernel.stores] == ["y"]
    reductions = [ins.op for ins in launch.kernel.body.instrs if ins.op.startswith("row_")]
    assert reductions == ["row_max", "row_sum"]


@pytest.mark.parametrize("arch, clusters", [("sm_80", False), ("sm_89", False), ("sm_90", True), ("sm_90a", True)])
def test_clusters_only_where_the_architecture_has_them(arch, clusters):
    """Thread-block clusters came with sm_90: compiled for an earlier GPU, a row
    kernel's longest resident variant is a block's (16 Ki f32 elements)."""
    program = check_source(Source("t.fz", SOFTMAX))
    compiled = compile_pipeline(program, "p", CompileOptions(arch=arch))
    names = [v.name for v in compiled.interface.kernels[0].variants]
    assert any("_c16_" in n for n in names) == clusters
    assert ("__clusterRelativeBlockRank" in compiled.cuda) == clusters
    assert max(v.max_row or 0 for v in compiled.interface.kernels[0].variants) == (262144 if clusters else 16384)


def test_unfused_each_statement_is_its_own_kernel_and_a_reduction_a_row_kernel():
    compiled = compile_text(SOFTMAX, fuse="none")
    forms = [type(k.form).__name__ for k in compiled.interface.kernels]
    assert forms == ["RowBlock", "Elementwise", "RowBlock", "Elementwise"]


def test_rows_of_another_shape_are_not_fused_into_a_row_kernel():
    compiled = compile_text("pipeline p(x: f32[r, c], z: f32[c, r]) -> (y: f32[r, c], w: f32[c, r]) {\n"
                            "    y = x / row_sum(x);\n    w = z * 2.0;\n}")
    kernels = compiled.interface.kernels
    assert [type(k.form).__name__ for k in kernels] == ["RowBlock", "Elementwise"]
    assert "differs from" in " ".join(d.reason for d in compiled.partition.decisions)


def test_foreach_refuses_a_pipeline_with_a_reduction():
    f = fusec.jit("pipeline p(x: f32[r, c]) -> (y: f32[r, 1]) { y = row_sum(x); }", backend="numpy")
    with pytest.raises(ValueError, match="has a reduction"):
        f.foreach([(np.ones((2, 3), np.float32),)])


def test_the_report_lists_the_row_strategies_in_the_order_the_runtime_tries_them():
    import fusec.report
    compiled = compile_text(SOFTMAX)
    text = fusec.report.table(compiled.interface, compile_text(SOFTMAX, fuse="none").interface)
    listed = [line.strip().split(":")[0] for line in text.splitlines() if line.startswith("    p_k0")]
    assert listed == [v.name for v in compiled.interface.kernels[0].variants]
    assert "p_k0_warp: a warp per row (8 a block), rows of at most 1024 elements\n" in text
    assert "p_k0_r1024_v4: a block of 1024 per row, the row held in registers (4 vectors a thread), rows of " \
        "at most 16384 elements, 4-element" in text
    assert "p_k0: a block per row\n" in text


def test_a_row_held_in_registers_keeps_what_a_later_pass_would_compute_again():
    """Softmax held in registers computes exp(x - m) once an element (kept for the
    stores' pass, which reads it and no longer x); the warp kernel reading the
    row again computes it in both passes. The stores' pass multiplies by the sum's
    reciprocal, divided once a row before it (passes/row_reciprocals.py)."""
    import re
    cuda = compile_text(SOFTMAX).cuda

    def function(name: str) -> str:
        return re.search(rf"void (?:__launch_bounds__\([^)]*\) )?{name}\((.*?)\n}}", cuda, re.S).group(1)
    for name in ("p_k0_r32_v4", "p_k0_r256_v4", "p_k0_r1024_v4"):
        body = function(name)
        assert body.count("expf(") == 1, name
        last = body.rsplit("#pragma unroll\n    for (int r", 1)[1]
        assert "x_reg" not in last and "held[r].v[k] * " in last and " / " not in last
    assert function("p_k0_warp").count("expf(") == 2


def test_a_pick_of_an_input_is_one_load_a_row_not_a_compare_an_element():
    """row_pick(logits, label) of an input array (bf16 widened to f32 too): each row
    kernel loads the element at the label once a row, checked against [0, length),
    and neither compares each column with the label nor combines the pick; a pick of
    an expression still compares (the value exists only per element)."""
    from helpers import ROOT, load_program
    program = load_program(ROOT / "examples/cross_entropy.fz")
    for name in ("cross_entropy", "cross_entropy_bf16"):
        cuda = compile_pipeline(program, name).cuda
        variants = len(re.findall(rf"\b{name}_k0\w*\(\n", cuda))
        assert variants > 10 and cuda.count("picked = v0 >= 0 && v0 < e1 ? (float)") == variants  # every one
        assert "logits[row * e1 + v0]" in cuda and "== v0) acc" not in cuda
    source = ("pipeline p(x: f32[r, c], j: i64[r, 1]) -> (k: f32[r, 1]) {\n"
              "    k = row_pick(x * 2.0, j);\n}")
    cuda = fusec.jit(source, backend="numpy").cuda_source
    assert "== v0) acc" in cuda and "picked = v0 >= 0 && v0 < e1 ? acc" in cuda
