"""The gradients of every differentiable example on the device against torch
autograd on the same maths (tests/grad_compare.py: fusec's op and the pipeline
written in torch, each measured against the torch maths in float64), in f32 and
bf16, with the tolerances stated there: within 2x torch's own error in that
dtype, or 1e-5 (f32) / 8e-3 (bf16) of the largest magnitude. Sizes with tails:
rows of 4099 elements (no whole vectors), odd element counts. GPU tier."""
import pytest
from grad_compare import compare_example
from test_grad import DIFFERENTIABLE

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

DIMS = {"n": 1_000_003, "rows": 67, "cols": 4099, "tokens": 67, "hidden": 4099, "vocab": 4099, "cells": 100_003}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("example", DIFFERENTIABLE)
def test_gradients_match_torch_autograd_on_the_device(example, dtype):
    found = compare_example(torch, example, dtype, "cuda", DIMS)
    for comparison in found:
        print(comparison.line())
    assert found and all(c.ok for c in found), "\n".join(c.line() for c in found if not c.ok)
