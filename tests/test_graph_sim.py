"""GraphExecutor's bookkeeping on the CPU: the sim backend with a stand-in for
CUDA graphs (a capture records the launches; a replay runs them again with the
arguments they were captured with, as a CUDA graph does). The GPU tier replays
real graphs."""
import numpy as np
import pytest
from helpers import ROOT

from fusec.compiler import compile_pipeline
from fusec.errors import ArgumentError
from fusec.frontend import load
from fusec.runtime.backends.sim import SimBackend
from fusec.runtime.cuda_graphs import GraphExecutor

pytestmark = pytest.mark.sim


class RecordingBackend(SimBackend):
    def __init__(self, cuda_source, interface):
        super().__init__(cuda_source, interface)
        self.captures = 0

    def capture(self, launch):
        self.captures += 1
        return launch

    def replay(self, graph, stream):
        graph(stream)


@pytest.fixture
def executor():
    program = load(str(ROOT / "examples/scale_bias_relu.fz"))
    compiled = compile_pipeline(program, "scale_bias_relu")
    return GraphExecutor(compiled.interface, RecordingBackend(compiled.cuda, compiled.interface))


def relu(x, s, b):
    return np.maximum(x * np.float32(s) + np.float32(b), 0)


def test_a_replay_sees_new_values_and_returns_the_same_outputs(executor):
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    y1 = executor(x, 2.0, 0.5)
    np.testing.assert_allclose(y1, relu(x, 2.0, 0.5), rtol=1e-6)
    x[:] = -x  # same address, new values
    y2 = executor(x, 2.0, 0.5)
    assert y2 is y1 and executor.backend.captures == 1
    np.testing.assert_allclose(y2, relu(x, 2.0, 0.5), rtol=1e-6)


def test_a_new_signature_is_checked_and_captured(executor):
    x = np.ones(100, np.float32)
    executor(x, 2.0, 0.5)
    executor(x, 2, 0.5)  # an int where a float is declared: a different argument, checked, its own graph
    executor(x[:50], 2.0, 0.5)  # a new shape
    executor(np.ones(100, np.float32), 2.0, 0.5)  # a new address
    assert executor.backend.captures == 4
    with pytest.raises(ArgumentError, match="parameter 'x': expected dtype f32"):
        executor(x.astype(np.float64), 2.0, 0.5)
    with pytest.raises(ArgumentError, match="parameter 's' is a scalar f32; got bool"):
        executor(x, True, 0.5)
    with pytest.raises(ArgumentError, match="not C-contiguous"):
        executor(np.ones(200, np.float32)[::2], 2.0, 0.5)
    assert executor.backend.captures == 4


def test_out_and_unhashable_scalars_take_the_checked_path(executor):
    x, out = np.ones(10, np.float32), np.empty(10, np.float32)
    assert executor(x, 2.0, 0.5, out=out) is out
    np.testing.assert_array_equal(out, 2.5)
    y = executor(x, np.array(3.0), 0.5)  # a 0-d array scalar cannot be hashed: keyed by its checked value
    np.testing.assert_array_equal(y, 3.5)
    assert executor(x, np.array(3.0), 0.5) is y and executor.backend.captures == 2


def test_at_most_max_graphs_are_kept(executor):
    x = np.ones(10, np.float32)
    for k in range(GraphExecutor.MAX_GRAPHS + 5):
        executor(x, float(k), 0.0)
    assert len(executor._graphs) == GraphExecutor.MAX_GRAPHS


def test_arguments_by_name_take_the_checked_path(executor):
    x = np.ones(10, np.float32)
    y = executor(x=x, s=2.0, b=0.5)
    np.testing.assert_array_equal(y, 2.5)
    assert executor(x, s=2.0, b=0.5) is y and executor.backend.captures == 1  # the same checked key
