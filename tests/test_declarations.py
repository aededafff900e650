"""Declarations (unit tier): every mode the language does not allow for a kind
of parameter is a located error, never an internal one; and `load` tells a
path from source text robustly."""
import numpy as np
import pytest

import fusec
from fusec.errors import FzError, Source
from fusec.frontend import check_source, load

STAGE_USE = "\npipeline p(x: f32[n]) -> (y: f32[n]) { y = f(x); }"

# (name, source, line, column, fragment): each mode on each kind of declaration
MODES = [
    ("inout_scalar", "pipeline p(inout s: f32, x: f32[n]) -> (y: f32[n]) { y = x * s; }", 1, 18,
     "'inout' needs an array; 's' is a scalar"),
    ("inout_scalar_assigned", "pipeline p(inout s: f32, x: f32[n]) -> (y: f32[n]) {\n    s = 2.0;\n    y = x * s;\n}",
     1, 18, "'inout' needs an array"),
    ("inout_scalar_only", "pipeline p(inout s: f32) { s = s + 1.0; }", 1, 18, "'inout' needs an array"),
    ("inout_scalar_count", "pipeline p(inout k: i32, x: f32[n]) -> (y: f32[n]) { y = x; repeat k { y = y * 2.0; } }",
     1, 18, "'inout' needs an array"),
    ("inout_output", "pipeline p(x: f32[n]) -> (inout y: f32[n]) { y = x; }", 1, 33,
     "'inout' is for a parameter the pipeline updates in place; output 'y'"),
    ("inout_scalar_output", "pipeline p(x: f32[n]) -> (inout y: f32) { y = x; }", 1, 33, "'inout' is for a parameter"),
    ("inout_twice", "pipeline p(inout inout x: f32[n]) { x = x; }", 1, 18, "'inout' is written twice"),
    ("inout_stage_param", "stage f(inout a: f32) -> f32 { return a; }" + STAGE_USE, 1, 15,
     "'inout' is for pipeline arrays, not a stage parameter"),
    ("inout_stage_result", "stage f(a: f32) -> (inout r: f32) { r = a; }" + STAGE_USE, 1, 27,
     "'inout' is for pipeline arrays, not a stage result"),
    ("inout_stage_single_result", "stage f(a: f32) -> inout f32 { return a; }" + STAGE_USE, 1, 20,
     "'inout' is for a pipeline's array parameters"),
    ("inout_input_shape_mismatch", "pipeline p(inout x: f32[1], y: f32[n]) { x = y; }", 1, 42,
     "a value of shape [n] does not fit 'x' of shape [1]"),
    ("array_stage_param", "stage f(a: f32[n]) -> f32 { return a; }" + STAGE_USE, 1, 12, "drop the dims"),
    ("array_stage_result", "stage f(a: f32) -> f32[n] { return a; }" + STAGE_USE, 1, 20, "drop the dims"),
    ("scalar_output", "pipeline p(x: f32[n]) -> (y: f32) { y = x; }", 1, 27, "must be an array"),
    ("dim_too_large", "pipeline p(x: f32[" + "9" * 5000 + "]) -> (y: f32[" + "9" * 5000 + "]) { y = x; }", 1, 19,
     "dim is too large (at most 2^62)"),
]


@pytest.mark.parametrize("name,source,line,col,fragment", MODES, ids=[m[0] for m in MODES])
def test_modes_the_language_does_not_allow_are_located_errors(name, source, line, col, fragment):
    with pytest.raises(FzError) as info:
        check_source(Source("t.fz", source))
    found = [(d.loc.line, d.loc.col, d.message) for d in info.value.diagnostics]
    assert any((ln, c) == (line, col) and fragment in m for ln, c, m in found), found


def test_every_mode_on_every_kind_checks_or_fails_with_a_located_error_only():
    """All combinations: mode (none, inout) x kind (pipeline array, scalar, output; stage
    parameter, result) x whether the body assigns it."""
    for mode in ("", "inout "):
        for decl, use in [("x: f32[n]", "x"), ("x: f32[n, 1]", "x"), ("x: f32[3]", "x"), ("x: f32", "x"),
                          ("x: i32", "x")]:
            for assign in ("", "    x = x + 1;\n"):
                for output in (f"{mode}y: f32[n]", "y: f32[n]"):
                    source = (f"pipeline p({mode}{decl}, z: f32[n]) -> ({output}) {{\n{assign}"
                              f"    y = z + f32({use});\n}}")
                    _checks_or_located(source)
            _checks_or_located(f"stage f({mode}a: f32) -> ({mode}r: f32) {{ r = a; }}" + STAGE_USE)


def _checks_or_located(source: str) -> None:
    try:
        check_source(Source("t.fz", source))
    except FzError as err:
        assert all(d.loc.line >= 1 for d in err.diagnostics), (source, str(err))


# ---- a path or source text
ONE_LINE = "pipeline p(x: f32[n]) -> (y: f32[n]) { y = x * 2.0; } # a.fz"


def test_one_line_source_ending_in_dot_fz_is_source():
    f = fusec.jit(ONE_LINE, backend="numpy")
    np.testing.assert_array_equal(f(np.ones(3, np.float32)), [2, 2, 2])


def test_an_existing_file_is_a_path_and_a_missing_fz_path_is_a_located_error(tmp_path, monkeypatch):
    path = tmp_path / "prog.fz"
    path.write_text(ONE_LINE)
    assert load(str(path)).pipelines[0].name == "p"
    monkeypatch.chdir(tmp_path)
    assert load("prog.fz").pipelines[0].name == "p"
    with pytest.raises(FzError, match=r"^missing\.fz: error: cannot read file: No such file or directory$"):
        load("missing.fz")
    with pytest.raises(FzError, match=r"cannot read file"):
        load("sub/missing_without_suffix")


def test_text_that_is_neither_is_checked_as_source():
    with pytest.raises(FzError, match=r"<string>:1:1: error: no pipeline in this file"):
        load("")
    with pytest.raises(FzError, match=r"<string>:1:\d+: error: unexpected end of file"):
        load("pipeline p(x: f32[n]")
    with pytest.raises(FzError, match=r"<string>:1:\d+: error: unexpected character"):
        load("pipeline \x00")
