"""The sim is built with bounds checking: a kernel that writes outside an array
it was given fails loudly (guard zones around every array), instead of
corrupting memory or crashing the process by luck."""
import numpy as np
import pytest
from helpers import ROOT

import fusec
from fusec.compiler import compile_pipeline
from fusec.runtime.backends.sim import SimBackend
from fusec.types import BY_NAME
from fusec.runtime.executor import Executor

pytestmark = pytest.mark.sim


def broken(edit):
    """scale_bias_relu with its one-element store edited (`edit(cuda) -> cuda`)."""
    program = fusec.frontend.load(str(ROOT / "examples/scale_bias_relu.fz"))
    compiled = compile_pipeline(program, "scale_bias_relu")
    cuda = edit(compiled.cuda)
    assert cuda != compiled.cuda
    return Executor(compiled.interface, SimBackend(cuda, compiled.interface))


@pytest.mark.parametrize("store", ["y[i + 1] = v3;", "y[i - 1] = v3;"])
def test_a_write_past_either_end_of_an_array_fails(store):
    run = broken(lambda cuda: cuda.replace("    y[i] = v3;", "    " + store, 1))
    x = np.ones(14, np.float32)[1:]  # 4 bytes into its buffer: the one-element variant runs
    with pytest.raises(RuntimeError, match="wrote outside an array it was given"):
        run(x, 1.0, 0.0)


def test_a_write_into_an_input_fails():
    run = broken(lambda cuda: cuda.replace("    y[i] = v3;", "    ((float*)x)[i] = v3; y[i] = v3;", 1))
    x = np.ones(14, np.float32)[1:]  # the one-element variant
    x.flags.writeable = False
    with pytest.raises(RuntimeError, match="wrote into a read-only array"):
        run(x, 2.0, 0.0)  # writes 2.0 over the 1.0 in x


def test_a_correct_kernel_passes_and_writes_its_outputs():
    f = fusec.jit(str(ROOT / "examples/scale_bias_relu.fz"), backend="sim")
    x = np.linspace(-1, 1, 1001).astype(np.float32)
    np.testing.assert_array_equal(f(x, 2.0, 0.5), np.maximum(x * np.float32(2.0) + np.float32(0.5), 0))



@pytest.mark.parametrize("dtype", ["f16", "bf16", "f64", "i8", "u16", "bool"])
def test_every_element_type_passes_through_the_guards(dtype):
    f = fusec.jit(f"pipeline p(x: {dtype}[n], inout h: {dtype}[n]) -> (y: {dtype}[n]) {{ y = x; h = x; }}",
                  backend="sim")
    x = (np.arange(37) % 3).astype(BY_NAME[dtype].numpy_dtype)
    h = np.zeros_like(x)
    y = f(x, h)
    np.testing.assert_array_equal(y.view(np.uint8), x.view(np.uint8))
    np.testing.assert_array_equal(h.view(np.uint8), x.view(np.uint8))
