"""Messages for what .fz does not have (unit tier): each says what is not
supported and what to write instead, located at the offending token."""
import pytest

from fusec.errors import FzError, Source
from fusec.frontend import check_source

P = "pipeline p(x: f32[n], s: f32, k: i32, c: bool[n]) -> (y: f32[n]) {\n"
STAGE2 = "stage g(a: f32, s: f32) -> f32 { return a * s; }\n"

# (name, source, line, column, fragments of the message)
CASES = [
    ("shift_right", P + "    y = x >> 3;\n}", 2, 11, ["'>>' is not supported", "no shift operators", "x / 8"]),
    ("shift_left", P + "    y = x<<3;\n}", 2, 10, ["'<<' is not supported", "x * 8"]),
    ("shift_assign", P + "    y = x;\n    y >>= 1;\n}", 3, 7, ["'>>=' is not supported", "no shift operators"]),
    ("xor_is_not_power", P + "    y = x ^ 5;\n}", 2, 11, ["'^' is not power", "x ** y"]),
    ("bit_and", P + "    y = c & c ? x : s;\n}", 2, 11, ["'&' is not an operator", "no bitwise operators", "a && b"]),
    ("bit_or", P + "    y = c | c ? x : s;\n}", 2, 11, ["'|' is not an operator", "a || b"]),
    ("bit_not", P + "    y = ~c ? x : s;\n}", 2, 9, ["'~' is not an operator", "!a"]),
    ("plus_assign", P + "    y = x;\n    y += 1.0;\n}", 3, 7, ["no '+='", "no compound assignment", "`y = y + ...;`"]),
    ("times_assign", P + "    y = x;\n    y *= s;\n}", 3, 7, ["no '*='", "`y = y * ...;`"]),
    ("power_assign", P + "    y = x;\n    y **= 2.0;\n}", 3, 7, ["no '**='", "`y = y ** ...;`"]),
    ("increment", P + "    y = x;\n    y++;\n}", 3, 6, ["no '++'", "`y = y + 1;`"]),
    ("if", P + "    if (s > 0.0) { y = x; }\n}", 2, 5, ["'if' is not in .fz", "no control flow", "c ? a : b",
                                                          "where(c, a, b)"]),
    ("if_python", P + "    y = x if s > 0.0 else s;\n}", 2, 11, ["'if' is not in .fz", "c ? a : b"]),
    ("if_in_stage", "stage f(a: f32) -> f32 { if (a > 0.0) { return a; } return 0.0; }\n" + P + "    y = f(x);\n}",
     1, 26, ["'if' is not in .fz"]),
    ("for", P + "    for (i = 0; i < 3; i = i + 1) { y = x; }\n}", 2, 5, ["'for' is not in .fz", "repeat N { ... }"]),
    ("for_python", P + "    for i in 3 { y = x; }\n}", 2, 5, ["'for' is not in .fz", "repeat N"]),
    ("while", P + "    while (k > 0) { y = x; }\n}", 2, 5, ["'while' is not in .fz", "repeat N"]),
    ("let_in_pipeline", P + "    let t = x * s;\n    y = t;\n}", 2, 5,
     ["no 'let' in a pipeline", "write `t = ...;`"]),
    ("return_in_pipeline", P + "    return x * s;\n}", 2, 5, ["a pipeline has no 'return'", "assign its declared outputs"]),
    ("repeat_in_stage", "stage f(a: f32) -> f32 { repeat 3 { let b = a; } return a; }\n" + P + "    y = f(x);\n}",
     1, 26, ["'repeat' is only allowed in a pipeline"]),
    ("default_value", "pipeline p(x: f32[n], eps: f32 = 1e-5) -> (y: f32[n]) { y = x + eps; }", 1, 32,
     ["a parameter cannot have a default value", "pass 'eps' at call time"]),
    ("default_value_array", "pipeline p(x: f32[n] = 0.0) -> (y: f32[n]) { y = x; }", 1, 22,
     ["cannot have a default value", "pass 'x'"]),
    ("default_value_stage", "stage f(a: f32, b: f32 = 2.0) -> f32 { return a * b; }\n" + P + "    y = f(x, s);\n}",
     1, 24, ["a parameter cannot have a default value", "'b'"]),
    ("default_value_output", "pipeline p(x: f32[n]) -> (y: f32[n] = 0.0) { y = x; }", 1, 37,
     ["an output cannot have a default value"]),
    ("keyword_argument", STAGE2 + P + "    y = g(x, s=2.0);\n}", 3, 14,
     ["no keyword arguments", "pass the arguments of 'g' in order", "drop 's='"]),
    ("keyword_argument_first", STAGE2 + P + "    y = g(a = x, s);\n}", 3, 11, ["no keyword arguments"]),
    ("keyword_argument_builtin", P + "    y = max(x, s=0.0);\n}", 2, 16, ["no keyword arguments", "'max'"]),
    ("inout_twice", "pipeline p(inout inout x: f32[n]) { x = x; }", 1, 18, ["'inout' is written twice"]),
    ("inout_as_name", "pipeline p(inout: f32[n]) -> (y: f32[n]) { y = inout; }", 1, 12,
     ["'inout' is a keyword", "another name"]),
    ("inout_stage_result", "stage f(a: f32) -> inout f32 { return a; }\n" + P + "    y = f(x);\n}", 1, 20,
     ["'inout' is for a pipeline's array parameters"]),
    # unknown functions: what the language lacks, or the builtin meant
    ("sum", P + "    y = sum(x);\n}", 2, 9, ["unknown function 'sum'", "row_sum(x)", "[..., 1]"]),
    ("mean", P + "    y = x - mean(x);\n}", 2, 13, ["row_mean(x)"]),
    ("argmax", P + "    y = f32(argmax(x));\n}", 2, 13, ["'argmax' is a reduction .fz does not have", "row_max"]),
    ("prod", P + "    y = prod(x);\n}", 2, 9, ["'prod' is a reduction .fz does not have"]),
    ("rand", P + "    y = x * rand(x);\n}", 2, 13, ["no random number generation", "pass them in"]),
    ("randn", P + "    y = randn(x);\n}", 2, 9, ["no random number generation"]),
    ("max_of_one", P + "    y = max(x);\n}", 2, 9, ["max() takes 2 arguments, got 1", "row_max(x)"]),
    ("typo", P + "    y = sigmod(x);\n}", 2, 9, ["unknown function 'sigmod'; did you mean 'sigmoid'?"]),
    ("transposed", P + "    y = tahn(x);\n}", 2, 9, ["did you mean", "'tanh'"]),
    ("c_name", P + "    y = expf(x);\n}", 2, 9, ["did you mean 'exp'"]),
    ("numpy_name", P + "    y = maximum(x, s);\n}", 2, 9, ["unknown function 'maximum'; write 'max'"]),
    ("stage_typo", STAGE2 + P + "    y = gg(x, s);\n}", 3, 9, ["did you mean 'g'?"]),
    ("no_hint", P + "    y = qqqqqq(x);\n}", 2, 9, ["unknown function 'qqqqqq'"]),
]


def diagnostics(source: str) -> list[tuple[int, int, str]]:
    with pytest.raises(FzError) as info:
        check_source(Source("t.fz", source))
    return [(d.loc.line, d.loc.col, d.message) for d in info.value.diagnostics]


@pytest.mark.parametrize("name,source,line,col,fragments", CASES, ids=[c[0] for c in CASES])
def test_unsupported_syntax_says_what_to_write(name, source, line, col, fragments):
    found = diagnostics(source)
    assert any((ln, c) == (line, col) and all(f in m for f in fragments) for ln, c, m in found), found


def test_a_hint_only_replaces_the_generic_message_where_it_recognises_the_construct():
    (found,) = diagnostics(P + "    y = x +* s;\n}")
    assert found[:2] == (2, 12) and found[2].startswith("unexpected '*'")
    (found,) = diagnostics(P + "    y = x = s;\n}")
    assert found[:2] == (2, 11) and found[2] == "unexpected '='; expected ';'"


def test_the_expected_token_after_a_target_includes_the_equals_sign():
    (found,) = diagnostics(P + "    y x;\n}")
    assert found == (2, 7, "unexpected 'x'; expected one of ',', '='")


def test_the_cli_prints_the_hint_with_a_caret_and_no_internals(tmp_path, run_cli):
    path = tmp_path / "t.fz"
    path.write_text(P + "    y = x;\n    y += 1.0;\n}")
    code, _, err = run_cli("check", str(path))
    assert code == 1
    lines = err.splitlines()
    assert lines[0].endswith("t.fz:3:7: error: there is no '+=' in .fz (no compound assignment): write "
                             "`y = y + ...;`")
    assert lines[1] == "        y += 1.0;" and lines[2] == "          ^"
    assert "Traceback" not in err and "lark" not in err


@pytest.mark.parametrize("text", ["    y = c &&", "    y = x *", "    y = x >"])
def test_an_operator_before_the_end_of_the_file_is_not_taken_for_one_the_language_lacks(text):
    (found,) = diagnostics(P + text)
    assert "unexpected end of file" in found[2]
