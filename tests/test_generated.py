"""Generated programs (`generator.py`), unit tier.

Every program goes through the front end (a valid one checks; one with a deliberate mistake raises
located errors, one on the mistake's line), and every accepted one through the NumPy reference at
each size profile and through both compile forms and the persistent one; every tenth through the
CLI. The seeds are fixed, so CI is reproducible: FUSEC_GEN_SEED (default 0) and FUSEC_GEN_COUNT
(default 650: about 550 valid) pick others. The rest of the file tests the generator and the oracle themselves.
"""
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from generator import ALL_TYPES, BUILTIN_NAMES, MISTAKES, cast_value, generate, round_to
from helpers import (
    CLI_VARIANTS,
    GUARD,
    PROGRAMS,
    assert_agrees,
    assert_located,
    call_guarded,
    check_generated,
    check_generated_cli,
    check_generated_compiles,
    check_generated_reference,
    copy_args,
    ulp_distance,
)

from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import FzError, Source
from fusec.frontend import check_source

SEED = int(os.environ.get("FUSEC_GEN_SEED", "0"))
COUNT = int(os.environ.get("FUSEC_GEN_COUNT", "650"))


@pytest.mark.parametrize("seed", range(SEED, SEED + COUNT))
def test_generated_program(seed):
    program = generate(seed)
    checked = check_generated(program)
    if checked is None:
        return
    check_generated_reference(program, checked)
    check_generated_compiles(program, checked)
    if seed % 10 == 0:
        check_generated_cli(program, [CLI_VARIANTS[seed // 10 % len(CLI_VARIANTS)]])


NOISE = list("(){}[];:,=+-*/%<>!?&|.#") + ["->", "**", "&&", "||", "stage", "pipeline", "let", "return", "repeat",
                                            "inout", "f16", "i8", "x", "1e9", "0x", "1", "1.5", "\n", "\u00e9", "\x00"]


def test_random_edits_fail_only_with_located_errors():
    """Random token edits of the examples and of generated programs: each checks (and then compiles
    both ways) or raises an FzError whose every diagnostic is located and free of internals."""
    rng = random.Random(SEED)
    texts = [path.read_text() for path in PROGRAMS] + [generate(s).source for s in range(SEED, SEED + 40)]
    for _ in range(400):
        text = rng.choice(texts)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randint(0, len(text))
            text = text[:pos] + rng.choice(NOISE) + text[pos + rng.randint(0, 8):]
        try:
            program = check_source(Source("noise.fz", text))
            for p in program.pipelines:
                for fuse in (True, False):
                    compile_pipeline(program, p.name, CompileOptions(fuse=fuse))
        except FzError as err:
            assert_located(err, text)


# ---- the generator


def test_the_generator_is_deterministic():
    for seed in (3, 141, 2024):
        a, b = generate(seed), generate(seed)
        assert a.source == b.source and a.tolerance == b.tolerance and a.mistake == b.mistake
        sizes = a.sizes("wide", seed=1)
        assert sizes == b.sizes("wide", seed=1)
        for x, y in zip(a.arguments(sizes, seed=1), b.arguments(sizes, seed=1)):
            assert np.array_equal(x, y, equal_nan=True) if isinstance(x, np.ndarray) else x == y or x != x


def test_a_seed_gives_the_same_program_in_every_process():
    """No choice depends on the order of a set (Python salts string hashes per process)."""
    code = ("import hashlib, sys; sys.path.insert(0, sys.argv[1]); import generator; "
            "print(hashlib.sha1(''.join(generator.generate(s).source for s in range(150)).encode()).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONHASHSEED=str(salt)), check=True).stdout for salt in (1, 2)}
    assert len(digests) == 1


def test_the_generator_writes_what_users_write():
    """Over CI's seeds, every type, builtin, operator, literal form, statement kind and mistake occurs."""
    programs = [generate(seed) for seed in range(SEED, SEED + COUNT)]
    text = "\n".join(p.source for p in programs)
    features = set().union(*(p.features for p in programs))
    assert {"stage", "let", "named_results", "multi_target", "inout", "repeat", "nested_repeat", "overwrite",
            "scalar_only", "stage_call", "literal_output", "read_after_repeat_only"} <= features
    declared = {t for p in programs for q in p.params + p.outputs for t in [q.type]}
    assert declared == set(ALL_TYPES)
    assert {p.role for prog in programs for p in prog.params} == {"in", "inout", "scalar", "count"}
    for name in sorted(BUILTIN_NAMES) + [f"{t}(" for t in ALL_TYPES]:
        assert re.search(rf"\b{re.escape(name)}", text), name
    for op in ("+", "-", "*", "/", "%", "**", "<", "<=", ">", ">=", "==", "!=", "&&", "||", "!", "?"):
        assert f" {op} " in text or f"{op}(" in text or (op == "!" and "!" in text), op
    for form in (r"\b0[xX][0-9a-fA-F]+\b", r"\b0\d+\b", r"\d[eE][+-]?\d", r"[^\w.]\.\d", r"\d\.[^\d]",
                 r"\[\w+, 0*1\]|\[0*1\b", r"\bpi\b", r"\binf\b", r"\bnan\b", r"repeat 0\b", r"repeat 0*1\b",
                 r"repeat [a-z]", r"^\s*(#|//)"):
        assert re.search(form, text, re.M), form
    assert 0.75 < sum(p.valid for p in programs) / len(programs) < 0.95
    assert {generate(seed, invalid=1).mistake for seed in range(300)} == set(MISTAKES)


def test_rank_and_sizes():
    """Ranks 1 to 3, and every named dim its own size: small, or beyond one block and not a
    multiple of the vector width."""
    programs = [generate(seed, invalid=0) for seed in range(200)]
    assert {len(q.dims) for p in programs for q in p.params if q.dims} == {1, 2, 3}
    for p in programs:
        for profile in ("small", "wide"):
            sizes = p.sizes(profile)
            inner = [q.dims[-1] for q in p.params if q.dims and isinstance(q.dims[-1], str)]
            if profile == "wide" and inner:
                assert sizes[inner[0]] > 256 and sizes[inner[0]] % 4
            own = [size for name, size in sizes.items() if name not in p.aliases]  # an alias shares its dim's size
            assert len(own) == len(set(own)) or len(own) > 4
            assert all(sizes[alias] == sizes[dim] for alias, dim in p.aliases.items())


def test_arguments_are_varied():
    """Never all zeros; negative values; now and then NaN, inf, a denormal, a huge value."""
    seen = set()
    for seed in range(300):
        p = generate(seed, invalid=0)
        for q, a in zip(p.params, p.arguments(p.sizes("wide"))):
            if not isinstance(a, np.ndarray):
                continue
            assert a.any() or a.dtype == bool and a.size == 1, (seed, q)
            if a.dtype.kind == "i":
                seen.add("negative int") if (a < 0).any() else None
            elif a.dtype.kind != "b" and a.dtype.kind != "u":
                f = a.astype(np.float64)
                tiny = np.finfo(np.float16 if a.dtype == np.float16 else np.float32).tiny
                for what, mask in (("nan", np.isnan(f)), ("inf", np.isinf(f)), ("negative", f < 0),
                                   ("denormal", (f != 0) & (np.abs(f) < tiny)), ("huge", np.abs(f) > 1e4)):
                    if mask.any():
                        seen.add(what)
    assert seen == {"negative int", "nan", "inf", "negative", "denormal", "huge"}


def test_round_to_rounds_once_to_nearest_even():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.integers(-45, 39, 2000),
                             [65504.0, 65520.0, 65519.99, 2.0 ** -25, 2.0 ** -24 * 1.5, 3.4028235e38]])
    with np.errstate(over="ignore"):
        for v in values:
            assert round_to(float(v), "f32") == float(np.float32(v))
            assert round_to(float(v), "f16") == float(np.float16(v))
    # bf16 from f64 and from 64-bit integers: one rounding (through f32 would give 1.0 and 2**63)
    assert round_to(1.0 + 2.0 ** -8 + 2.0 ** -30, "bf16") == 1.0078125
    assert round_to(2 ** 63 + 2 ** 55 + 1, "bf16") == float(2 ** 63 + 2 ** 56)
    assert round_to(0.1, "bf16") == float(ml_dtypes.bfloat16(0.1))
    assert round_to(70000.0, "f16") == math.inf and round_to(-1e39, "f32") == -math.inf


def test_cast_value_follows_the_readme():
    assert cast_value(300.7, "f32", "i8") == 127 and cast_value(-1.5, "f32", "u8") == 0
    assert cast_value(math.nan, "f64", "i32") == 0 and cast_value(-math.inf, "f32", "i64") == -2 ** 63
    assert cast_value(300, "i32", "i8") == 44 and cast_value(-1, "i8", "u8") == 255
    assert cast_value(math.nan, "f32", "bool") is True and cast_value(True, "bool", "f16") == 1.0
    assert cast_value(2 ** 24 + 1, "i32", "f32") == 2.0 ** 24


# ---- the oracle


def test_ulp_distance():
    f32 = np.array([1.0, 0.0, np.nan, np.nan, np.inf, 1e-45], np.float32)
    g32 = np.array([np.nextafter(np.float32(1), np.float32(2)), -0.0, np.nan, 1.0, np.finfo(np.float32).max, -1e-45],
                   np.float32)
    assert ulp_distance(f32, g32).tolist() == [1, 0, 0, math.inf, 1, 2]
    bf = np.array([1.0, 2.0], ml_dtypes.bfloat16)
    assert ulp_distance(bf, np.array([1.0078125, 2.0], ml_dtypes.bfloat16)).tolist() == [1, 0]


class _Fake:
    source = "pipeline fake(...)"
    tolerance = {"y": 0, "z": 6}


def test_assert_agrees_holds_exact_outputs_to_the_bit_and_others_to_their_tolerance():
    expected = {"y": np.linspace(-3, 3, 50, dtype=np.float32), "z": np.linspace(1, 2, 50, dtype=np.float32),
                "k": np.arange(50, dtype=np.int16)}
    quiet = {name: np.zeros(50) for name in expected}

    def agree(got, sensitivity=quiet):
        assert_agrees(_Fake(), got, expected, lambda: sensitivity, "test")
    agree({name: a.copy() for name, a in expected.items()})
    one_ulp = dict(expected, y=expected["y"].copy())
    one_ulp["y"][7] = np.nextafter(one_ulp["y"][7], np.float32(9))
    with pytest.raises(AssertionError, match="'y'.*tolerance 0 ulp"):
        agree(one_ulp)
    within = dict(expected, z=(expected["z"].view(np.int32) + 6).view(np.float32))
    agree(within)
    beyond = dict(expected, z=(expected["z"].view(np.int32) + 7).view(np.float32))
    with pytest.raises(AssertionError, match="'z'"):
        agree(beyond)
    agree(beyond, dict(quiet, z=np.full(50, 7.0)))  # ill-conditioned everywhere: excused
    with pytest.raises(AssertionError, match="'k'"):
        agree(dict(expected, k=expected["k"] + (np.arange(50) == 3)))


def test_call_guarded_catches_a_write_past_an_array():
    program = generate(5, invalid=0)
    sizes = program.sizes("small")
    args = program.arguments(sizes)

    def stray(*call_args, **_):
        array = next(a for a in call_args if isinstance(a, np.ndarray))
        np.lib.stride_tricks.as_strided(array.reshape(-1), (array.size + 1,))[-1] = array.reshape(-1)[0] + 1
    with pytest.raises(AssertionError, match="out of bounds"):
        call_guarded(program, stray, args, sizes, own_outputs=False)
    assert GUARD >= 1


def test_assert_elementwise_sees_rows_that_moved(monkeypatch):
    """A reference that mixed rows up (as a broadcasting mistake would) fails the cut-rows check."""
    import helpers
    for seed in range(200):  # a program with an exact output whose rows differ
        program = generate(seed, invalid=0)
        try:
            checked = check_source(Source(program.name, program.source))
        except Exception:  # a compiler bug that other tests report: this one tests the oracle
            continue
        sizes = program.sizes("small")
        args = program.arguments(sizes)
        if program.reads_unassigned(args) or any(p.role == "inout" for p in program.params):
            continue
        full = helpers.results_by_name(program, helpers.reference(checked, program.pipeline, *copy_args(args)), args)
        if any(program.tolerance.get(o.name, 0) == 0 and full[o.name].dtype.kind in "iu" and full[o.name].ndim > 1
               and len(np.unique(full[o.name])) > 2 for o in program.outputs):
            break
    honest = helpers.reference

    def shuffled(*call, **kwargs):
        result = honest(*call, **kwargs)
        return tuple(np.flip(r) for r in result) if isinstance(result, tuple) else np.flip(result)
    monkeypatch.setattr(helpers, "reference", shuffled)
    with pytest.raises(AssertionError, match="first"):
        helpers.assert_elementwise(program, checked, sizes, args, full)


def test_the_shadows_move_inexact_outputs_only():
    """Each site's perturbation reaches the outputs that depend on it (the factor is not lost to
    rounding), and never an exact output."""
    from helpers import reference, results_by_name, sensitivity
    moved = still = 0
    for seed in range(60):
        program = generate(seed, invalid=0)
        try:
            checked = check_source(Source(program.name, program.source))
        except Exception:  # a compiler bug that other tests report: this one tests the oracle
            continue
        args = program.arguments(program.sizes("small"))
        if program.reads_unassigned(args) or not program.sites:
            continue
        ref_args = copy_args(args)
        expected = results_by_name(program, reference(checked, program.pipeline, *ref_args), ref_args)
        for name, s in sensitivity(program, args, expected).items():
            if program.tolerance.get(name, 0) == 0:
                assert not s.any(), (seed, name)
            elif np.isfinite(expected[name].astype(float)).any():
                moved += bool(s.any())
                still += not s.any()
    assert moved > 3 * still


def test_every_site_has_its_own_shadow():
    program = next(p for p in map(lambda s: generate(s, invalid=0), range(100)) if p.sites >= 3)
    shadows = [program.shadow(site) for site in range(program.sites)]
    assert len(set(shadows)) == program.sites and program.source not in shadows
    for text in shadows:  # one perturbation each: `* (1 + its budget)`
        assert text.count(" * 1.") == program.source.count(" * 1.") + 1
