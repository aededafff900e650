"""CPU torch tensors on the sim and numpy backends: tensors in give tensors out,
bf16 included, without a copy, for every example on both backends (NumPy in gives
NumPy out); a call takes arrays of one kind; out= and inout with tensors. Sim tier
(g++). The cuda backend's side (CUDA tensors and CuPy arrays): tests/test_torch_gpu.py."""
import ml_dtypes
import numpy as np
import pytest
from helpers import EXAMPLES, ROOT, assert_matches, load_program, random_args

import fusec
from fusec.errors import ArgumentError
from fusec.jit import JitOptions, JitPipeline
from fusec.reference import run as reference

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.sim

BF16 = np.dtype(ml_dtypes.bfloat16)

SBR = """
pipeline sbr(x: bf16[rows, cols], b: f32[cols], s: f32) -> (y: bf16[rows, cols], m: bool[rows, cols]) {
    t = x * s;
    y = max(t + b, 0.0);
    m = t > b;
}
"""


def to_torch(a):
    """A NumPy array as a tensor over the same memory (bf16 through int16)."""
    if not isinstance(a, np.ndarray):
        return a
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def sbr_args(rows=3, cols=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32).astype(BF16)
    b = rng.standard_normal(cols).astype(np.float32)
    return x, b, 1.5


def test_numpy_backend_takes_tensors_and_writes_out_tensors():
    f = fusec.jit(SBR, backend="numpy")
    x, b, s = sbr_args()
    out = (torch.empty(3, 5, dtype=torch.bfloat16), torch.empty(3, 5, dtype=torch.bool))
    f(to_torch(x), to_torch(b), s, out=out)
    ey, em = reference(f.program, "sbr", x, b, s)
    np.testing.assert_array_equal(to_numpy(out[0]).view(np.int16), ey.view(np.int16))
    np.testing.assert_array_equal(out[1].numpy(), em)


@pytest.mark.parametrize("backend", ["sim", "numpy"])
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_takes_and_returns_tensors(path, backend):
    """Each example on CPU tensors: torch tensors of the declared dtypes come
    back, equal to the reference on the same data; inout tensors are updated
    in place (the backend wrote through the tensors' own memory)."""
    program = load_program(path)
    for pipeline in program.pipelines:
        sim = JitPipeline(program, pipeline.name, JitOptions(backend=backend))
        args = random_args(pipeline, 37, seed=1)
        expected_args = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        expected = reference(program, pipeline.name, *expected_args)
        tensors = [to_torch(a) for a in args]
        actual = sim(*tensors)
        actual = () if actual is None else actual if isinstance(actual, tuple) else (actual,)
        assert all(type(a) is torch.Tensor for a in actual)
        for out, declared in zip(actual, pipeline.outputs):
            assert out.dtype == getattr(torch, declared.type.torch)
        assert_matches(tuple(map(to_numpy, actual)), () if expected is None else expected)
        for p, t, e in zip(pipeline.params, tensors, expected_args):
            if p.role == "inout":
                assert_matches(to_numpy(t), e)


def test_bf16_tensors_round_trip_without_a_copy():
    """bf16 in and out: the result is a torch.bfloat16 tensor whose bits are the
    reference's, and an out= tensor is written where it lies."""
    f = fusec.jit(SBR, backend="sim")
    x, b, s = sbr_args()
    y, m = f(to_torch(x), to_torch(b), s)
    assert y.dtype == torch.bfloat16 and m.dtype == torch.bool
    ey, em = reference(f.program, "sbr", x, b, s)
    np.testing.assert_array_equal(to_numpy(y).view(np.int16), ey.view(np.int16))
    np.testing.assert_array_equal(to_numpy(m), em)
    out = (torch.full((3, 5), 7.0, dtype=torch.bfloat16), torch.zeros(3, 5, dtype=torch.bool))
    result = f(to_torch(x), to_torch(b), s, out=out)
    assert result[0] is out[0] and result[1] is out[1]
    assert torch.equal(out[0], y) and torch.equal(out[1], m)


@pytest.mark.parametrize("backend", ["sim", "numpy"])
def test_numpy_in_gives_numpy_out(backend):
    f = fusec.jit(SBR, backend=backend)
    y, m = f(*sbr_args())
    assert type(y) is np.ndarray and y.dtype == BF16 and type(m) is np.ndarray
    assert m.dtype == np.bool_


def test_outputs_and_temporaries_of_a_tensor_call_are_allocated_by_torch(monkeypatch):
    """The unfused chain moves two temporaries between its three kernels: with
    tensors in, torch allocates them and the output (3 allocations a call)."""
    made = []
    real_empty = torch.empty

    def empty(*args, **kwargs):
        made.append(args)
        return real_empty(*args, **kwargs)
    monkeypatch.setattr(torch, "empty", empty)
    f = fusec.jit(str(ROOT / "examples/scale_bias_relu.fz"), backend="sim", fuse=False)
    x = torch.linspace(-2, 2, 101)
    y = f(x, 2.0, 0.5)
    assert made == [((101,),)] * 3
    assert torch.equal(y, torch.relu(x * 2.0 + 0.5))


@pytest.mark.parametrize("backend", ["sim", "numpy"])
def test_a_traced_function_returns_what_it_was_given(backend):
    @fusec.jit(backend=backend)
    def mix(a, b, s):
        return np.maximum(a * s, b), a + b

    a, b = torch.arange(6, dtype=torch.float32), torch.full((6,), 2.0)
    hi, total = mix(a, b, 0.5)
    assert type(hi) is torch.Tensor and torch.equal(hi, torch.maximum(a * 0.5, b))
    assert torch.equal(total, a + b)
    hi, total = mix(a.bfloat16(), b.bfloat16(), 0.5)
    assert hi.dtype == torch.bfloat16 and type(total) is torch.Tensor
    hi, total = mix(a.numpy(), b.numpy(), 0.5)
    assert type(hi) is np.ndarray and type(total) is np.ndarray


@pytest.mark.parametrize("backend", ["sim", "numpy"])
def test_inout_tensors_are_updated_in_place(backend):
    program = load_program(ROOT / "examples/adam.fz")
    adam = JitPipeline(program, "adam", JitOptions(backend=backend))
    rng = np.random.default_rng(3)
    p, g, m, v = (rng.standard_normal(100).astype(np.float32) for _ in range(4))
    v = np.abs(v)
    expected = [a.copy() for a in (p, g, m, v)]
    scalars = (1e-2, 0.9, 0.999, 1e-8, 0.1, 0.001)
    reference(program, "adam", *expected, *scalars)
    tensors = [torch.from_numpy(a.copy()) for a in (p, g, m, v)]
    addresses = [t.data_ptr() for t in tensors]
    assert adam(*tensors, *scalars) is None
    for t, e, address in zip(tensors, expected, addresses):
        np.testing.assert_array_equal(t.numpy(), e)
        assert t.data_ptr() == address


@pytest.mark.parametrize("backend", ["sim", "numpy"])
def test_a_call_takes_arrays_of_one_kind(backend):
    f = fusec.jit(SBR, backend=backend)
    x, b, s = sbr_args()
    with pytest.raises(ArgumentError, match=r"parameter 'b' is a numpy.ndarray, but parameter 'x' is a "
                                            r"torch.Tensor: a call takes arrays of one kind \(torch tensors or "
                                            r"NumPy arrays\)"):
        f(to_torch(x), b, s)
    with pytest.raises(ArgumentError, match=r"output 'm' is a torch.Tensor, but parameter 'x' is a numpy.ndarray"):
        f(x, b, s, out=(np.empty((3, 5), BF16), torch.empty(3, 5, dtype=torch.bool)))


@pytest.mark.parametrize("backend", ["sim", "numpy"])
def test_tensor_errors_name_the_parameter(backend):
    f = fusec.jit(SBR, backend=backend)
    x, b, s = sbr_args()
    with pytest.raises(ArgumentError, match=r"parameter 'x': expected dtype bf16 \(bfloat16\), got float32"):
        f(to_torch(x).float(), to_torch(b), s)
    with pytest.raises(ArgumentError, match=r"parameter 'x': the array is not C-contiguous"):
        f(to_torch(np.ascontiguousarray(x.T)).T, to_torch(b), s)
    with pytest.raises(ArgumentError, match=r"parameter 'b': the tensor requires grad, and a fusec call is not "
                                            r"recorded by autograd: call it under torch.no_grad\(\)"):
        f(to_torch(x), to_torch(b).requires_grad_(), s)
    with torch.no_grad():
        f(to_torch(x), to_torch(b).requires_grad_(), s)

    class OnTheGpu:
        def __dlpack_device__(self):
            return 2, 0  # kDLCUDA
    with pytest.raises(ArgumentError, match=rf"parameter 'x': the {backend} backend takes arrays in host memory, "
                                            r"got a GPU array"):
        f(OnTheGpu(), to_torch(b), s)
