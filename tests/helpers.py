"""Shared by the test tiers: the programs to compile, random arguments for them, and the checks
of generated programs (`generator.py`): the front end's contract, the reference, the compiles,
the differential oracle against the sim, and worker processes that run them."""
import functools
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from generator import generate

from fusec.compiler import CompileOptions, compile_pipeline
from fusec.errors import Source
from fusec.frontend import check_source
from fusec.reference import run as reference

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.fz"))
PROGRAMS = EXAMPLES + sorted((ROOT / "tests" / "programs").glob("*.fz"))

# The test tiers beyond the unit tier: a file test_*_TIER.py holds that tier's tests.
TIERS = ("nvcc", "sim", "gpu")


def tier_of(path) -> str | None:
    """The tier a test file's name says (None: the unit tier)."""
    last = Path(path).stem.rsplit("_", 1)[-1]
    return last if last in TIERS else None


def load_program(path: Path):
    """A program named by its path relative to the repository, so emitted headers are stable."""
    return check_source(Source(path.relative_to(ROOT).as_posix(), path.read_text()))


def pipelines():
    """(id, program, pipeline name) for every pipeline of every program (checked once a process)."""
    return list(_pipelines())


@functools.cache
def _pipelines() -> tuple:
    out = []
    for path in PROGRAMS:
        program = load_program(path)
        out += [(f"{path.stem}:{p.name}", program, p.name) for p in program.pipelines]
    return tuple(out)


@functools.cache
def loaded_as_jit_does(program):
    """`program` (of `load_program`) as `fusec.jit(path)` loads it: named by its absolute path. A
    module's first line names its source, and the sim's host builds are keyed on the module's text:
    a test that runs a program on the sim this way builds the modules that tests jitting the path
    build, instead of g++ building them again."""
    from fusec.frontend import load
    return load(str(ROOT / program.source.name))


def compiled(program, name: str, options: CompileOptions = CompileOptions()):
    """`compile_pipeline(program, name, options)`, kept for the rest of the process, its
    PlanError too (a form the pipeline cannot take). Several test files compile the programs in
    the same forms, and fusing fusion_hurts alone takes seconds (the fusion pass keeps only its
    last few searches). For tests that change nothing the compiler reads (no monkeypatching)."""
    key = (program, name, options)
    if key not in _compiled:
        try:
            _compiled[key] = compile_pipeline(program, name, options)
        except ValueError as exc:  # PlanError
            _compiled[key] = exc
    found = _compiled[key]
    if isinstance(found, Exception):
        raise found.with_traceback(None)
    return found


_compiled: dict = {}


@functools.cache
def _multi_tensor() -> tuple:
    found = {}
    # fusion_hurts last: the fusion pass still remembers its search when its tests begin (conftest.py)
    for ident, program, name in sorted(pipelines(), key=lambda p: "fusion_hurts" in p[0]):
        try:
            found[ident] = compiled(program, name, CompileOptions(multi_tensor=True))
        except ValueError:
            pass
    return tuple((ident, program, name, found[ident]) for ident, program, name in pipelines() if ident in found)


def multi_tensor_pipelines():
    """(id, program, pipeline name, compiled) for every pipeline foreach can run (its multi-tensor
    compile succeeds: one elementwise kernel, no broadcast); two test files collect over them."""
    return list(_multi_tensor())


def dim_sizes(pipeline, size: int) -> dict:
    """A size for each named dim: the innermost dims get `size`, outer ones 3."""
    inner = {p.shape[-1] for p in pipeline.params if p.shape}
    names = {d for p in pipeline.params if p.shape for d in p.shape if isinstance(d, str)}
    return {d: (size if d in inner else 3) for d in names}


def random_args(pipeline, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    dims = dim_sizes(pipeline, size)
    args = []
    for p in pipeline.params:
        if p.shape is None:
            args.append(3 if p.type.is_int else True if p.type.is_bool else 0.7)
            continue
        shape = tuple(d if isinstance(d, int) else dims[d] for d in p.shape)
        dtype = p.type.numpy_dtype
        if p.type.is_bool:
            args.append(rng.random(shape) < 0.5)
        elif p.type.is_int:
            lo = -50 if p.type.kind == "int" else 0
            args.append(rng.integers(lo, 50, shape).astype(dtype))
        else:
            args.append(rng.standard_normal(shape).astype(np.float32).astype(dtype))
    return args



def python_process(code: str, cache_dir, **env) -> subprocess.CompletedProcess:
    """Runs `code` in a new Python process with its own fusec cache folder."""
    environment = dict(os.environ, FUSEC_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(sys.path), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, cwd=ROOT,
                          timeout=120)


# A two-file C++ library for the host compiler's tests: add(2, 3) is 1005.
ADD = {"add.cpp": '#include "add.h"\nextern "C" int add(int a, int b) { return a + b + OFFSET; }\n',
       "add.h": "#define OFFSET 1000\n"}


# Ways a cached file is found damaged (each is rebuilt, never trusted).
DAMAGE = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "empty": lambda path: path.write_bytes(b""),
    "one_bit_flipped": lambda path: path.write_bytes(flip(path.read_bytes())),
    "digest_missing": lambda path: path.with_name(path.name + ".sha256").unlink(),
    "garbage_digest": lambda path: path.with_name(path.name + ".sha256").write_bytes(b"\xff" * 70),
    "a_folder": lambda path: (path.unlink(), path.mkdir()),
}


def flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1:]

def gelu(x):
    """GELU's tanh approximation, written as NumPy code (a function to trace)."""
    return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def tolerance(dtype) -> dict:
    """How close a backend's floats must be to the reference (stated in the README)."""
    dtype = np.dtype(dtype)
    if dtype == np.dtype(ml_dtypes.bfloat16):
        return {"rtol": 1.6e-2, "atol": 1e-2}
    if dtype == np.float16:
        return {"rtol": 2e-3, "atol": 1e-3}
    if dtype == np.float32:
        return {"rtol": 2e-5, "atol": 1e-6}
    return {"rtol": 1e-12, "atol": 1e-14}


def assert_matches(actual, expected):
    """Exact for integers and bools; the stated tolerance for floats (NaN equals NaN)."""
    actual = actual if isinstance(actual, tuple) else (actual,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        a, e = np.asarray(a), np.asarray(e)
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, e)
        else:
            np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), equal_nan=True,
                                       **tolerance(a.dtype))


def assert_runs_like_reference(f, program, name: str, args: list) -> None:
    """f(*args) equals the NumPy reference run on copies of args: its outputs, and
    its inout arrays after the call (the stated tolerances)."""
    expected_args = copy_args(args)
    expected = reference(program, name, *expected_args)
    actual = f(*args)
    if expected is not None:
        assert_matches(actual, expected)
    for p, a, e in zip(program.pipeline(name).params, args, expected_args):
        if p.role == "inout":
            assert_matches(a, e)


# ---- Generated programs (tests/generator.py): the front end's contract and the differential oracle

# What a located error may never show: Python's insides.
INTERNALS = ("Traceback", "fusec/", ".py\"", "Error:", "KeyError", "TypeError", "ValueError", "IndexError",
             "AttributeError", "AssertionError", "RecursionError", "NoneType", "UnexpectedToken",
             "UnexpectedCharacters", "VisitError", "lark.")


def check_generated(program):
    """The front end on a generated program: a valid one checks; an invalid one raises an FzError
    whose every diagnostic is located and free of internals, one of them on the mistake's line.
    Returns the checked program, or None for an invalid one."""
    from fusec.errors import FzError
    try:
        checked = check_source(Source(program.name, program.source))
    except FzError as err:
        assert_located(err, program.source)
        assert not program.valid or program.mistake, f"a valid program was rejected:\n{err}\n{program.source}"
        lines = {d.loc.line for d in err.diagnostics}
        assert lines & program.error_lines, (f"{program.mistake}: expected an error on line "
                                             f"{sorted(program.error_lines)}, got\n{err}\n{program.source}")
        return None
    assert program.valid, f"mistake {program.mistake!r} (line {sorted(program.error_lines)}) was accepted:\n" \
                          f"{program.source}"
    return checked


def assert_located(err, source: str) -> None:
    """Every diagnostic of an FzError has a line and column, and no message shows Python's insides."""
    text = str(err)
    assert err.diagnostics, text
    for d in err.diagnostics:
        assert d.loc.line >= 1 and d.loc.col >= 1, f"an error without a location: {d.message}\n{source}"
    for word in INTERNALS:
        assert word not in text, f"{word!r} in an error message:\n{text}"


def ordinal(a: np.ndarray) -> np.ndarray:
    """Floats as integers in the order of their values (adjacent floats differ by 1; -0 == +0)."""
    bits = {2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]
    i = np.ascontiguousarray(a).view(bits).astype(np.int64)
    return np.where(i < 0, -(i & np.int64(np.iinfo(bits).max)), i)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in ulps of their (float) type: 0 for two NaNs, inf for a NaN and a number."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    nan_a, nan_b = np.isnan(a.astype(np.float64)), np.isnan(b.astype(np.float64))
    d = np.abs(ordinal(a) - ordinal(b)).astype(np.float64)
    d[nan_a & nan_b] = 0
    d[nan_a ^ nan_b] = np.inf
    return d


def results_by_name(program, result, args) -> dict:
    """A call's outputs and its inout arrays after it, by name."""
    outs = result if isinstance(result, tuple) else () if result is None else (result,)
    named = {o.name: np.asarray(v) for o, v in zip(program.outputs, outs)}
    named.update({p.name: a for p, a in zip(program.params, args) if p.role == "inout"})
    return named


def assert_bitwise_equal(got: dict, expected: dict, what: str, source: str = "", loose: bool = False) -> None:
    """Exactly the same bits (NaN payloads and the sign of zero included). `loose`: what the README
    leaves open between backends and forms ("NaN" results are some NaN; of +0 and -0 "min, max, clamp"
    may return either) is not compared: any two NaNs are equal, and in a float output +0 and -0."""
    assert got.keys() == expected.keys()
    for name, e in expected.items():
        g = got[name]
        assert g.dtype == e.dtype and g.shape == e.shape, (name, g.dtype, e.dtype, g.shape, e.shape)
        same = (np.ascontiguousarray(g).view(np.uint8) == np.ascontiguousarray(e).view(np.uint8)).reshape(
            g.shape + (-1,)).all(axis=-1)
        if loose and e.dtype.kind not in "biu":
            g64, e64 = g.astype(np.float64), e.astype(np.float64)
            same |= (np.isnan(g64) & np.isnan(e64)) | ((g64 == 0) & (e64 == 0))
        if not same.all():
            where = np.argwhere(~same)[:3].tolist()
            raise AssertionError(f"{what}: '{name}' differs at {where}: {g[tuple(where[0])]!r} vs "
                                 f"{e[tuple(where[0])]!r}\n{source}")


def assert_agrees(program, got: dict, expected: dict, sensitivity, what: str, stats: dict | None = None) -> None:
    """A compiled form against the reference: integers and bools exactly; floats within the
    program's tolerance in ulps (0 where no math function is involved), except elements the
    shadows show are ill-conditioned: one site's error budget moves them by more than the
    tolerance (`sensitivity()`: output -> the sum over sites of that movement, in ulps).
    `stats`, if given, counts float elements compared, beyond tolerance, and excused."""
    stats = {} if stats is None else stats
    for name, e in expected.items():
        g = got[name]
        assert g.dtype == e.dtype and g.shape == e.shape, (name, g.dtype, e.dtype, g.shape, e.shape)
        if e.dtype.kind in "biu":
            bad = g != e
            assert not bad.any(), _mismatch(what, name, g, e, bad, program)
            continue
        bound = program.tolerance[name]
        far = ulp_distance(g, e) > bound
        stats["elements"] = stats.get("elements", 0) + far.size
        stats["beyond"] = stats.get("beyond", 0) + int(far.sum())
        if far.any() and bound > 0:  # an exact output has no sites: nothing excuses it
            excused = far & (sensitivity()[name] > bound)
            stats["excused"] = stats.get("excused", 0) + int(excused.sum())
            far &= ~excused
        assert not far.any(), _mismatch(what, name, g, e, far, program, f" (tolerance {bound} ulp)")


def _mismatch(what, name, g, e, bad, program, detail="") -> str:
    index = tuple(np.argwhere(bad)[0])
    return (f"{what}: '{name}'{detail} differs at {bad.sum()} of {bad.size} elements, first {list(index)}: "
            f"{g[index]!r} vs reference {e[index]!r}\n{program.source}")


def sensitivity(program, args, expected: dict):
    """Output -> per element, the sum over the program's sites of how far (in ulps) perturbing
    that site by its error budget moves the reference's result (the shadows of `generator.py`)."""
    total = {name: np.zeros(e.shape) for name, e in expected.items()}
    for site in range(program.sites):
        shadow = check_source(Source(program.name, program.shadow(site)))
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        moved = results_by_name(program, reference(shadow, program.pipeline, *copies), copies)
        for name, e in expected.items():
            if e.dtype.kind == "f" or e.dtype.name == "bfloat16":
                total[name] += ulp_distance(moved[name], e)
    return total


SIZE_PROFILES = ("small", "wide", "vector")  # see `Program.sizes`


def copy_args(args: list) -> list:
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def check_generated_reference(program, checked) -> None:
    """The reference runs a checked program at every size profile: outputs of the declared dtypes
    and shapes, constant outputs equal to the generator's own value, elementwise (`assert_elementwise`),
    and a call that would read an output no loop assigned (its count 0) refused with an ArgumentError."""
    from fusec.errors import ArgumentError
    for profile in SIZE_PROFILES:
        sizes = program.sizes(profile)
        args = program.arguments(sizes)
        if program.reads_unassigned(args):
            try:
                reference(checked, program.pipeline, *args)
            except ArgumentError:
                continue
            raise AssertionError(f"reads an output that a repeat with count 0 never assigned, "
                                 f"without an error:\n{program.source}")
        before = copy_args(args)
        got = results_by_name(program, reference(checked, program.pipeline, *args), args)
        for out in program.outputs:
            shape = tuple(d if isinstance(d, int) else sizes[d] for d in out.dims)
            assert got[out.name].dtype == numpy_dtype_of(out.type) and got[out.name].shape == shape, out
        assert_constants(program, got, "reference")
        if profile == "small":
            assert_elementwise(program, checked, sizes, before, got)


def assert_elementwise(program, checked, sizes: dict, args: list, full: dict) -> None:
    """The reference on every array cut to its first rows along one named dim gives the same rows
    of every exact output (a broadcasting or indexing mistake in the reference moves rows)."""
    dims = sorted({d for p in program.params if p.dims for d in p.dims
                   if isinstance(d, str) and d not in program.aliases and sizes[d] > 1})
    if not dims:
        return
    dim = dims[program.seed % len(dims)]
    cut_dims = {dim} | {alias for alias, d in program.aliases.items() if d == dim}

    def cut(array, decl_dims):
        return np.ascontiguousarray(array[tuple(slice(0, sizes[dim] - 1) if d in cut_dims else slice(None)
                                                for d in decl_dims)])
    cut_args = [cut(a, p.dims) if p.dims else a for p, a in zip(program.params, args)]
    got = results_by_name(program, reference(checked, program.pipeline, *cut_args), cut_args)
    decls = list(program.outputs) + [p for p in program.params if p.role == "inout"]
    exact = {d.name: d.dims for d in decls if program.tolerance.get(d.name, 0) == 0}
    assert_bitwise_equal({n: got[n] for n in exact}, {n: cut(full[n], dims_) for n, dims_ in exact.items()},
                         f"the reference on the first {sizes[dim] - 1} of {sizes[dim]} along '{dim}'", program.source)


def numpy_dtype_of(type_name: str) -> np.dtype:
    from fusec.types import BY_NAME
    return BY_NAME[type_name].numpy_dtype


def assert_constants(program, got: dict, what: str) -> None:
    """Outputs that are a cast of a literal hold the value the generator computed for it."""
    for name, value in program.constants.items():
        expected = np.asarray(value).astype(got[name].dtype)
        actual = got[name].astype(np.float64) if got[name].dtype.kind not in "biu" else got[name]
        wanted = expected.astype(np.float64) if expected.dtype.kind not in "biu" else expected
        assert np.array_equal(actual, np.broadcast_to(wanted, actual.shape), equal_nan=actual.dtype.kind == "f"), (
            f"{what}: constant output '{name}' is {got[name].flat[0]!r}, expected {expected!r}\n{program.source}")


def check_generated_compiles(program, checked) -> None:
    """Both forms and the persistent one compile without an internal error (a repeat inside a
    repeat: a located FzError, as code generation for it does not exist yet)."""
    from fusec.compiler import CompileOptions, compile_pipeline
    from fusec.errors import FzError
    for options in (CompileOptions(fuse=True), CompileOptions(fuse=False), CompileOptions(persistent=True)):
        try:
            compiled = compile_pipeline(checked, program.pipeline, options)
        except FzError as err:
            assert not program.compiles, f"{options}: {err}\n{program.source}"
            assert_located(err, program.source)
            continue
        assert program.compiles, f"{options}: a repeat inside a repeat compiled\n{program.source}"
        assert "__global__" in compiled.cuda or not compiled.interface.kernels


SIM_FORMS = {"fused": {"fuse": True}, "unfused": {"fuse": False}, "persistent": {"fuse": True, "persistent": True}}


def check_generated_sim(program, checked, pipelines: dict, stats: dict | None = None) -> None:
    """Every sim form (`pipelines`: form -> a JitPipeline on the sim) against the others bit for
    bit (but NaN's bits and the sign of a float zero: `assert_bitwise_equal`'s `loose`), and against
    the reference (`assert_agrees`), at every size profile."""
    from fusec.errors import ArgumentError
    for profile in SIZE_PROFILES:
        args = program.arguments(program.sizes(profile))
        if program.reads_unassigned(args):
            for form, pipeline in pipelines.items():
                try:
                    pipeline(*copy_args(args))
                except ArgumentError:
                    continue
                raise AssertionError(f"sim {form}: reads an output that a repeat with count 0 never assigned, "
                                     f"without an error:\n{program.source}")
            continue
        ref_args = copy_args(args)
        expected = results_by_name(program, reference(checked, program.pipeline, *ref_args), ref_args)
        sizes = program.sizes(profile)
        forms = {form: call_guarded(program, pipeline, args, sizes, own_outputs=profile == "wide")
                 for form, pipeline in pipelines.items()}
        for form, got in forms.items():
            if form != "fused":
                assert_bitwise_equal(got, forms["fused"], f"{profile}: sim {form} against sim fused", program.source,
                                     loose=True)
        shadow = {}

        def measured():
            if not shadow:
                shadow.update(sensitivity(program, args, expected))
            return shadow
        assert_agrees(program, forms["fused"], expected, measured, f"{profile}: sim fused", stats)
        assert_constants(program, forms["fused"], "sim")


GUARD = 64  # elements before and after every array a compiled form is given, holding a pattern
_PATTERN = 0xA5


def call_guarded(program, pipeline, args: list, sizes: dict, own_outputs: bool) -> dict:
    """One call on copies of `args` (and, with `own_outputs`, `out=` arrays) placed inside larger
    buffers whose ends hold a pattern: a write out of bounds next to any of them fails here
    rather than corrupting the heap. Returns the outputs and inouts by name."""
    guards = []

    def place(array):
        flat = np.empty(array.size + 2 * GUARD, array.dtype)
        flat.view(np.uint8)[:] = _PATTERN
        view = flat[GUARD:GUARD + array.size].reshape(array.shape)
        view[...] = array
        guards.append(flat)
        return view
    call_args = [place(a) if isinstance(a, np.ndarray) else a for a in args]
    kwargs = {}
    if own_outputs and program.outputs:
        outs = [place(np.zeros(tuple(d if isinstance(d, int) else sizes[d] for d in o.dims), numpy_dtype_of(o.type)))
                for o in program.outputs]
        kwargs["out"] = outs[0] if len(outs) == 1 else tuple(outs)
    result = pipeline(*call_args, **kwargs)
    for flat in guards:
        ends = np.concatenate([flat[:GUARD].view(np.uint8), flat[-GUARD:].view(np.uint8)])
        assert (ends == _PATTERN).all(), f"a write out of bounds next to an argument\n{program.source}"
    if kwargs:
        result = kwargs["out"]
    return results_by_name(program, result, call_args)


# ---- Generated programs checked in worker processes: a crash (a stray write in the sim, which
# NumPy's heap only notices later) fails its own seed, not the whole run

CHECKS = ("front end", "reference", "compile", "cli", "sim")
_WORKER = "import sys; sys.path.insert(0, sys.argv[1]); import helpers; helpers.worker(sys.argv[2:])"


def check_seed(seed: int, checks=CHECKS, valid_only: bool = False) -> dict:
    """The checks named in `checks` on the program of `seed` (`valid_only`: a valid program that
    compiles); a record with each failed check's message."""
    from fusec.errors import FzError
    program = generate(seed, invalid=0, nested=0) if valid_only else generate(seed)
    record = {"seed": seed, "valid": program.valid, "mistake": program.mistake, "failures": {}}
    try:
        checked = check_generated(program)
    except AssertionError as exc:
        record["failures"]["front end"] = _message(exc)
        return record
    except Exception as exc:
        record["failures"]["front end"] = f"internal: {type(exc).__name__}: {exc}"
        return record
    record["accepted"] = checked is not None
    if checked is None:
        return record
    sim = "sim" in checks and program.compiles
    steps = {"reference": lambda: check_generated_reference(program, checked),
             "compile": lambda: check_generated_compiles(program, checked),
             "cli": lambda: check_generated_cli(program),
             "sim": lambda: _check_sim(program, checked, record) if sim else None}
    for check in checks[1:] if checks[0] == "front end" else checks:
        try:
            steps[check]()
        except AssertionError as exc:
            record["failures"][check] = _message(exc)
        except FzError as exc:
            record["failures"][check] = f"FzError: {exc}"
        except Exception as exc:
            record["failures"][check] = f"internal: {type(exc).__name__}: {exc}"
    record["sim"] = sim
    return record


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or repr(exc)
    return text[:6000]


CLI_VARIANTS = (("cuda",), ("cuda", "--unfused"), ("report",), ("ir", "--persistent"), ("cuda", "--persistent"))


def check_generated_cli(program, variants=CLI_VARIANTS) -> None:
    """`fusec compile FILE --emit KIND [flags]` for each variant, in-process: exit 0 and what was asked
    for (a program that does not compile: exit 1 and a located error)."""
    import contextlib
    import io
    import json
    import re
    import tempfile

    from fusec.cli import main
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / program.name
        path.write_text(program.source)
        for emit, *flags in variants:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(["compile", str(path), "--pipeline", program.pipeline, "--emit", emit, *flags])
            out, err, what = out.getvalue(), err.getvalue(), f"fusec compile --emit {emit} {' '.join(flags)}"
            if not program.compiles:
                assert code == 1 and re.match(rf"{re.escape(str(path))}:\d+:\d+: error: ", err), f"{what}: {err}"
            elif emit == "report":
                assert code == 0, f"{what}: exit {code}: {err}"
                assert all(kernel["name"].startswith(program.pipeline) for kernel in json.loads(out)), out
            elif emit == "cuda":  # a pipeline that writes nothing has no kernel
                assert code == 0 and ("__global__" in out or "(0 kernels)" in out), f"{what}: exit {code}: {err}"
            else:
                assert code == 0 and f"pipeline {program.pipeline}" in out, f"{what}: exit {code}: {err}"


def _check_sim(program, checked, record: dict) -> None:
    import fusec
    pipelines = {form: fusec.jit(program.source, backend="sim", pipeline=program.pipeline, **options)
                 for form, options in SIM_FORMS.items()}
    record["floats"] = {}
    check_generated_sim(program, checked, pipelines, record["floats"])


def worker(argv: list[str]) -> None:
    """START:STOP:STEP VALID_ONLY SIM_EVERY CLI_EVERY: one line of JSON as each program starts and ends."""
    import json
    import warnings
    warnings.simplefilter("ignore")
    seeds, valid_only, sim_every, cli_every = argv
    sim_every, cli_every = int(sim_every), int(cli_every)
    for seed in range(*map(int, seeds.split(":"))) if ":" in seeds else map(int, seeds.split(",")):
        print(json.dumps({"start": seed}), flush=True)
        checks = [c for c in CHECKS if not (c == "sim" and (not sim_every or seed % sim_every)
                                            or c == "cli" and (not cli_every or seed % cli_every))]
        if valid_only == "1":
            checks = [c for c in checks if c in ("front end", "sim")]
        print(json.dumps(check_seed(seed, tuple(checks), valid_only == "1")), flush=True)


def check_seeds_isolated(seeds, jobs: int, valid_only: bool = False, sim_every: int = 1,
                         cli_every: int = 0, progress=None) -> list[dict]:
    """`check_seed` for each seed, in `jobs` worker processes with glibc's heap checks on; a worker
    that dies fails the seed it was on ("crash") and a new one goes on after it."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    env = dict(os.environ, MALLOC_CHECK_="3", PYTHONWARNINGS="ignore")
    pending = [list(seeds[k::jobs]) for k in range(jobs)]
    logs = [tempfile.TemporaryFile("w+") for _ in range(jobs)]  # a pipe could fill and stall a worker
    procs, records = {}, []

    def spawn(k):
        if pending[k]:
            logs[k].seek(0)
            logs[k].truncate()
            share = (f"{pending[k][0]}:{pending[k][-1] + 1}:{seeds.step * jobs}" if isinstance(seeds, range)
                     else ",".join(map(str, pending[k])))  # what is left of this worker's share
            command = [sys.executable, "-c", _WORKER, str(Path(__file__).parent), share, str(int(valid_only)),
                       str(sim_every), str(cli_every)]
            procs[k] = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=logs[k], text=True, env=env), None]
    for k in range(jobs):
        spawn(k)
    while procs:
        for k, (proc, current) in list(procs.items()):
            line = proc.stdout.readline()
            if line:
                item = json.loads(line)
                if "start" in item:
                    procs[k][1] = item["start"]
                else:
                    records.append(item)
                    pending[k].remove(item["seed"])
                    if progress:
                        progress(len(records))
                continue
            proc.wait()
            del procs[k]
            if current is not None and current in pending[k]:  # it died on this seed
                logs[k].seek(0)
                said = logs[k].read().strip().splitlines()
                records.append({"seed": current, "crashed": True, "failures": {
                    "crash": f"the process died (exit {proc.returncode}): {said[-1] if said else ''}"}})
                pending[k].remove(current)
            spawn(k)
    return sorted(records, key=lambda r: r["seed"])
