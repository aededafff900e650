"""The packing of every kernel form's arguments, run (sim tier): each form's
kernel launched by the sim through the driver's argument layout
(fusec.runtime.packing), its results equal to the NumPy reference. A parameter
packed at the wrong offset or as the wrong type shows as wrong results here."""
import numpy as np
import pytest
from helpers import ROOT, assert_runs_like_reference, random_args

import fusec
from fusec.ir.launch import Elementwise, GridStride, MultiTensor, RegisterLoop, RowBlock

pytestmark = pytest.mark.sim

# form -> (example, its pipeline, jit options)
FORMS = {
    Elementwise: ("scale_bias_relu", "scale_bias_relu", {}),
    GridStride: ("dag", "dag", {"persistent": True}),
    RegisterLoop: ("time_step", "time_step", {}),
    RowBlock: ("layernorm", "layernorm", {}),
}


@pytest.mark.parametrize("form", list(FORMS), ids=lambda f: f.__name__)
def test_each_forms_kernel_gets_its_arguments(form):
    example, name, options = FORMS[form]
    f = fusec.jit(str(ROOT / "examples" / f"{example}.fz"), backend="sim", pipeline=name, **options)
    assert {type(k.form) for k in f.compiled.interface.kernels} == {form}
    program, pipeline = f.program, f.program.pipeline(name)
    args = random_args(pipeline, 3000, seed=4)
    if name == "time_step":  # its stable range
        args[2] = (np.abs(args[2]) + 0.5).astype(args[2].dtype)
        args[3:5] = [0.1, 0.05]
    assert_runs_like_reference(f, program, name, args)


def test_the_multi_tensor_kernel_gets_its_tables_and_scalars():
    adam = fusec.jit(str(ROOT / "examples/adam.fz"), backend="sim")
    reference = fusec.jit(str(ROOT / "examples/adam.fz"), backend="numpy")
    assert {type(k.form) for k in adam._foreach_compiled.interface.kernels} == {MultiTensor}
    rng = np.random.default_rng(2)
    sets = [[rng.standard_normal(n).astype(np.float32) for _ in range(4)] for n in (1, 7, 4099)]
    for s in sets:
        s[3] = np.abs(s[3])
    expected = [[a.copy() for a in s] for s in sets]
    scalars = (1e-3, 0.9, 0.999, 1e-8, 0.1, 0.001)
    adam.foreach([tuple(s) for s in sets], *scalars)
    for e in expected:
        reference(*e, *scalars)
    for s, e in zip(sets, expected):
        for a, b in zip(s, e):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
