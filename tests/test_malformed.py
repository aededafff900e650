"""Malformed programs: each is rejected at the right line and column, with a
useful message, exit code 1, and nothing of fusec's insides in the output."""
import pytest

from fusec.errors import FzError, Source
from fusec.frontend import check_source

P = "pipeline p(x: f32[n], s: f32) -> (y: f32[n]) {\n"
G = "stage g(a: f32) -> (u: f32, v: f32) { u = a; v = a; }\n"
F_USE = "\npipeline p(x: f32[n]) -> (y: f32[n]) { y = f(x); }"

# (name, source, line, column, a fragment of the message)
CASES = [
    ("missing_semicolon", "stage f(x: f32) -> f32 { return x }" + F_USE, 1, 35, "expected ';'"),
    ("unknown_char", P + "    y = x @ s;\n}", 2, 11, "unexpected character '@'"),
    ("unclosed_paren", P + "    y = (x * s;\n}", 2, 15, "expected ')'"),
    ("eof_in_pipeline", P + "    y = x;\n", 3, 1, "unexpected end of file"),
    ("missing_result_type", "stage f(x: f32) -> { return x; }" + F_USE, 1, 20, "unexpected '{'"),
    ("misspelt_keyword", "pipline p(x: f32[n]) { }", 1, 1, "unexpected 'pipline'; expected one of 'pipeline', 'stage'"),
    ("float_dim", "pipeline p(x: f32[2.5]) { }", 1, 20, "unexpected '.5'"),
    ("empty_dims", "pipeline p(x: f32[]) { }", 1, 19, "unexpected ']'"),
    ("two_operators", P + "    y = x * * s;\n}", 2, 13, "unexpected '*'"),
    ("missing_comma_params", "pipeline p(x: f32[n] s: f32) { }", 1, 22, "expected one of ')', ','"),
    ("unknown_name", P + "    y = x * q;\n}", 2, 13, "unknown name 'q'"),
    ("unknown_type", "pipeline p(x: f33[n]) -> (y: f32[n]) { y = x; }", 1, 15, "unknown type 'f33'"),
    ("unknown_function", P + "    y = scalex(x, s);\n}", 2, 9, "unknown function 'scalex'"),
    ("builtin_arity", P + "    y = exp(x, s);\n}", 2, 9, "exp() takes 1 argument, got 2"),
    ("stage_arity", "stage f(a: f32, b: f32) -> f32 { return a + b; }\n" + P + "    y = f(x);\n}",
     3, 9, "stage 'f' takes 2 arguments, got 1"),
    ("targets_mismatch", G + P + "    y, z, w = g(x);\n}", 3, 15, "returns 2 values, but there are 3 targets"),
    ("multi_result_in_expr", G + P + "    y = g(x) + 1.0;\n}", 3, 9, "returns 2 values; assign them"),
    ("targets_without_stage", P + "    y, z = x;\n}", 2, 5, "2 targets need a call of a stage"),
    ("dup_stage", "stage f(a: f32) -> f32 { return a; }\nstage f(a: f32) -> f32 { return a; }" + F_USE,
     2, 7, "'f' is already defined (line 1)"),
    ("dup_pipeline", "pipeline p(x: f32[n]) -> (y: f32[n]) { y = x; }\n"
                     "pipeline p(x: f32[n]) -> (y: f32[n]) { y = x; }", 2, 10, "'p' is already defined"),
    ("dup_param", "pipeline p(x: f32[n], x: f32) -> (y: f32[n]) { y = x; }", 1, 23, "duplicate name 'x'"),
    ("dup_output", "pipeline p(x: f32[n]) -> (x: f32[n]) { x = x; }", 1, 27, "duplicate name 'x'"),
    ("dup_let", "stage f(a: f32) -> f32 { let t = a; let t = a * 2.0; return t; }" + F_USE,
     1, 41, "'t' is already defined in stage 'f'"),
    ("let_shadows_param", "stage f(a: f32) -> f32 { let a = 1.0; return a; }" + F_USE, 1, 30, "'a' is already defined"),
    ("assign_to_input", P + "    x = x * s;\n    y = x;\n}", 2, 5, "cannot assign to input 'x'; declare it `inout`"),
    ("assign_to_scalar", P + "    s = 2.0;\n    y = x;\n}", 2, 5, "cannot assign to scalar parameter 's'"),
    ("inout_scalar", "pipeline p(inout s: f32, x: f32[n]) -> (y: f32[n]) { y = x; }", 1, 18, "'inout' needs an array"),
    ("output_never_assigned", "pipeline p(x: f32[n]) -> (y: f32[n], z: f32[n]) {\n    y = x;\n}",
     1, 38, "output 'z' is never assigned"),
    ("output_only_in_repeat_0", "pipeline p(x: f32[n]) -> (y: f32[n]) {\n    repeat 0 { y = x; }\n}",
     1, 27, "'y' is assigned only inside the 'repeat' at line 2, which runs 0 times"),
    ("output_read_after_repeat_0", "pipeline p(x: f32[n]) -> (y: f32[n], z: f32[n]) {\n    repeat 0 { y = x; }\n"
                                   "    z = y + 1.0;\n    y = z;\n}", 3, 9, "which runs 0 times"),
    ("repeat_count_too_large", P + "    y = x;\n    repeat 9223372036854775808 { y = y * s; }\n}", 3, 12,
     "a repeat count is at most 2^63 - 1 (9223372036854775807)"),
    ("repeat_count_too_large_hex", P + "    y = x;\n    repeat 0xffffffffffffffff { y = y * s; }\n}", 3, 12,
     "at most 2^63 - 1"),
    ("stage_no_return", "stage f(a: f32) -> f32 { let t = a; }" + F_USE, 1, 7, "stage 'f' has no 'return'"),
    ("stage_unassigned_result", "stage g(a: f32) -> (u: f32, v: f32) { u = a; }\n"
                                "pipeline p(x: f32[n]) -> (y: f32[n]) { y, z = g(x); }",
     1, 29, "result 'v' of stage 'g' is never assigned"),
    ("stage_result_twice", "stage g(a: f32) -> (u: f32) { u = a; u = a; }\n"
                           "pipeline p(x: f32[n]) -> (y: f32[n]) { y = g(x); }", 1, 38, "assigned twice"),
    ("broadcast_literal_dims", "pipeline p(a: f32[3], b: f32[4]) -> (y: f32[4]) {\n    y = a + b;\n}",
     2, 5, "shapes [3] and [4] cannot broadcast"),
    ("output_dim_unbound", "pipeline p(x: f32[n]) -> (y: f32[k]) {\n    y = x;\n}", 1, 34,
     "dim 'k' of output 'y' is not bound by any input"),
    ("int_literal_too_big", P + "    y = x + 99999999999999999999999;\n}", 2, 13, "too large (more than 64 bits)"),
    ("float_literal_overflow", P + "    y = x * 1e999;\n}", 2, 13, "float literal 1e999 is out of range"),
    ("float_literal_f32_range", P + "    y = x * 1e300;\n}", 2, 13, "out of range for f32"),
    ("literal_not_fit_u8", "pipeline p(x: u8[n]) -> (y: u8[n]) {\n    y = x + 300;\n}", 2, 13,
     "integer literal 300 does not fit u8"),
    ("float_to_int_output", "pipeline p(x: f32[n]) -> (y: i32[n]) {\n    y = x * 2.0;\n}", 2, 5,
     "cannot convert f32 to i32 implicitly; write i32(...)"),
    ("logic_on_float", P + "    y = x && s ? x : s;\n}", 2, 11, "operands of '&&' must be bool, got f32"),
    ("not_on_number", P + "    y = !x;\n}", 2, 9, "operand of '!' must be bool"),
    ("ternary_cond_float", P + "    y = x ? x : s;\n}", 2, 11, "condition of '? :' must be bool"),
    ("where_cond_float", P + "    y = where(x, x, s);\n}", 2, 9, "condition of where() must be bool"),
    ("arith_on_bool", "pipeline p(a: bool[n], b: bool[n]) -> (y: bool[n]) {\n    y = a + b;\n}", 2, 11,
     "'+' on bool values"),
    ("no_common_type", "pipeline p(a: i64[n], b: u64[n]) -> (y: i64[n]) {\n    y = a + b;\n}", 2, 11,
     "i64 and u64 have no common type"),
    ("recursion", "stage f(a: f32) -> f32 { return g(a); }\nstage g(a: f32) -> f32 { return f(a); }" + F_USE,
     1, 7, "recursion is not allowed"),
    ("return_in_named", "stage g(a: f32) -> (u: f32) { return a; }\n"
                        "pipeline p(x: f32[n]) -> (y: f32[n]) { y = g(x); }", 1, 31, "assign them instead of 'return'"),
    ("assign_in_single", "stage f(a: f32) -> f32 { t = a; return t; }" + F_USE, 1, 26, "use 'let' for locals"),
    ("stage_param_dims", "stage f(a: f32[n]) -> f32 { return a; }" + F_USE, 1, 12, "drop the dims"),
    ("stage_param_inout", "stage f(inout a: f32) -> f32 { return a; }" + F_USE, 1, 15, "'inout' is for pipeline arrays"),
    ("repeat_float_count", P + "    y = x;\n    repeat 2.5 { y = y * s; }\n}", 3, 12, "2.5 is not an integer"),
    ("repeat_negative_count", P + "    y = x;\n    repeat -3 { y = y * s; }\n}", 3, 12, "cannot be negative (-3)"),
    ("repeat_float_param", P + "    y = x;\n    repeat s { y = y * s; }\n}", 3, 12, "'s' is f32"),
    ("repeat_unknown_count", P + "    y = x;\n    repeat k { y = y * s; }\n}", 3, 12, "'k' is not a scalar parameter"),
    ("repeat_expression_count", P + "    y = x;\n    repeat 2 * 3 { y = y * s; }\n}", 3, 14,
     "integer literal or an integer scalar parameter"),
    ("read_output_before_assign", P + "    y = y + x;\n}", 2, 9, "output 'y' is read before it is assigned"),
    ("output_scalar", "pipeline p(x: f32[n]) -> (y: f32) { y = x; }", 1, 27, "must be an array"),
    ("value_larger_than_output", "pipeline p(a: f32[rows, cols]) -> (y: f32[cols]) {\n    y = a * 2.0;\n}", 2, 5,
     "a value of shape [rows, cols] does not fit 'y' of shape [cols]"),
    ("dup_target", G + P + "    y, y = g(x);\n}", 3, 5, "'y' is assigned twice in one statement"),
    ("cast_arity", P + "    y = f32(x, s);\n}", 2, 9, "cast f32(...) takes 1 argument"),
    ("value_not_function", P + "    y = s(x);\n}", 2, 9, "'s' is a value, not a function"),
    ("empty_file", "", 1, 1, "no pipeline in this file"),
    ("only_comment", "# nothing here\n", 1, 1, "no pipeline in this file"),
    ("statement_after_return", "stage f(a: f32) -> f32 { return a; let b = a; }" + F_USE, 1, 40, "statement after 'return'"),
    ("carried_type_change", "pipeline p(x: f32[n], k: i32) -> (y: f32[n]) {\n    t = x;\n    repeat k { t = i32(t); }\n"
                            "    y = t;\n}", 3, 16, "carried around the repeat loop"),
    ("stage_arg_float_to_int", "stage f(a: i32) -> i32 { return a; }\npipeline p(x: f32[n]) -> (y: i32[n]) {\n"
                               "    y = f(x);\n}", 3, 11, "argument 1 ('a') of stage 'f': cannot convert f32 to i32"),
    ("bool_builtin", "pipeline p(a: bool[n]) -> (y: bool[n]) {\n    y = max(a, a);\n}", 2, 9, "max() needs numbers"),
    ("tab_and_unicode", P + "\ty = x \u00d7 s;\n}", 2, 8, "unexpected character '\u00d7'"),
    ("deep_nesting", P + "    y = " + "-" * 400 + "x;\n}", 2, 206, "nested too deeply"),
]


def diagnostics(source: str):
    with pytest.raises(FzError) as info:
        check_source(Source("t.fz", source))
    return info.value


@pytest.mark.parametrize("name,source,line,col,fragment", CASES, ids=[c[0] for c in CASES])
def test_rejected_at_the_right_place(name, source, line, col, fragment):
    err = diagnostics(source)
    found = [(d.loc.line, d.loc.col, d.message) for d in err.diagnostics]
    assert any((ln, c) == (line, col) and fragment in m for ln, c, m in found), found


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize("name,source,line,col,fragment", CASES[::5], ids=[c[0] for c in CASES[::5]])
def test_cli_prints_located_error_and_caret(tmp_path, run_cli, name, source, line, col, fragment):
    path = tmp_path / "t.fz"
    path.write_text(source)
    code, out, err = run_cli("check", str(path))
    assert code == 1
    assert f"t.fz:{line}:{col}: error:" in err
    assert fragment in err
    lines = err.splitlines()
    head = next(i for i, text in enumerate(lines) if f":{line}:{col}: error:" in text)
    assert lines[head + 2].strip() == "^"
    assert "Traceback" not in err and "fusec/" not in err


def test_all_errors_of_a_program_are_reported_together():
    err = diagnostics(P + "    t = x * q;\n    u = x + true2;\n    y = exp(x, s);\n}")
    assert [(d.loc.line, d.loc.col) for d in err.diagnostics] == [(2, 13), (3, 13), (4, 9)]


def test_a_failed_statement_does_not_cascade():
    err = diagnostics(P + "    t = x * q;\n    y = t + 1.0;\n}")
    assert len(err.diagnostics) == 1


def test_a_dim_literal_with_a_leading_zero_is_decimal():
    program = check_source(Source("<test>", "pipeline p(x: f32[010]) -> (y: f32[010]) { y = x + 1.0; }"))
    assert program.pipelines[0].params[0].shape == (10,)


def test_a_failed_operand_of_where_or_a_stage_call_with_the_wrong_arity_is_one_error():
    stage = "stage g(a: f32, b: f32) -> f32 { return a * b; }\n"
    for source in [P + "    y = where(x > 0.0, nosuch, x);\n}", stage + P + "    y = g(x) + where(x > 0.0, x, x);\n}"]:
        err = diagnostics(source)
        assert len(err.diagnostics) == 1, [d.message for d in err.diagnostics]


def test_errors_at_the_start_of_a_line_after_a_leading_newline_are_located_there():
    err = diagnostics("\nif (x) { }")  # a syntax hint's own location
    assert (err.diagnostics[0].loc.line, err.diagnostics[0].loc.col) == (2, 1), err.diagnostics


def test_a_byte_that_is_not_utf8_is_located_by_line_and_column():
    from fusec.frontend.parser import decode_source
    with pytest.raises(FzError) as info:
        decode_source(b"pipeline p() {}\n  \xff x", "t.fz")
    (d,) = info.value.diagnostics
    assert (d.loc.line, d.loc.col) == (2, 3) and "0xff" in d.message
