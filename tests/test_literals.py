"""Literals (unit tier): an expression of literals alone is folded exactly and
only its value meets a type; a float literal is out of range only where it
rounds to infinity in that type; a cast or a store of a literal rounds it to
the type once; a literal operand of f16/bf16 arithmetic keeps f32 precision."""
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from fusec.errors import FzError, Source
from fusec.frontend import check_source
from fusec.frontend.literals import parse_float, round_to
from fusec.reference import run

FLT_MAX = float(np.finfo(np.float32).max)


def program(body: str, params: str, outputs: str):
    return check_source(Source("t.fz", f"pipeline p({params}) -> ({outputs}) {{\n{body}\n}}"))


def constants(prog) -> list:
    """The constants of the pipeline's statements, in order."""
    return [(i.type.name, i.attr) for stmt in prog.pipelines[0].body for i in stmt.body.instrs if i.op == "const"]


def error(body: str, params: str, outputs: str) -> tuple[int, int, str]:
    with pytest.raises(FzError) as info:
        program(body, params, outputs)
    (d,) = info.value.diagnostics
    return d.loc.line, d.loc.col, d.message


# ---- integer literal expressions: folded exactly, their value checked
def test_an_integer_expression_is_checked_by_its_value_not_its_parts():
    assert constants(program("y = b + (200 - 100);", "b: i8[n]", "y: i8[n]")) == [("i8", 100)]
    assert error("y = b + (100 + 100);", "b: i8[n]", "y: i8[n]") == \
        (2, 10, "the literal expression's value 200 does not fit i8 (range -128 to 127)")


@pytest.mark.parametrize("expr,value", [("7 / -2", -3), ("-7 % 2", -1), ("7 % -2", 1), ("1 / 0", 0), ("5 % 0", 0),
                                        ("2 ** -1", 0), ("(-1) ** -3", -1), ("2 ** 62 * 2 - 1", 2 ** 63 - 1),
                                        ("0x7fffffffffffffff + 1 - 1", 2 ** 63 - 1)])
def test_integer_folding_follows_c(expr, value):
    assert constants(program(f"y = a + ({expr});", "a: i64[n]", "y: i64[n]")) == [("i64", value)]


def test_an_integer_expression_that_overflows_its_default_type_is_an_error():
    assert error("t = 100000 * 100000;\ny = x + f32(t);", "x: f32[n]", "y: f32[n]")[2] == \
        "the literal expression's value 10000000000 does not fit i32 (range -2147483648 to 2147483647)"
    assert "too large for any integer type" in error("y = a + 3 ** 10000;", "a: i64[n]", "y: i64[n]")[2]


def test_integer_literals_meeting_a_float_round_once_from_the_exact_value():
    # 1 / 2 stays integer (C); 2**24 + 1 as f32 is 2**24 (one rounding of the exact value)
    assert constants(program("y = x * (1 / 2) + (16777216 + 1);", "x: f32[n]", "y: f32[n]")) == \
        [("f32", 0.0), ("f32", 16777216.0)]


# ---- float literal expressions
def test_float_literal_expressions_are_exact_before_they_are_rounded():
    # 0.1 + 0.2 in f64 arithmetic is 0.30000000000000004; the exact sum rounds to 0.3
    assert constants(program("y = x + (0.1 + 0.2);", "x: f64[n]", "y: f64[n]")) == [("f64", 0.3)]
    # 1e300 / 1e290 is in range although 1e300 alone is not an f32
    assert constants(program("y = x * (1e300 / 1e290);", "x: f32[n]", "y: f32[n]")) == [("f32", 1e10)]


@pytest.mark.parametrize("expr,value", [("1.0 / 0.0", math.inf), ("-1.0 / 0.0", -math.inf), ("1.0 / -0.0", -math.inf),
                                        ("0.0 * -3.0", -0.0), ("-0.0 + 0.0", 0.0), ("-0.0 - 0.0", -0.0),
                                        ("-7.5 % 2.0", -1.5), ("-4.0 % 2.0", -0.0), ("inf - inf", math.nan),
                                        ("2.0 ** -2", 0.25), ("2.0 ** 0.5", math.sqrt(2.0)), ("1.0 % inf", 1.0)])
def test_float_folding_keeps_ieee_zeros_infinities_and_nan(expr, value):
    (const,) = constants(program(f"y = x + ({expr});", "x: f64[n]", "y: f64[n]"))
    assert const[0] == "f64"
    assert (math.isnan(value) and math.isnan(const[1])) or \
        (const[1] == value and math.copysign(1, const[1]) == math.copysign(1, value))


def test_flt_max_as_commonly_written_is_in_range():
    assert constants(program("y = x * 3.4028235e38;", "x: f32[n]", "y: f32[n]")) == [("f32", FLT_MAX)]
    assert constants(program("y = x * -3.40282356e38;", "x: f32[n]", "y: f32[n]")) == [("f32", -FLT_MAX)]
    line, col, message = error("y = x * 3.40282357e38;", "x: f32[n]", "y: f32[n]")  # past FLT_MAX + ulp/2
    assert (line, col) == (2, 9) and "float literal 3.40282357e38 is out of range for f32" in message
    assert "the largest f32 is 3.4028235e+38" in message


def test_f16_literal_operands_are_held_in_f32_and_stored_literals_must_fit_f16():
    assert constants(program("y = h * 70000.0;", "h: f16[n]", "y: f16[n]")) == [("f16", 70000.0)]
    assert error("y = h * 1e39;", "h: f16[n]", "y: f16[n]")[2].startswith(
        "float literal 1e39 is out of range for f16 arithmetic (done in f32)")
    line, col, message = error("y = 70000.0;", "h: f16[n]", "y: f16[n]")
    assert (line, col) == (2, 5) and "float literal 70000.0 is out of range for f16" in message
    assert "the largest f16 is 65504" in message
    assert constants(program("y = 65519.0;", "h: f16[n]", "y: f16[n]")) == [("f16", 65504.0)]


def test_float_literal_texts_beyond_every_type_are_located_errors():
    assert error("y = x * 1e999;", "x: f64[n]", "y: f64[n]") == \
        (2, 9, "float literal 1e999 is out of range for every float type")
    assert constants(program("y = x + 1e-400;", "x: f64[n]", "y: f64[n]")) == [("f64", 0.0)]  # underflows to 0


def test_a_literal_cannot_be_stored_as_bool():
    assert "a number cannot be used as bool" in error("y = 1;", "x: bool[n]", "y: bool[n]")[2]


# ---- casts of literals convert the exact value
@pytest.mark.parametrize("cast,value", [("f16(70000.0)", math.inf), ("bf16(0.1)", 0.10009765625),
                                        ("f16(0.1)", float(np.float16(0.1))), ("f32(1e39)", math.inf),
                                        ("f16(65519)", 65504.0), ("bf16(257)", 256.0), ("bf16(259)", 260.0)])
def test_a_cast_of_a_literal_to_a_float_type_rounds_it_once(cast, value):
    (const,) = constants(program(f"y = x + f32({cast});", "x: f32[n]", "y: f32[n]"))
    assert const[1] == value


@pytest.mark.parametrize("cast,value", [("i64(1e18)", 10 ** 18), ("i32(1e10)", 2 ** 31 - 1), ("i32(-1e10)", -2 ** 31),
                                        ("i32(nan)", 0), ("u8(-1.5)", 0), ("i32(-2.9)", -2), ("i64(-inf)", -2 ** 63)])
def test_a_cast_of_a_float_literal_to_an_integer_truncates_and_saturates_exactly(cast, value):
    (const,) = constants(program(f"y = a + {cast};", "a: i64[n]", "y: i64[n]"))
    assert const[1] == value


@pytest.mark.parametrize("cast,value", [("bool(0.0)", False), ("bool(-0.0)", False), ("bool(nan)", True),
                                        ("bool(3)", True), ("bool(0)", False)])
def test_a_cast_of_a_literal_to_bool_is_nonzero(cast, value):
    (const,) = constants(program(f"y = {cast};", "x: bool[n]", "y: bool[n]"))
    assert const[1] is value


# ---- stores of literals round them to f16/bf16 (reference run: what every backend computes)
def test_literals_stored_as_f16_or_bf16_are_rounded_and_operands_are_not():
    prog = check_source(Source("t.fz", """
stage half(a: f16) -> f16 { return a; }
stage lit() -> bf16 { return 0.1; }
pipeline p(x: f32[n], h: f16[n]) -> (a: f32[n], b: f32[n], c: f32[n], d: f16[n]) {
    a = x + f32(half(0.1));
    b = x + f32(lit());
    c = x + f32(f16(70000.0));
    d = h * 0.1;
}"""))
    a, b, c, d = run(prog, "p", np.zeros(2, np.float32), np.full(2, 3, np.float16))
    assert a[0] == float(np.float16(0.1)) and b[0] == 0.10009765625 and c[0] == np.inf
    assert d[0] == np.float16(np.float32(3) * np.float32(0.1))  # 0.1 in f32 precision, product rounded once
    assert d[0] != np.float16(3) * np.float16(0.1)


# ---- the rounding itself, against NumPy (f16, f32) and ml_dtypes from f32 values (bf16)
def test_round_to_agrees_with_numpy_on_random_values():
    rng = np.random.default_rng(7)
    values = rng.standard_normal(3000) * 2.0 ** rng.integers(-160, 140, 3000)
    with np.errstate(over="ignore"):
        for x in values:
            assert round_to(Fraction(x), "f16") == float(np.float16(x))
            assert round_to(Fraction(x), "f32") == float(np.float32(x))
            x32 = float(np.float32(x))
            if math.isfinite(x32) and x32:
                assert round_to(Fraction(x32), "bf16") == float(np.float32(x32).astype(ml_dtypes.bfloat16))


def test_parse_float_is_exact():
    assert parse_float("0.1") == Fraction(1, 10)
    assert parse_float("1.5e-3") == Fraction(3, 2000)
    assert parse_float(".5") == Fraction(1, 2) and parse_float("2.") == 2
    assert parse_float("0." + "0" * 900 + "1e905") == 10 ** 4  # long texts: the exponent is normalised


def test_a_literal_beyond_f64_meeting_a_type_is_a_located_error_not_an_overflow():
    # found by the malformed-input fuzz: math.copysign converted the huge Fraction to float
    assert error("y = x + 1e309;", "x: f32[n]", "y: f32[n]")[2].startswith(
        "float literal 1e309 is out of range for f32")
    assert error("y = x + -1e309;", "x: f64[n]", "y: f64[n]")[2].startswith(
        "float literal -1e309 is out of range for f64")
    # exact: 10**309 is not an f64, but its remainder by 7 is
    assert constants(program("y = x + (1e309 % 7.0);", "x: f64[n]", "y: f64[n]")) == [("f64", float(10 ** 309 % 7))]
