"""Backward pipelines derived from the source (unit tier, the numpy backend;
tests/test_grad_sim.py runs the same on the sim): torch.autograd.gradcheck in
f64 of fusec.torch_op, whose backward is the derived pipeline, for every
differentiable example, a statement of every differentiable builtin and random
differentiable pipelines (hypothesis); PyTorch's zero gradients; the derived
.fz itself, and that of every differentiable example as golden text; located
errors (FILE:LINE:COL, the line, a caret) for what cannot be differentiated,
from the pass, the CLI and an op's backward; the save-or-recompute choice
following the cost model, and both forms giving the same gradients."""
import itertools
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from helpers import EXAMPLES, ROOT

import fusec
from fusec.errors import FzError, Source
from fusec.frontend import check_source
from fusec.compiler import CompileOptions, compile_pipeline
from fusec.frontend.grad import backward_program, backward_source, choose_backward, saveable_outputs
from fusec.ir.kernels import row_schedule
from fusec.passes.lower import lower

torch = pytest.importorskip("torch")
_names = itertools.count()


def f64(text: str) -> str:
    """The program in f64 (gradcheck's finite differences need it)."""
    return re.sub(r"\b(f16|bf16|f32)\b", "f64", text)


def labels(rows: int, length: int, seed: int = 0):
    """Row indices into rows of `length`: inside, one ignored (-100), one past the end."""
    values = np.random.default_rng(seed).integers(0, length, (rows, 1))
    values[0, 0], values[-1, 0] = -100, length
    return torch.tensor(values, dtype=torch.int64)


def gradcheck(text: str, pipeline: str, shapes: dict, backend="numpy", integers=None, fast_mode=False, fuse="auto",
              **positive):
    """gradcheck of the op over random f64 inputs (`positive`: parameters kept away from 0;
    `integers`: the integer arrays, by name; fast_mode: gradcheck's check of random projections
    of the Jacobian, for a pipeline of many inputs and outputs; fuse: the op's)."""
    op = fusec.torch_op(text, name=f"grad_test::op{next(_names)}", pipeline=pipeline, backend=backend, fuse=fuse)
    program = check_source(Source("t.fz", text))
    rng = np.random.default_rng(0)
    args = []
    for p in program.pipeline(pipeline).params:
        if p.shape is None:
            args.append(0.7)
            continue
        shape = tuple(shapes.get(d, d) for d in p.shape)
        if p.type.is_int:
            args.append(integers[p.name])
            continue
        value = rng.standard_normal(shape)
        if p.name in positive:
            value = np.abs(value) + 0.5
        args.append(torch.tensor(value, dtype=torch.float64, requires_grad=p.type.is_float))
    assert torch.autograd.gradcheck(op, tuple(args), atol=1e-6, rtol=1e-5, fast_mode=fast_mode)
    return op


DIFFERENTIABLE = ["scale_bias_relu", "dag", "polar", "transcendental_chain", "softmax", "log_softmax", "bf16_swiglu",
                  "layernorm", "rmsnorm", "add_rmsnorm", "mlp", "cross_entropy", "fusion_hurts"]
# fusion_hurts' 24 inputs and 24 outputs: gradcheck's fast mode (random projections of the Jacobian),
# and its op unfused (the cost model's search over its backward's 72 statements takes minutes).
WIDE = {"fusion_hurts"}


def example_gradcheck(example: str, backend: str) -> None:
    """gradcheck of every pipeline of an example, with the backward the cost model chose
    (some take the forward's outputs saved)."""
    text = f64((ROOT / "examples" / f"{example}.fz").read_text())
    program = check_source(Source(f"{example}.fz", text))
    for pipeline in program.pipelines:
        gradcheck(text, pipeline.name, {"n": 7, "rows": 4, "cols": 5, "tokens": 3, "hidden": 5, "vocab": 6,
                                        "cells": 3}, backend, integers={"label": labels(4, 6)},
                  fast_mode=example in WIDE, fuse="none" if example in WIDE else "auto", x=True)


@pytest.mark.parametrize("example", DIFFERENTIABLE)
def test_every_differentiable_example_passes_gradcheck(example):
    example_gradcheck(example, "numpy")


BUILTIN_CASES = [
    "sqrt(x) + rsqrt(x) + cbrt(x) + log(x) + log2(x) + log10(x) + log1p(x)",
    "exp(y) + exp2(y) + expm1(y) + sin(y) + cos(y) + tan(y * 0.3) + sinh(y) + cosh(y) + tanh(y)",
    "asin(y * 0.3) + acos(y * 0.3) + atan(y) + atan2(y, x) + sigmoid(y) + erf(y) + abs(y)",
    "x * y / (x + 2.0) - y % x + pow(x, y) + x ** 2.0 + fma(x, y, y)",
    "min(x, y) + max(x, 2.0 * y) + clamp(y, -0.5, x) + where(y > 0.0, x * y, y) + floor(y) * x + round(x) + f32(y)",
]


@pytest.mark.parametrize("expression", BUILTIN_CASES)
def test_the_derivative_of_every_builtin(expression):
    builtin_gradcheck(expression, "numpy")


def builtin_gradcheck(expression: str, backend: str) -> None:
    text = f64(f"pipeline p(x: f32[n], y: f32[n]) -> (z: f32[n]) {{ z = {expression}; }}")
    gradcheck(text, "p", {"n": 9}, backend, x=True)


def test_row_pick_passes_its_gradient_to_the_element_it_picks():
    row_pick_check("numpy")


def row_pick_check(backend: str) -> None:
    """Inside the row, outside it (-100, the length: no element, no gradient); the
    backward's one-hot is `row_position(x) == j`."""
    text = "pipeline p(x: f64[r, c], j: i64[r, 1]) -> (y: f64[r, 1]) { y = row_pick(x, j) * 3.0; }"
    j = labels(5, 7, seed=1)
    op = gradcheck(text, "p", {"r": 5, "c": 7}, backend, integers={"j": j})
    x = torch.zeros((5, 7), dtype=torch.float64, requires_grad=True)
    op(x, j).sum().backward()
    want = torch.zeros((5, 7), dtype=torch.float64)
    for row, at in enumerate(j[:, 0].tolist()):
        if 0 <= at < 7:
            want[row, at] = 3.0
    assert torch.equal(x.grad, want)
    assert "row_position(x) == j" in backward_source(check_source(Source("t.fz", text)), "p")


def test_reductions_and_a_per_row_input():
    text = ("pipeline p(x: f64[r, c], g: f64[r, 1]) -> (y: f64[r, c], s: f64[r, 1]) {\n"
            "    s = row_logsumexp(x * g) + row_var(x) + row_max(x) - row_min(x * 2.0);\n"
            "    y = (x - row_mean(x)) * g + s;\n}")
    gradcheck(text, "p", {"r": 3, "c": 6})


def test_parameters_broadcast_over_leading_dims_get_column_sums():
    broadcast_check("numpy")


def broadcast_check(backend: str) -> None:
    # A per-column bias, a weight over the last dim of a 3-D array, a [1, c] row and a
    # per-row scale: their gradients are sums over the rows (col_sum), nested for two
    # leading dims, and over the row (row_sum).
    text = ("pipeline p(x: f64[a, b, c], w: f64[c], u: f64[1, c], v: f64[b, 1], bias: f64[b, c])\n"
            "    -> (y: f64[a, b, c], z: f64[b, c]) {\n"
            "    h = x * w + bias;\n"
            "    y = 0.5 * h * (1.0 + tanh(0.79788456 * (h + 0.044715 * h * h * h))) * v;\n"
            "    z = bias * u + col_sum(x * x);\n}")
    grad = backward_source(check_source(Source("t.fz", text)), "p")
    assert "col_sum(col_sum(" in grad  # w: summed over a, then b
    gradcheck(text, "p", {"a": 5, "b": 3, "c": 4}, backend=backend)


# Adjoints constant along a dim they are summed over (a per-row g read over the row, a per-column b
# over the rows, a [1, 1] u over both, a [1] v over a 1-D row, a per-row g of a 3-D array): the sum
# is the adjoint times the dim's length (row_length; a column count), not a sum of it spread out.
COUNTED = [
    "pipeline p(x: f64[r, c], g: f64[r, 1]) -> (s: f64[r, 1]) { s = row_sum(x + g) + row_mean(g * x - g); }",
    "pipeline p(x: f64[r, c], b: f64[c]) -> (s: f64[c]) { s = col_sum(x + b) + col_sum(b * 2.0 - x); }",
    "pipeline p(x: f64[r, c], u: f64[1, 1], v: f64[1]) -> (y: f64[r, c]) { y = x * u + v + row_sum(x - u); }",
    "pipeline p(x: f64[r], u: f64[1]) -> (y: f64[r], s: f64[1]) { y = x * u; s = row_sum(x + exp(u)); }",
    "pipeline p(x: f64[a, r, c], g: f64[r, 1]) -> (s: f64[a, r, 1]) { s = row_sum(x + g) * row_var(x * g); }",
    # and a factor constant along the summed dim left outside: w's gradient col_sum(g) * d_s
    "pipeline p(x: f64[r, c], g: f64[r, 1], w: f64[c]) -> (s: f64[c]) { s = col_sum(g * w + x); }",
]


@pytest.mark.parametrize("text", COUNTED)
def test_an_adjoint_constant_along_a_sum_is_counted(text):
    counted_check(text, "numpy")


def counted_check(text: str, backend: str) -> None:
    grad = backward_source(check_source(Source("t.fz", text)), "p")
    # counted by row_length (a column count: of a per-row value where the statement reads one), never
    # spread over the elements to be summed: where(isnan(x), d, d)
    assert "row_sum(where(isnan(" not in grad and not re.search(r"where\(isnan\(.*?\), (\w+), \1\)", grad)
    gradcheck(text, "p", {"a": 2, "r": 3, "c": 4}, backend)


def test_a_column_sum_in_the_forward_and_a_loss_total():
    text = f64((ROOT / "tests/programs/columns.fz").read_text())
    for pipeline in ("bias_relu_grads", "column_f64", "batch_total"):
        gradcheck(text, pipeline, {"rows": 130, "cols": 3, "r": 7, "k": 2})


def test_the_derived_pipeline_reads_as_fz():
    text = backward_source(check_source(Source("t.fz", "pipeline p(x: f32[n], s: f32) -> (y: f32[n]) "
                                                      "{ t = exp(x) * s; y = t * t; }")), "p")
    assert "pipeline p_grad(x: f32[n], s: f32, grad_y: f32[n])\n    -> (grad_x: f32[n])" in text
    assert "d_y = grad_y;" in text and "grad_x = " in text
    check_source(Source("grad.fz", text))  # valid .fz


# What cannot be differentiated: (program, where the caret points, what the message says).
NOT_DIFFERENTIABLE = {
    "inout": ("pipeline p(inout x: f32[n], w: f32[n]) {\n    x = x * w;\n}\n", "x: f32[n], w",
              "error: 'x' is updated in place (inout): its gradient needs the value before the update"),
    "repeat": ("pipeline p(x: f32[n]) -> (y: f32[n]) {\n    y = x;\n    repeat 2 {\n        y = y * x;\n    }\n}\n",
               "repeat", "error: differentiating a 'repeat' is not supported yet"),
    "integer output": ("pipeline p(x: f32[n], s: f32) -> (q: i8[n], big: bool[n]) {\n    r = round(x * s);\n"
                       "    big = r > 100.0;\n    q = i8(clamp(r, -127.0, 127.0));\n}\n", "q = i8",
                       "error: 'q' is i8, computed from the float parameter 'x': integer and bool values carry no "
                       "gradient, and pipeline 'p' has no float output to differentiate"),
    "bool output": ("pipeline p(x: f32[n]) -> (big: bool[n]) {\n    big = x > 1.0;\n}\n", "big = x",
                    "error: 'big' is bool, computed from the float parameter 'x'"),
    "no float output": ("pipeline p(x: f32[n], k: i32[n]) -> (m: bool[n]) {\n    m = k > 2;\n}\n", "p(x",
                        "error: pipeline 'p' has no float output to differentiate"),
    "no float input": ("pipeline p(x: i32[n]) -> (y: i32[n]) {\n    y = x * 2;\n}\n", "p(x",
                       "error: pipeline 'p' has no float array parameter to differentiate"),
    "middle broadcast": ("pipeline p(x: f32[a, b, c], m: f32[a, 1, c]) -> (y: f32[a, b, c]) {\n    y = x * m;\n}\n",
                         "m;", "error: the gradient of 'm' ([a, 1, c], read over [a, b, c]) is a sum over the dims"),
}


def located(text: str, marker: str) -> tuple[int, int, str]:
    """(line, column, the line's text) where `marker` first occurs in `text`."""
    before = text[:text.index(marker)]
    line = before.count("\n") + 1
    return line, len(before) - before.rfind("\n"), text.split("\n")[line - 1]


def assert_located(message: str, name: str, text: str, marker: str, fragment: str) -> None:
    """`message` is FILE:LINE:COL: error: ..., the source line and a caret under the column, and no more."""
    line, col, source_line = located(text, marker)
    head, shown, caret = message.split("\n")
    assert head.startswith(f"{name}:{line}:{col}: {fragment}"), head
    assert (shown, caret) == (f"    {source_line}", "    " + " " * (col - 1) + "^"), message


@pytest.mark.parametrize("case", NOT_DIFFERENTIABLE)
def test_what_cannot_be_differentiated_is_a_located_error(case):
    text, marker, fragment = NOT_DIFFERENTIABLE[case]
    with pytest.raises(FzError) as caught:
        backward_source(check_source(Source("t.fz", text)), "p")
    assert_located(str(caught.value), "t.fz", text, marker, fragment)


def test_a_float_output_beside_an_integer_one_is_differentiated():
    """An integer output beside a float one is not differentiable (as torch.max's indices): the
    backward takes the float outputs' gradients alone."""
    text = "pipeline p(x: f32[n]) -> (y: f32[n], q: i8[n]) {\n    y = x * 2.0;\n    q = i8(x);\n}\n"
    grad = backward_source(check_source(Source("t.fz", text)), "p")
    assert "pipeline p_grad(x: f32[n], grad_y: f32[n])\n    -> (grad_x: f32[n])" in grad


@pytest.mark.parametrize("case", ["inout", "repeat", "integer output", "middle broadcast"])
def test_the_cli_says_where_a_pipeline_cannot_be_differentiated(run_cli, tmp_path, case):
    text, marker, fragment = NOT_DIFFERENTIABLE[case]
    path = tmp_path / "t.fz"
    path.write_text(text)
    for argv in (["compile", "--grad", str(path)], ["compile", "--grad", "--emit", "fz", str(path)]):
        code, out, err = run_cli(*argv)
        assert (code, out) == (1, ""), err
        assert_located(err.rstrip("\n"), str(path), text, marker, fragment)


def test_an_ops_backward_says_where_the_pipeline_cannot_be_differentiated():
    """The op runs forward; where a gradient reaches it, its backward raises the located error."""
    for case in ("repeat", "integer output"):
        text, marker, fragment = NOT_DIFFERENTIABLE[case]
        op = fusec.torch_op(text, name=f"grad_test::refused{next(_names)}", backend="numpy")
        assert op.backward is None and isinstance(op.not_differentiable, FzError)
        x = torch.linspace(-1, 1, 5, requires_grad=True)
        out = op(x) if case == "repeat" else op(x, 300.0)
        if case == "integer output":  # integer outputs: no gradient to ask for
            assert not any(o.requires_grad for o in out)
            continue
        with pytest.raises(FzError) as caught:
            out.sum().backward()
        assert_located(str(caught.value), "<string>", text, marker, fragment)


def test_an_op_updating_in_place_refuses_a_call_autograd_would_record():
    """torch keeps no autograd formula for an op that mutates its arguments, so a call on tensors
    that require grad would leave a silently wrong gradient: refused with the located reason.
    Under no_grad, or with no tensor requiring grad, it runs."""
    text, marker, fragment = NOT_DIFFERENTIABLE["inout"]
    op = fusec.torch_op(text, name=f"grad_test::inplace{next(_names)}", backend="numpy")
    w = torch.full((4,), 3.0, requires_grad=True)
    x = torch.ones(4, requires_grad=True) * 1.0  # not a leaf: torch itself would let it be updated
    with pytest.raises(FzError) as caught:
        op(x, w)
    assert_located(str(caught.value), "<string>", text, marker, fragment)
    with torch.no_grad():
        op(x, w)
    assert torch.equal(x.detach(), torch.full((4,), 3.0))
    y = torch.ones(4)
    op(y, w.detach())
    assert torch.equal(y, torch.full((4,), 3.0))


def test_a_torch_op_takes_the_saved_outputs_its_schema_has_room_for():
    """A torch op has at most 64 arguments: the choice is among the backward's forms that fit
    (fusion_hurts' 24 inputs, 24 saved outputs and 24 gradients would take 72)."""
    program = check_source(Source("choices.fz", CHOICES))
    assert choose_backward(program, "softmax").saved == ("y",)
    assert choose_backward(program, "softmax", max_params=2).saved == ()  # x and grad_y
    with pytest.raises(FzError, match="the backward of pipeline 'softmax' takes 2 arguments .* at most 1 fit"):
        choose_backward(program, "softmax", max_params=1)


def test_pytorchs_zero_gradients():
    zero_gradients_check("numpy")


def zero_gradients_check(backend: str) -> None:
    """floor, ceil, round, trunc, comparisons (a condition, or a bool cast to float), integer
    casts, isnan, and the side of `where` not selected pass no gradient, as in PyTorch: fusec's
    gradients are torch autograd's on the same maths (not only finite differences' near zero)."""
    text = ("pipeline p(x: f64[n], y: f64[n]) -> (z: f64[n]) {\n"
            "    z = floor(x) * y + ceil(x * y) + round(x) * 2.0 + trunc(y) * x + f64(x > y) * 3.0\n"
            "        + f64(i32(x * 4.0)) * y + where(x > 0.0, x * y, exp(y)) + where(isnan(x), x, y * y);\n}\n")
    op = fusec.torch_op(text, name=f"grad_test::zero{next(_names)}", backend=backend)
    rng = np.random.default_rng(4)
    x, y = (torch.tensor(rng.standard_normal(64) * 3, requires_grad=True) for _ in range(2))
    g = torch.tensor(rng.standard_normal(64))
    found = torch.autograd.grad(op(x, y), (x, y), g)
    z = (torch.floor(x) * y + torch.ceil(x * y) + torch.round(x) * 2.0 + torch.trunc(y) * x + (x > y).double() * 3.0
         + (x * 4.0).to(torch.int32).double() * y + torch.where(x > 0.0, x * y, torch.exp(y))
         + torch.where(torch.isnan(x), x, y * y))
    expected = torch.autograd.grad(z, (x, y), g)
    for a, b in zip(found, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_cli_prints_and_compiles_the_backward(tmp_path, capsys):
    from fusec.cli import main
    out = tmp_path / "grad.fz"
    assert main(["compile", "--grad", "--emit", "fz", str(ROOT / "examples/softmax.fz"), "-o", str(out)]) == 0
    assert "pipeline softmax_grad(x: f32[rows, cols], y: f32[rows, cols], grad_y: f32[rows, cols])" in \
        out.read_text() and "pipeline softmax_bf16_grad(" in out.read_text()
    # the choice and why: both forms' predicted forward + backward
    assert re.search(r"# The cost model's choice: softmax_grad: saving y, .* \(saving y: [\d.]+ \+ [\d.]+ = [\d.]+ µs"
                     r".*; recomputing every forward value: [\d.]+ \+ [\d.]+ = [\d.]+ µs", out.read_text())
    assert main(["compile", "--grad", "--report", str(ROOT / "examples/log_softmax.fz"), "-o",
                 str(tmp_path / "ls.cu")]) == 0
    assert re.search(r"backward: log_softmax_grad: saving y, (the lower predicted time|within 1 % of the same predicted "
                     r"time, with less arithmetic,) for forward \+ backward at 2\^26 elements", capsys.readouterr().err)
    cu = tmp_path / "grad.cu"
    assert main(["compile", "--grad", str(ROOT / "examples/softmax.fz"), "-o", str(cu)]) == 0
    assert "__global__ void softmax_grad_k0" in cu.read_text()


def test_examples_listed_here_are_all_the_differentiable_ones():
    derivable = []
    for path in EXAMPLES:
        program = check_source(Source(path.name, path.read_text()))
        try:
            for p in program.pipelines:
                backward_source(program, p.name)
            derivable.append(path.stem)
        except FzError:
            pass
    # quantize's outputs are integers (NOT_DIFFERENTIABLE["integer output"]); adam, adamw, bias_gelu and
    # time_step update arrays in place.
    assert sorted(derivable) == sorted(DIFFERENTIABLE)


# ---- the derived backward of every differentiable example, as golden .fz text

@pytest.mark.parametrize("example", [e for e in DIFFERENTIABLE if e not in WIDE])  # fusion_hurts': 160 KB
def test_the_derived_backward_matches_golden(file_regression, example):
    """The form the cost model chose (softmax's, log_softmax's, layernorm's and add_rmsnorm's take
    outputs saved). Regenerate on purpose with `pytest tests/test_grad.py --force-regen`, reading the diff."""
    program = check_source(Source(f"{example}.fz", (ROOT / "examples" / f"{example}.fz").read_text()))
    text = "\n".join(backward_source(program, p.name, choose_backward(program, p.name).saved)
                     for p in program.pipelines)
    check_source(Source(f"{example}.grad.fz", text))  # the golden text is itself a valid program
    file_regression.check(text, fullpath=ROOT / "tests" / "golden" / f"{example}.grad.fz")


def test_softmax_recomputing_everything_matches_golden(file_regression):
    """The form not chosen for softmax: y recomputed, its adjoint still the softmax rule (none through row_max)."""
    program = check_source(Source("softmax.fz", (ROOT / "examples/softmax.fz").read_text()))
    text = "\n".join(backward_source(program, p.name) for p in program.pipelines)
    file_regression.check(text, fullpath=ROOT / "tests" / "golden" / "softmax.recompute.grad.fz")


# ---- the backward of a row reduction: its row sums hold only what varies along the row

# (example, pipeline, row reductions in its derived backward, the cost model's choice of form). The
# form before issue 15 had, for RMSNorm, three: row_mean(x * x); row_sum(d_y * w * x * -0.5 *
# rsqrt(u) / u), with a division and an rsqrt an element, which waits for the first (two rounds
# over the row); and row_sum(where(isnan(x * x), 1.0, 1.0)), counting the row.
ROW_BACKWARDS = [("rmsnorm", "rmsnorm", 2), ("rmsnorm", "rmsnorm_bf16", 2), ("add_rmsnorm", "add_rmsnorm", 2),
                 ("add_rmsnorm", "add_rmsnorm_bf16", 2), ("mlp", "bias_residual_rmsnorm", 2),
                 ("layernorm", "layernorm", 2), ("layernorm", "layernorm_bf16", 2), ("softmax", "softmax", 1),
                 ("log_softmax", "log_softmax", 1), ("cross_entropy", "cross_entropy", 1)]


@pytest.mark.parametrize("example,pipeline,reductions", ROW_BACKWARDS)
def test_a_row_reductions_backward_sums_only_what_varies_along_the_row(example, pipeline, reductions):
    """Reverse mode takes the adjoint of a per-row value where it is broadcast: RMSNorm's r =
    rsqrt(u) gets row_sum(d_y * w * x), then u's is that times -0.5 * r * r * r once a row. So
    no row reduction of the derived backward holds a division, a square root or an rsqrt an
    element, none counts the row (row_length does, free), and its fused row kernel knows every
    reduction after one pass over the row, then stores (the old RMSNorm form: two passes)."""
    program = check_source(Source(f"{example}.fz", (ROOT / "examples" / f"{example}.fz").read_text()))
    grad = backward_program(program, pipeline)
    graph = lower(grad, grad.pipeline(f"{pipeline}_grad"))
    found = [s for s in graph.stages if s.row_reduction and s.reduce != "length"]
    assert len(found) == reductions, [s.name for s in found]
    for stage in found:
        ops = {ins.op for ins in stage.body.instrs}
        assert not ops & {"div", "sqrt", "rsqrt", "isnan"}, (stage.name, ops)
    assert "isnan" not in grad.source.text
    compiled = compile_pipeline(grad, f"{pipeline}_grad")
    rows = [k.kernel for k in compiled.interface.kernels if k.kernel.rows]
    assert rows and all(row_schedule(k).reductions <= 1 for k in rows)
    # One row kernel where everything of the row is fused (the cost model may split it: bf16
    # RMSNorm's row_mean over x in a kernel of its own, its per-row output priced once a row,
    # 195 µs predicted against 199 for the one kernel)
    fused = compile_pipeline(grad, f"{pipeline}_grad", CompileOptions(fuse="all"))
    rows = [k.kernel for k in fused.interface.kernels if k.kernel.rows]
    assert rows and all(row_schedule(k).reductions <= 1 for k in rows)
    assert len(rows) == 1 or example == "cross_entropy"  # its loss's mean: column sums between
    if example == "rmsnorm":
        assert "row_sum(d_y * f32(w) * f32(x))" in grad.source.text or "row_sum(d_y * w * x)" in grad.source.text


def test_the_row_length_divides_a_mean_and_has_no_gradient():
    """row_mean's adjoint is d / row_length(x), per row; row_length's own is none."""
    text = ("pipeline p(x: f64[r, c]) -> (y: f64[r, c]) {\n"
            "    y = x * row_mean(x) + row_length(x) * x;\n}\n")
    grad = backward_source(check_source(Source("t.fz", text)), "p")
    assert "/ row_length(x)" in grad and "d_row_length" not in grad
    gradcheck(text, "p", {"r": 3, "c": 5})


# ---- save or recompute: the cost model's choice, and both forms correct

CHOICES = """
pipeline softmax(x: f64[r, c]) -> (y: f64[r, c]) {
    m = row_max(x);
    e = exp(x - m);
    y = e / row_sum(e);
}
pipeline log_softmax_bf16(x: bf16[r, c]) -> (y: bf16[r, c]) { y = x - row_logsumexp(x); }
pipeline power(x: f32[r, c], w: f32[r, c]) -> (y: f32[r, c]) { y = pow(x, w); }
pipeline chain(x: f32[r, c]) -> (y: f32[r, c]) { y = exp(tanh(x) * sin(x)); }
pipeline affine(x: f32[r, c], b: f32[r, c]) -> (y: f32[r, c]) { y = x * 2.0 + b; }
"""


@pytest.mark.parametrize("pipeline", ["log_softmax_bf16", "power"])
def test_saving_the_output_is_chosen_where_the_cost_model_says_it_is_cheaper(pipeline):
    """log_softmax's recompute needs a row_logsumexp (exp(y) with y saved); pow's the pow again:
    the saved form's predicted total is lower."""
    program = check_source(Source("choices.fz", CHOICES))
    choice = choose_backward(program, pipeline)
    assert choice.saved == ("y",)
    assert set(choice.backward) == {(), ("y",)}
    assert choice.total_us(("y",)) < choice.total_us(())
    assert "saving y, the lower predicted time" in choice.describe()
    text = backward_program(program, pipeline).source.text
    assert f"pipeline {pipeline}_grad(x: " in text and ", y: " in text.split(f"{pipeline}_grad(")[1].split(")")[0]


@pytest.mark.parametrize("source", ["choices", "softmax.fz"])
def test_softmax_saves_y_it_is_no_slower_and_a_fraction_of_the_arithmetic(source):
    """softmax's recompute needs row_max, exp and two row_sums; with y saved, one row_sum. Both read
    12 B an element in f32 (the row stays on chip), so at the nominal size the predicted times may
    tie (memory-bound): then the saved form's arithmetic, under half of recomputing's, decides."""
    text = CHOICES if source == "choices" else (ROOT / "examples/softmax.fz").read_text()
    program = check_source(Source(source, text))
    choice = choose_backward(program, "softmax")
    assert choice.saved == ("y",)
    assert choice.total_us(("y",)) <= choice.total_us(())
    assert choice.backward[("y",)][1] < choice.backward[()][1] / 2
    # nothing of the forward recomputed: only y's
    assert "d_e_arg = y * (d_y - row_sum(d_y * y));\n    grad_x = d_e_arg;" in backward_source(program, "softmax", ("y",))
    assert "where(x == m" not in backward_source(program, "softmax")  # no gradient through the shift


def test_recomputing_is_chosen_where_the_saved_output_would_be_an_extra_read():
    """chain's backward reads x anyway (tanh and sin's derivatives): y saved would be one more
    array to read; affine's backward reads nothing of the forward (nothing to save)."""
    program = check_source(Source("choices.fz", CHOICES))
    choice = choose_backward(program, "chain")
    assert choice.saved == ()
    assert choice.total_us(()) < choice.total_us(("y",))
    assert "recomputing every forward value, the lower predicted time" in choice.describe()
    assert "pipeline chain_grad(x: f32[r, c], grad_y: f32[r, c])" in backward_program(program, "chain").source.text
    assert saveable_outputs(program, "affine") == ()
    assert choose_backward(program, "affine").saved == ()


FORMS = [
    ("softmax", lambda x: torch.softmax(x, -1)),
    ("log_softmax", lambda x: torch.log_softmax(x, -1)),
    ("power", lambda x, w: torch.pow(x, w)),
    ("chain", lambda x: torch.exp(torch.tanh(x) * torch.sin(x))),
]


@pytest.mark.parametrize("pipeline,reference", FORMS)
def test_both_forms_give_torchs_gradients(pipeline, reference):
    both_forms_check("numpy", pipeline, reference)


def both_forms_check(backend: str, pipeline: str, reference) -> None:
    """The backward recomputing everything and the one taking y saved, each forced, run on
    the forward's y: both are torch's gradient (f64)."""
    text = f64(CHOICES).replace("log_softmax_bf16", "log_softmax")
    program = check_source(Source("choices.fz", text))
    rng = np.random.default_rng(3)
    inputs = [np.abs(rng.standard_normal((3, 17))) + 0.5 for _ in program.pipeline(pipeline).params]
    g = rng.standard_normal((3, 17))
    y = fusec.jit(text, backend=backend, pipeline=pipeline)(*inputs)
    tensors = [torch.tensor(a, requires_grad=True) for a in inputs]
    reference(*tensors).backward(torch.tensor(g))
    expected = [t.grad.numpy() for t in tensors]
    for saved in ((), ("y",)):
        grad = fusec.jit(backward_program(program, pipeline, saved={pipeline: saved}).source.text, backend=backend,
                         pipeline=f"{pipeline}_grad")
        found = grad(*inputs, *([y] if saved else []), g)
        for a, b in zip(found if isinstance(found, tuple) else (found,), expected):
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-10, atol=1e-12)


def test_the_op_saves_the_outputs_its_backward_takes():
    """softmax's op saves y for autograd and its backward op takes it; chain's saves none."""
    program = check_source(Source("choices.fz", CHOICES))
    softmax = fusec.torch_op(CHOICES, name=f"grad_test::saved{next(_names)}", pipeline="softmax", backend="numpy")
    assert softmax.definition.saved_outputs() == [True]
    assert softmax.backward.schema == "(Tensor x, Tensor y, Tensor grad_y) -> Tensor"
    chain = fusec.torch_op(CHOICES, name=f"grad_test::saved{next(_names)}", pipeline="chain", backend="numpy")
    assert chain.definition.saved_outputs() == [False]
    assert chain.backward.schema == "(Tensor x, Tensor grad_y) -> Tensor"
    x = torch.randn(3, 9, dtype=torch.float64, requires_grad=True)
    y = softmax(x)
    assert any(t is y or t.data_ptr() == y.data_ptr() for t in y.grad_fn.saved_tensors)
    weights = torch.randn(3, 9, dtype=torch.float64)
    (y * weights).sum().backward()
    twin = x.detach().clone().requires_grad_()
    (torch.softmax(twin, -1) * weights).sum().backward()
    torch.testing.assert_close(x.grad, twin.grad)
    assert program.pipeline("softmax") is not None


# ---- random differentiable pipelines (hypothesis): gradcheck of the derived backward

# Each builtin on a domain where it is smooth at the random points: (template, operands).
SMOOTH = [("sin({0})", 1), ("cos({0})", 1), ("tanh({0})", 1), ("sigmoid({0})", 1), ("exp({0} * 0.5)", 1),
          ("log(1.5 + {0} * {0})", 1), ("sqrt(1.0 + {0} * {0})", 1), ("atan({0})", 1), ("erf({0})", 1),
          ("({0} * {1})", 2), ("({0} + {1})", 2), ("({0} - 0.5 * {1})", 2), ("({0} / (2.0 + {1} * {1}))", 2),
          ("atan2({0}, 2.0 + {1} * {1})", 2), ("fma({0}, {1}, {2})", 3), ("({0} ** 2.0)", 1),
          ("abs({0} + 3.0)", 1), ("min({0}, {1})", 2), ("where({0} > {1}, {0} * {1}, {1})", 2)]


@st.composite
def differentiable_pipelines(draw):
    """A pipeline of 1-3 f64 inputs (and maybe a scalar), 1-5 statements of smooth builtins
    (some left dead, some reading only earlier statements), 1-2 outputs."""
    inputs = [f"x{i}" for i in range(draw(st.integers(1, 3)))]
    scalar = draw(st.booleans())
    names, lines = list(inputs) + (["s"] if scalar else []), []
    for k in range(draw(st.integers(1, 5))):
        template, arity = draw(st.sampled_from(SMOOTH))
        operands = [draw(st.sampled_from(names)) for _ in range(arity)]
        lines.append(f"    t{k} = {template.format(*operands)};")
        names.append(f"t{k}")
    statements = [f"t{k}" for k in range(len(lines))]
    outputs = draw(st.lists(st.sampled_from(statements), min_size=1, max_size=2, unique=True))
    params = ", ".join([f"{x}: f64[n]" for x in inputs] + (["s: f64"] if scalar else []))
    results = ", ".join(f"y{j}: f64[n]" for j in range(len(outputs)))
    body = lines + [f"    y{j} = {t} + x0 * 0.0;" for j, t in enumerate(outputs)]  # an array even if t is scalar-only
    return f"pipeline p({params}) -> ({results}) {{\n" + "\n".join(body) + "\n}\n"


# Reductions of a [r, c] value: over its rows (a [r, 1] result) or its columns ([c]).
REDUCTIONS = ["row_sum({0})", "row_mean({0})", "row_max({0})", "row_min({0})", "row_logsumexp({0})",
              "row_var({0})", "col_sum({0})"]
ROW_SHAPES = {"[r, c]": ("r", "c"), "[c]": ("c",), "[r, 1]": ("r", 1)}


def _broadcast(shapes):
    found = {s for s in shapes if s != ()}
    return ("r", "c") if len(found) > 1 or ("r", "c") in found else next(iter(found), ())


@st.composite
def differentiable_row_pipelines(draw):
    """Over rows: x0 f64[r, c] and 0-2 more inputs of [r, c], a per-column [c] or a per-row
    [r, 1] (gradients summed over what they are broadcast along), maybe a scalar; 1-5
    statements of smooth builtins and reductions of [r, c] values over rows or columns."""
    shapes = {"x0": ("r", "c")}
    for i in range(1, draw(st.integers(1, 3))):
        shapes[f"x{i}"] = ROW_SHAPES[draw(st.sampled_from(sorted(ROW_SHAPES)))]
    params = [f"{x}: f64[{', '.join(map(str, s))}]" for x, s in shapes.items()]
    if draw(st.booleans()):
        shapes["s"] = ()
        params.append("s: f64")
    lines = []
    for k in range(draw(st.integers(1, 5))):
        wide = [n for n, s in shapes.items() if s == ("r", "c")]
        if draw(st.booleans()):
            template = draw(st.sampled_from(REDUCTIONS))
            operand = draw(st.sampled_from(wide))
            shape = ("c",) if template.startswith("col") else ("r", 1)
            lines.append(f"    t{k} = {template.format(operand)};")
        else:
            template, arity = draw(st.sampled_from(SMOOTH))
            operands = [draw(st.sampled_from(sorted(shapes))) for _ in range(arity)]
            shape = _broadcast([shapes[o] for o in operands])
            lines.append(f"    t{k} = {template.format(*operands)};")
        shapes[f"t{k}"] = shape
    statements = [f"t{k}" for k in range(len(lines))]
    outputs = draw(st.lists(st.sampled_from(statements), min_size=1, max_size=2, unique=True))
    results = ", ".join(f"y{j}: f64[r, c]" for j in range(len(outputs)))
    body = lines + [f"    y{j} = {t} + x0 * 0.0;" for j, t in enumerate(outputs)]
    return f"pipeline p({', '.join(params)}) -> ({results}) {{\n" + "\n".join(body) + "\n}\n"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(differentiable_pipelines())
def test_random_differentiable_pipelines_pass_gradcheck(text):
    gradcheck(text, "p", {"n": 5})


# Found by the strategy: a row sum's adjoint left [r, 1] where t1 = t0 + x0 is [r, c], so that
# t0's (summed over the row) counted it once, not once an element.
NARROW_SUM = ("pipeline p(x0: f64[r, c]) -> (y0: f64[r, c]) {\n    t0 = row_sum(x0);\n    t1 = (t0 + x0);\n"
              "    t2 = row_sum(t1);\n    y0 = t2 + x0 * 0.0;\n}\n")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(differentiable_row_pipelines())
@example(NARROW_SUM)
def test_random_differentiable_row_pipelines_pass_gradcheck(text):
    gradcheck(text, "p", {"r": 3, "c": 4})


# ---- traced Python functions as ops: the backward derived from the traced pipeline

def test_a_traced_function_op_passes_gradcheck():
    traced_gradcheck("numpy")


def traced_gradcheck(backend: str) -> None:
    def gated(x: torch.Tensor, g: torch.Tensor, k: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * fusec.sigmoid(beta * g) + fusec.tanh(x * g)
        return y, fusec.exp(-x * x) * k

    op = fusec.torch_op(gated, name=f"grad_test::traced{next(_names)}", backend=backend)
    rng = np.random.default_rng(1)
    x, g = (torch.tensor(rng.standard_normal((2, 3)), requires_grad=True) for _ in range(2))
    k = torch.tensor(rng.standard_normal((2, 3)))  # a float tensor that needs no gradient
    assert torch.autograd.gradcheck(op, (x, g, k, 0.7), atol=1e-6, rtol=1e-5)
    # the gradients are the same maths' in torch
    y, z = op(x, g, k, 0.7)
    (y.sum() + (z * z).sum()).backward()
    x2, g2 = x.detach().clone().requires_grad_(), g.detach().clone().requires_grad_()
    y2 = x2 * torch.sigmoid(0.7 * g2) + torch.tanh(x2 * g2)
    (y2.sum() + ((torch.exp(-x2 * x2) * k) ** 2).sum()).backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(g.grad, g2.grad)


def test_a_traced_function_op_with_an_integer_tensor_gets_none_for_it():
    def scaled(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return x * n

    op = fusec.torch_op(scaled, name=f"grad_test::traced{next(_names)}", backend="numpy")
    x = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64, requires_grad=True)
    n = torch.tensor([2, 3, 4])
    op(x, n).sum().backward()
    torch.testing.assert_close(x.grad, n.to(torch.float64))


def test_a_loss_summed_over_an_ops_output_backpropagates():
    summed_loss_check("numpy")


def summed_loss_check(backend: str) -> None:
    """y.sum()'s gradient reaches the op as ones expanded (stride 0): the backward takes it."""
    text = f64((ROOT / "examples/scale_bias_relu.fz").read_text())
    op = fusec.torch_op(text, name=f"grad_test::summed{next(_names)}", backend=backend)
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    op(x, 1.5, -0.25).sum().backward()
    torch.testing.assert_close(x.grad, torch.where(x * 1.5 - 0.25 > 0, 1.5, 0.0).to(torch.float64))


def test_a_traced_op_of_one_tensor_and_scalars_backpropagates():
    one_tensor_check("numpy")


def one_tensor_check(backend: str) -> None:
    """One tensor parameter: the backward op has one output (the numpy backend wrote into its rows)."""
    def single(x: torch.Tensor, s: float, k: int) -> torch.Tensor:
        return fusec.sin(x) * s * k

    op = fusec.torch_op(single, name=f"grad_test::single{next(_names)}", backend=backend)
    x = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4).requires_grad_()
    op(x, 2.0, 3).sum().backward()
    torch.testing.assert_close(x.grad, torch.cos(x.detach()) * 6.0)
