"""Shared by the test tiers: the programs to compile, and random arguments for them."""
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from fusec.errors import Source
from fusec.frontend import check_source

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
    """(id, program, pipeline name) for every pipeline of every program."""
    out = []
    for path in PROGRAMS:
        program = load_program(path)
        out += [(f"{path.stem}:{p.name}", program, p.name) for p in program.pipelines]
    return out


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
