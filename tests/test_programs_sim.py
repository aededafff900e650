"""The sim tier: emitted CUDA C, compiled unchanged with g++ and run thread by
thread on the CPU, equals the NumPy reference: every program, fused and
unfused, at sizes that are not multiples of the block size."""
import numpy as np
import pytest
from helpers import ROOT, assert_matches, load_program, loaded_as_jit_does, pipelines, random_args

import fusec
from fusec.errors import ArgumentError
from fusec.reference import run as reference

pytestmark = pytest.mark.sim
PIPELINES = pipelines()


@pytest.mark.parametrize("form", ["fused", "unfused", "persistent"])
@pytest.mark.parametrize("ident,program,name", PIPELINES, ids=[p[0] for p in PIPELINES])
def test_sim_equals_reference(ident, program, name, form):
    from fusec.jit import JitOptions, JitPipeline
    sim = JitPipeline(loaded_as_jit_does(program), name,
                      JitOptions(fuse=form != "unfused", persistent=form == "persistent", backend="sim"))
    pipeline = program.pipeline(name)
    for size in (1, 3, 257, 1000):
        args = random_args(pipeline, size, seed=size)
        expected_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        expected = reference(program, name, *expected_args)
        actual = sim(*args)
        assert_matches(actual if actual is not None else (), expected if expected is not None else ())
        for p, a, e in zip(pipeline.params, args, expected_args):  # inout arrays were updated alike
            if p.role == "inout":
                assert_matches(a, e)


def test_jit_sim_backend_on_a_path():
    f = fusec.jit(str(ROOT / "examples" / "scale_bias_relu.fz"), backend="sim")
    x = np.arange(8, dtype=np.float32) - 4
    np.testing.assert_array_equal(f(x, 1.5, -0.25), np.maximum(x * 1.5 - 0.25, 0))
    np.testing.assert_array_equal(f.unfused(x, s=1.5, b=-0.25), np.maximum(x * 1.5 - 0.25, 0))


def test_sim_rejects_bad_arrays_by_parameter_name():
    f = fusec.jit(str(ROOT / "examples" / "bias_gelu.fz"), backend="sim")
    h = np.zeros((4, 6), np.float16)
    b = np.zeros(6, np.float16)
    with pytest.raises(ArgumentError, match="'h'.*not C-contiguous"):
        f(np.zeros((6, 4), np.float16).T, b)
    with pytest.raises(ArgumentError, match="'h' is written, but the array is a broadcast view"):
        f(np.broadcast_to(b, (4, 6)), b)
    frozen = h.copy()
    frozen.flags.writeable = False
    with pytest.raises(ArgumentError, match="'h' is inout, but the array is read-only"):
        f(frozen, b)
    with pytest.raises(ArgumentError, match="'b': expected dtype f16"):
        f(h, b.astype(np.float32))
    with pytest.raises(ArgumentError, match="dim 'cols' is 5 here but 6"):
        f(h, np.zeros(5, np.float16))


def test_zero_size_arrays_launch_nothing():
    f = fusec.jit(str(ROOT / "examples" / "scale_bias_relu.fz"), backend="sim")
    assert f(np.zeros(0, np.float32), 1.0, 2.0).shape == (0,)


@pytest.mark.parametrize("fuse", [True, False], ids=["persistent", "unfused"])
def test_repeat_counts_in_the_sim(fuse):
    program = load_program(ROOT / "tests/programs/repeat.fz")
    from fusec.jit import JitOptions, JitPipeline
    f = JitPipeline(loaded_as_jit_does(program), "counted", JitOptions(fuse=fuse, backend="sim"))
    x = np.random.default_rng(4).standard_normal(1000).astype(np.float32)
    for k in (0, 1, 5, 40):
        np.testing.assert_array_equal(f(x, k), reference(program, "counted", x, k))
    with pytest.raises(ArgumentError, match="repeat count 'k' is negative"):
        f(x, -1)
