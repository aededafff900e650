"""A producer recomputed in its readers (passes.recompute) computes, on the sim,
exactly what storing it did: the same operations, rounded where the stored
value was (f16, bf16, an integer)."""
import numpy as np
import pytest
from helpers import random_args

import fusec
from fusec.errors import Source
from fusec.frontend import check_source

pytestmark = pytest.mark.sim

CASES = {
    "f32 column": ("pipeline p(x: f32[rows, cols], w: f32[cols], b: f32[cols]) -> (y: f32[rows, cols]) {\n"
                   "    s = w * 2.0 + b;\n    y = x * s + s;\n}\n"),
    "f16 column": ("pipeline p(x: f16[rows, cols], w: f16[cols], b: f32[cols]) -> (y: f32[rows, cols]) {\n"
                   "    s = w * 3.1;\n    y = f32(x) * f32(s) + b;\n}\n"),
    "bf16 row of a matrix": ("pipeline p(x: bf16[rows, cols], r: bf16[rows, 1]) -> (y: bf16[rows, cols]) {\n"
                             "    s = r * r + 0.3;\n    y = x / s;\n}\n"),
    "integer column": ("pipeline p(x: i32[rows, cols], w: i32[cols]) -> (y: i32[rows, cols]) {\n"
                       "    s = w * 3 + 7;\n    y = x * s - s;\n}\n"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_recomputed_producer_gives_the_stored_forms_results_exactly(name):
    program = check_source(Source("<test>", CASES[name]))
    fused = fusec.jit(CASES[name], backend="sim")
    assert len(fused.compiled.interface.kernels) == 1, fused.report()  # the producer was recomputed
    unfused = fusec.jit(CASES[name], backend="sim", fuse="none")
    assert len(unfused.compiled.interface.kernels) == 2
    reference = fusec.jit(CASES[name], backend="numpy")
    for cols in (5, 1, 33):  # rows: 3
        args = random_args(program.pipelines[0], cols, seed=cols)
        expected = reference(*args)
        for got in (fused(*args), unfused(*args)):
            np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(expected).view(np.uint8))
