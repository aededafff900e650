"""fusec.jit on the CPU backends: the API and every bad call (the decorator: test_trace.py)."""
import subprocess
import sys
import warnings

import numpy as np
import pytest
from helpers import ROOT, assert_matches, load_program, random_args

import fusec
from fusec.errors import ArgumentError
from fusec.reference import run as reference

SBR = str(ROOT / "examples" / "scale_bias_relu.fz")
SHAPES = str(ROOT / "tests" / "programs" / "shapes.fz")
BACKENDS = ["numpy", pytest.param("sim", marks=pytest.mark.sim)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.fz")), ids=lambda p: p.stem)
def test_every_example_through_jit(path, backend):
    program = load_program(path)
    f = fusec.jit(str(path), backend=backend)
    pipeline = program.pipelines[0]
    args = random_args(pipeline, 300, seed=7)
    expected_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    expected = reference(program, pipeline.name, *expected_args)
    actual = f(*args)
    if expected is not None:
        assert_matches(actual, expected)
    for p, a, e in zip(pipeline.params, args, expected_args):
        if p.role == "inout":
            assert_matches(a, e)
    assert f.unfused.cuda_source.count("__global__") >= f.cuda_source.count("__global__")


def test_source_text_and_module_with_several_pipelines():
    mod = fusec.jit(open(SHAPES).read(), backend="numpy")
    assert {"colscale", "scalar_temp", "reassign", "siblings", "dead_temp"} <= set(vars(mod))
    y = mod.scalar_temp(np.ones(4, np.float32), 2.0)
    np.testing.assert_array_equal(y, np.full(4, 5, np.float32))
    one = fusec.jit(SHAPES, pipeline="colscale", backend="numpy")
    assert one.name == "colscale"
    with pytest.raises(ValueError, match="no pipeline named 'nope'"):
        fusec.jit(SHAPES, pipeline="nope")


def test_options_are_checked():
    with pytest.raises(TypeError, match="unexpected keyword argument 'fusion'"):
        fusec.jit(SBR, fusion=False)
    with pytest.raises(ValueError, match="backend must be one of"):
        fusec.jit(SBR, backend="opencl")
    with pytest.raises(fusec.FzError, match="unknown name 'q'"):
        fusec.jit("pipeline p(x: f32[n]) -> (y: f32[n]) {\n y = q;\n}")


def test_auto_without_a_device_warns_once_and_uses_numpy(monkeypatch):
    import fusec.runtime.backends.cuda as cuda
    monkeypatch.setattr(cuda, "available", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = fusec.jit(SBR)
    assert f.backend == "numpy" and len(caught) == 1 and "no CUDA device" in str(caught[0].message)


@pytest.mark.parametrize("backend", BACKENDS)
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


@pytest.mark.sim
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


def test_int_scalar_range_and_kind():
    f = fusec.jit("pipeline p(x: i8[n], k: i8) -> (y: i8[n]) {\n y = x + k;\n}", backend="numpy")
    with pytest.raises(ArgumentError, match="'k' is i8; 300 is out of its range"):
        f(np.ones(2, np.int8), 300)
    with pytest.raises(ArgumentError, match="'k' is i8; got a float"):
        f(np.ones(2, np.int8), 1.5)


def test_import_fusec_and_compile_without_cupy(tmp_path):
    blocker = ("import sys\nclass NoCupy:\n    def find_spec(self, name, path=None, target=None):\n"
               "        if name == 'cupy' or name.startswith('cupy.'):\n"
               "            raise ImportError('no cupy here')\nsys.meta_path.insert(0, NoCupy())\n")
    code = blocker + ("import fusec, warnings\nwarnings.simplefilter('ignore')\n"
                      f"f = fusec.jit({SBR!r})\nimport numpy as np\n"
                      "print(f.backend, f(np.ones(2, np.float32), 2.0, 1.0))\n"
                      "from fusec.cli import main\nmain(['compile', " + repr(SBR) + ", '-o', " +
                      repr(str(tmp_path / "o.cu")) + "])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "numpy [3. 3.]" in proc.stdout and (tmp_path / "o.cu").exists()


def test_graph_needs_the_cuda_backend():
    with pytest.raises(ValueError, match="graph=True replays CUDA graphs: it needs the cuda backend"):
        fusec.jit(SBR, backend="numpy", graph=True)
