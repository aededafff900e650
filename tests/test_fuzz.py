"""Property tests of the front end: random well-formed programs check (and run
through the reference), and random mutations of the examples fail, if at all,
only with fusec's own error type."""
import numpy as np
from helpers import EXAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusec.errors import FzError, Source
from fusec.frontend import check_source
from fusec.reference import run

FLOAT_FUNCS = ["exp", "tanh", "sigmoid", "sqrt", "abs", "sin", "log1p", "floor", "erf"]
FLOAT_LEAVES = st.sampled_from(["x", "y", "s", "1.5", "2", "pi", "f32(k)", "0.25"])


def float_exprs():
    return st.recursive(
        FLOAT_LEAVES,
        lambda sub: st.one_of(
            st.tuples(sub, st.sampled_from(["+", "-", "*", "/"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(st.sampled_from(FLOAT_FUNCS), sub).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(st.sampled_from(["min", "max", "atan2"]), sub, sub).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
            st.tuples(sub, st.sampled_from(["<", ">=", "=="]), sub, sub, sub)
              .map(lambda t: f"({t[0]} {t[1]} {t[2]} ? {t[3]} : {t[4]})"),
            sub.map(lambda e: f"-{e}"),
        ),
        max_leaves=12,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(float_exprs(), min_size=1, max_size=4))
def test_random_well_formed_programs_check_and_run(exprs):
    lines = [f"    t{i} = {e};" for i, e in enumerate(exprs)]
    lines.append("    y2 = " + " + ".join(f"t{i}" for i in range(len(exprs))) + ";")
    source = ("stage helper(a: f32, b: f32) -> f32 { let c = a * b; return c + a; }\n"
              "pipeline p(x: f32[n], y: f32[n], k: i32[n], s: f32) -> (out: f32[n]) {\n"
              + "\n".join(lines) + "\n    out = helper(y2, s);\n}\n")
    program = check_source(Source("gen.fz", source))
    n = 5
    rng = np.random.default_rng(0)
    out = run(program, "p", rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32),
              np.arange(n, dtype=np.int32), 0.5)
    assert out.shape == (n,) and out.dtype == np.float32


TEXTS = [path.read_text() for path in EXAMPLES]
TOKENS = list("(){}[];:,=+-*/%<>!?&|.#") + ["->", "**", "&&", "||", "stage", "pipeline", "let", "return",
                                            "repeat", "inout", "f16", "i8", "x", "1e9", "0x", "\n", "\u00e9", "\x00"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(TEXTS))), st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 8),
                                                              st.sampled_from(TOKENS)), min_size=1, max_size=4))
def test_mutated_examples_fail_only_with_fz_errors(which, edits):
    text = TEXTS[which]
    for pos, delete, token in edits:
        pos %= len(text) + 1
        text = text[:pos] + token + text[pos + delete:]
    try:
        check_source(Source("mut.fz", text))
    except FzError as err:
        assert all(d.loc.line >= 0 for d in err.diagnostics)
        assert "mut.fz" in str(err)
