"""fusec.jit on the numpy backend and the sim: every example against the
reference, every bad call refused before anything runs, shape bindings,
broadcast and aliasing. Sim tier (g++)."""
import numpy as np
import pytest
from helpers import EXAMPLES, ROOT, assert_runs_like_reference, load_program, random_args

import fusec
from fusec.errors import ArgumentError

pytestmark = pytest.mark.sim
SBR = str(ROOT / "examples" / "scale_bias_relu.fz")
SHAPES = str(ROOT / "tests" / "programs" / "shapes.fz")


@pytest.mark.parametrize("backend", ["numpy", "sim"])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_through_jit(path, backend):
    program = load_program(path)
    module = fusec.jit(str(path), backend=backend)
    for pipeline in program.pipelines:  # an example of several pipelines gives a module of them
        f = module if len(program.pipelines) == 1 else getattr(module, pipeline.name)
        assert_runs_like_reference(f, program, pipeline.name, random_args(pipeline, 300, seed=7))
        assert f.unfused.cuda_source.count("__global__") >= f.cuda_source.count("__global__")


@pytest.mark.parametrize("backend", ["numpy", "sim"])
def test_bad_calls_raise_before_anything_runs(backend):
    f = fusec.jit(SBR, backend=backend)
    x = np.ones(5, np.float32)
    cases = [
        ((x.astype(np.float64), 1.0, 2.0), {}, "'x'.*expected dtype f32"),
        ((x, 1.0), {}, "missing parameter 'b'"),
        ((x, 1.0, 2.0, 3.0), {}, "takes 3 arguments"),
        ((x, 1.0), {"c": 2.0}, "no parameter 'c'"),
        ((x, 1.0, 2.0), {"s": 2.0}, "got parameter 's' twice"),
        ((x, "1", 2.0), {}, "'s' is a scalar f32; got str"),
        ((np.ones((2, 2), np.float32), 1.0, 2.0), {}, "'x': expected 1 dim"),
        ((x, 1.0, True), {}, "'b' is a scalar f32; got bool"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ArgumentError, match=message):
            f(*args, **kwargs)


def test_shape_bindings_broadcast_and_aliasing_on_sim():
    mod = fusec.jit(SHAPES, backend="sim")
    with pytest.raises(ArgumentError, match="dim 'n' is 4 here but 5"):
        mod.siblings(np.ones(5, np.float32), np.ones(3, np.float32), np.ones(4, np.float32))
    h = np.ones(6, np.float32)
    with pytest.raises(ArgumentError, match="'h' and 'x' share memory"):
        mod.reassign(h, h)
    out = np.empty(6, np.float32)
    with pytest.raises(ArgumentError, match="share memory"):
        mod.reassign(h, out, out=out)
    y = mod.reassign(h, np.ones(6, np.float32), out=out)
    assert y is out
    with pytest.raises(ArgumentError, match="out= takes 1 array"):
        mod.reassign(h, np.ones(6, np.float32), out=(out, out))
    with pytest.raises(ArgumentError, match="out= array has shape"):
        mod.reassign(h, np.ones(6, np.float32), out=np.empty(5, np.float32))
    with pytest.raises(ArgumentError, match="sim backend takes NumPy arrays"):
        mod.scalar_temp([1.0, 2.0], 1.0)
    with pytest.raises(ArgumentError, match="stream= is for the cuda backend"):
        mod.scalar_temp(np.ones(2, np.float32), 1.0, stream=object())
