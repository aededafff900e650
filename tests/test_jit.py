"""fusec.jit's API on the numpy backend: sources, options, the device fallback
(calls on the sim: test_jit_sim.py; the decorator: test_trace.py). Unit tier."""
import subprocess
import sys
import warnings

import numpy as np
import pytest
from helpers import ROOT

import fusec
from fusec.errors import ArgumentError

SBR = str(ROOT / "examples" / "scale_bias_relu.fz")
SHAPES = str(ROOT / "tests" / "programs" / "shapes.fz")


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


def test_a_tuned_partition_survives_a_recompile():
    """The guard's re-plan after compiling (real registers) compiles again with compile_options:
    a partition chosen by tuning must stay chosen (the re-plan had dropped it)."""
    f = fusec.jit("pipeline p(x: f32[n]) -> (y: f32[n]) { t = exp(x); y = t * 2.0 + sin(t); }", backend="numpy")
    unfused = tuple((i,) for i in range(len(f.compiled.graph.stages)))
    assert f.compiled.partition.groups != unfused
    f.__dict__["_tuned_partition"] = unfused  # as _tune_for records a winner
    again = fusec.compiler.compile_pipeline(f.program, f.name, f.compile_options(observed=()))
    assert again.partition.groups == unfused
    assert f.compile_options(multi_tensor=True, partition=None).partition is None  # foreach: its own one kernel
