"""fusec.torch_op on CPU tensors (sim tier: the op's CPU kernel runs the sim;
a few run the numpy backend): torch.library.opcheck, torch.compile(fullgraph=True)
models calling the op, the fake implementation's shapes, dtypes and errors,
and no recompilation for a new float argument."""
import itertools

import pytest
from helpers import ROOT, assert_matches, load_program

import fusec
from fusec.errors import ArgumentError
from fusec.reference import run as reference

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.sim

_names = itertools.count()

BIAS_GELU = """
pipeline bias_gelu(x: f32[rows, cols], b: f32[cols], scale: f32) -> (y: f32[rows, cols]) {
    h = x + b;
    y = scale * 0.5 * h * (1.0 + tanh(0.7978845608 * (h + 0.044715 * h * h * h)));
}
"""

SPLIT = """
pipeline split(x: bf16[n, 4], k: i32, flag: bool) -> (lo: bf16[n, 4], hi: f32[n, 4], big: bool[n, 4]) {
    lo = min(x, 0.0);
    hi = flag ? f32(max(x, 0.0)) * f32(k) : 0.0;
    big = x > 1.0;
}
"""


def unique(name: str) -> str:
    """A new op name per registration: torch keeps ops for the whole process."""
    return f"fusec_test::{name}_{next(_names)}"


def bias_gelu_torch(x, b, scale):
    h = x + b
    return scale * 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))


def test_schema_from_the_signature():
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"))
    assert op.schema == "(Tensor x, Tensor b, Scalar scale) -> Tensor"
    split = fusec.torch_op(SPLIT, name=unique("split"))
    assert split.schema == "(Tensor x, SymInt k, bool flag) -> (Tensor, Tensor, Tensor)"
    adam = fusec.torch_op(str(ROOT / "examples/adam.fz"), name=unique("adam"))
    assert adam.schema == ("(Tensor(a!) param, Tensor grad, Tensor(b!) m, Tensor(c!) v, Scalar lr, Scalar beta1, "
                           "Scalar beta2, Scalar eps, Scalar bc1, Scalar bc2) -> ()")


@pytest.mark.parametrize("backend", ["sim", "numpy"])
def test_opcheck_and_results(backend):
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"), backend=backend)
    x, b = torch.randn(5, 7), torch.randn(7)
    torch.library.opcheck(op.op, (x, b, 0.5))
    torch.testing.assert_close(op(x, b, 0.5), bias_gelu_torch(x, b, 0.5), rtol=2e-5, atol=1e-6)


def test_opcheck_several_outputs_of_several_dtypes():
    op = fusec.torch_op(SPLIT, name=unique("split"))
    x = torch.randn(6, 4).to(torch.bfloat16) * 2
    torch.library.opcheck(op.op, (x, 3, True))
    lo, hi, big = op(x, 3, True)
    assert (lo.dtype, hi.dtype, big.dtype) == (torch.bfloat16, torch.float32, torch.bool)
    assert torch.equal(lo, torch.clamp(x, max=0.0))
    assert torch.equal(hi, torch.clamp(x, min=0.0).float() * 3)
    assert torch.equal(big, x > 1.0)


def test_opcheck_inout_arguments_are_mutated_in_place():
    program = load_program(ROOT / "examples/bias_gelu.fz")
    op = fusec.torch_op(str(ROOT / "examples/bias_gelu.fz"), name=unique("bias_gelu_inplace"))
    generator = torch.Generator().manual_seed(5)
    h, b = torch.randn(4, 16, generator=generator).half(), torch.randn(16, generator=generator).half()
    torch.library.opcheck(op.op, (h.clone(), b))
    expected = h.numpy().copy()
    reference(program, "bias_gelu", expected, b.numpy())
    address = h.data_ptr()
    assert op(h, b) is None
    assert h.data_ptr() == address
    # the sim's libm against NumPy's: within the stated f16 tolerance (an f16 rounding may differ by an ulp)
    assert_matches(h.numpy(), expected)


def test_a_traced_function_as_an_op():
    def swish_gate(gate: torch.Tensor, up: torch.Tensor, beta: float) -> torch.Tensor:
        return gate * fusec.sigmoid(beta * gate) * up

    op = fusec.torch_op(swish_gate, name=unique("swish_gate"))
    assert op.schema == "(Tensor gate, Tensor up, Scalar beta) -> Tensor"
    gate, up = torch.randn(3, 8), torch.randn(3, 8)
    torch.library.opcheck(op.op, (gate, up, 1.5))
    torch.testing.assert_close(op(gate, up, 1.5), gate * torch.sigmoid(1.5 * gate) * up, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(op(gate, up, 2), gate * torch.sigmoid(2 * gate) * up, rtol=2e-5, atol=1e-6)


class BiasGeluMLP(torch.nn.Module):
    def __init__(self, op, width: int):
        super().__init__()
        self.op = op
        self.linear = torch.nn.Linear(width, width)
        self.bias = torch.nn.Parameter(torch.randn(width))

    def forward(self, x, scale):
        return self.op(self.linear(x), self.bias, scale).sum(-1)


class CountingBackend:
    """A torch.compile backend that counts the graphs Dynamo hands it (one per compilation)."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


@torch.no_grad()
def test_compiled_model_with_the_op_has_no_graph_break():
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"))
    model = BiasGeluMLP(op, 16)
    x = torch.randn(8, 16)
    compiled = torch.compile(model, fullgraph=True)  # Inductor; fullgraph: a graph break raises
    torch.testing.assert_close(compiled(x, 0.5), model(x, 0.5), rtol=1e-5, atol=1e-5)
    explained = torch._dynamo.explain(model)(x, 0.5)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def _five_learning_rates(model, compiled, grad: bool) -> None:
    """The compiled model against the eager one at five values of its float, forward
    (and, with grad, the bias's gradient)."""
    x = torch.randn(8, 16)
    for scale in (0.1, 0.2, 0.3, 0.4, 0.5):
        with torch.set_grad_enabled(grad):
            found = compiled(x, scale)
            expected = model(x, scale)
            torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5)
            if grad:
                (g,) = torch.autograd.grad(found.sum(), model.bias)
                (want,) = torch.autograd.grad(expected.sum(), model.bias)
                torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend,grad,dynamic", [
    ("aot_eager", False, None), ("aot_eager", True, None), ("aot_eager", False, True), ("aot_eager", True, True),
    ("inductor", True, None),  # once: Inductor's compiles take seconds
])
def test_a_new_float_argument_does_not_recompile(backend, grad, dynamic):
    """Five learning rates, forward alone or forward and backward: Dynamo compiles the first as
    a constant, and the first change once more with the float as an input (as it does for
    torch's own ops); no later value recompiles, and each value is used. dynamic=True skips the
    first. Through AOTAutograd (aot_eager, Inductor), which specializes a float that reaches a
    custom op's Scalar: under torch.compile the op takes it as a 0-d tensor (op.op_tensor_scalars)."""
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"), backend="numpy")
    model = BiasGeluMLP(op, 16)
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=dynamic)
    _five_learning_rates(model, compiled, grad)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == (1 if dynamic else 2)


def test_the_op_taking_float_scalars_as_tensors_passes_opcheck():
    """op.op_tensor_scalars, what torch.compile calls on CPU tensors: its fake implementation,
    autograd (its backward op takes the scalar as a tensor too) and AOT checks."""
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"), backend="numpy")
    assert op.op_tensor_scalars is not None and op.backward.op_tensor_scalars is not None
    x, b = torch.randn(5, 7, requires_grad=True), torch.randn(7, requires_grad=True)
    scale = torch.tensor(0.5, dtype=torch.float64)
    torch.library.opcheck(op.op_tensor_scalars, (x, b, scale))
    y = op(x, b, scale)  # a tensor where the float goes: this op
    torch.testing.assert_close(y, bias_gelu_torch(x, b, 0.5), rtol=2e-5, atol=1e-6)
    y.sum().backward()
    twin_x, twin_b = x.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    bias_gelu_torch(twin_x, twin_b, 0.5).sum().backward()
    torch.testing.assert_close((x.grad, b.grad), (twin_x.grad, twin_b.grad), rtol=2e-5, atol=1e-5)


@torch.no_grad()
def test_compiled_model_mutating_a_buffer_in_place():
    op = fusec.torch_op(str(ROOT / "examples/bias_gelu.fz"), name=unique("bias_gelu_inplace"))

    def step(h, b):
        h = h * 2
        op(h, b)
        return h + 1

    h, b = torch.randn(4, 32).half(), torch.randn(32).half()
    compiled = torch.compile(step, fullgraph=True)
    assert torch.equal(compiled(h, b), step(h, b))


def test_fake_implementation_checks_shapes_and_dtypes():
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"))
    compiled = torch.compile(lambda x, b: op(x, b, 1.0), backend=CountingBackend(), fullgraph=True)
    with pytest.raises(Exception, match=r"dim 'cols' is 6 here but 7 from parameter 'x'"):
        compiled(torch.randn(5, 7), torch.randn(6))
    with pytest.raises(Exception, match=r"parameter 'b': expected dtype f32 \(torch.float32\), got torch.float16"):
        compiled(torch.randn(5, 7), torch.randn(7).half())
    with pytest.raises(ArgumentError, match=r"parameter 'b' is on meta, but 'x' is on cpu"):
        op(torch.randn(5, 7), torch.randn(7, device="meta"), 1.0)


def test_fake_implementation_gives_outputs_from_the_dims():
    from torch._subclasses.fake_tensor import FakeTensorMode
    op = fusec.torch_op(SPLIT, name=unique("split"))
    with FakeTensorMode():
        lo, hi, big = op(torch.empty(9, 4, dtype=torch.bfloat16), 2, False)
    assert [t.shape for t in (lo, hi, big)] == [(9, 4)] * 3
    assert [t.dtype for t in (lo, hi, big)] == [torch.bfloat16, torch.float32, torch.bool]


def test_bad_registrations_are_clear():
    with pytest.raises(ValueError, match="several pipelines"):
        fusec.torch_op(BIAS_GELU + SPLIT, name=unique("two"))
    with pytest.raises(TypeError, match="has no option graph"):
        fusec.torch_op(BIAS_GELU, name=unique("graph"), graph=True)

    def unannotated(x, s: float) -> torch.Tensor:
        return x * s
    with pytest.raises(TypeError, match=r"annotate unannotated's parameter 'x'"):
        fusec.torch_op(unannotated, name=unique("unannotated"))

    def no_result(x: torch.Tensor):
        return x
    with pytest.raises(TypeError, match="annotate what no_result returns"):
        fusec.torch_op(no_result, name=unique("no_result"))


def test_a_traced_function_returning_what_its_annotation_does_not_say():
    def two(x: torch.Tensor) -> torch.Tensor:
        return x + 1, x - 1

    op = fusec.torch_op(two, name=unique("two"))
    with pytest.raises(TypeError, match="two returns 2 arrays, but its annotation says 1"):
        op(torch.ones(3))


def test_cpu_tensors_on_an_op_registered_for_cuda():
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"), backend="cuda")
    with pytest.raises(ArgumentError, match="registered with backend='cuda': it takes CUDA tensors"):
        op(torch.ones(2, 3), torch.ones(3), 1.0)


def test_importing_fusec_does_not_import_torch():
    import subprocess
    import sys
    code = "import sys, fusec; fusec.jit('pipeline p(x: f32[n]) -> (y: f32[n]) { y = x; }', backend='numpy'); " \
           "assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@torch.no_grad()
def test_row_reductions_as_ops_match_torch_and_compile_without_a_graph_break():
    rmsnorm = fusec.torch_op(str(ROOT / "examples/rmsnorm.fz"), name=unique("rmsnorm"), pipeline="rmsnorm")
    ce = fusec.torch_op(str(ROOT / "examples/cross_entropy.fz"), name=unique("ce"), pipeline="cross_entropy")
    x, w = torch.randn(6, 45), torch.randn(45)
    label = torch.randint(0, 45, (6, 1))
    label[2] = -100  # ignored: 0, as torch's default ignore_index gives
    torch.library.opcheck(rmsnorm.op, (x, w, 1e-6))
    torch.library.opcheck(ce.op, (x, label))
    torch.testing.assert_close(rmsnorm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (45,), w, 1e-6),
                               rtol=2e-6, atol=2e-6)
    losses, mean = ce(x, label)
    torch.testing.assert_close(losses[:, 0], torch.nn.functional.cross_entropy(x, label[:, 0], reduction="none"),
                               rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(mean[0], torch.nn.functional.cross_entropy(x, label[:, 0]), rtol=2e-6, atol=2e-6)

    def model(a, b):
        return rmsnorm(a, b, 1e-6).sum() + ce(a, label)[1][0]
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), model(x, w))
    assert torch._dynamo.explain(model)(x, w).graph_break_count == 0


def test_an_op_whose_backward_takes_its_saved_output_passes_opcheck_and_compiles_with_backward():
    """softmax's chosen backward takes y (saved by autograd): opcheck's autograd and AOT checks,
    the fake backward op, and loss.backward() through torch.compile(fullgraph=True)."""
    op = fusec.torch_op(str(ROOT / "examples/softmax.fz"), name=unique("softmax"), pipeline="softmax")
    assert op.definition.saved_outputs() == [True]
    assert op.backward.schema == "(Tensor x, Tensor y, Tensor grad_y) -> Tensor"
    x = torch.randn(4, 33, requires_grad=True)
    torch.library.opcheck(op.op, (x,))
    weights = torch.randn(4, 33)

    def loss(a):
        return (op(a) * weights).sum()

    compiled = torch.compile(loss, fullgraph=True)
    compiled(x).backward()
    twin = x.detach().clone().requires_grad_()
    (torch.softmax(twin, -1) * weights).sum().backward()
    torch.testing.assert_close(x.grad, twin.grad, rtol=1e-5, atol=1e-6)


# ---- float scalars read from memory by the kernels (scalars_in_memory): CUDA's path, run on the sim


def _spy_in_memory(op) -> list:
    """Records, for each run of the op and of its backward op, whether its kernels read the float
    scalars from memory (`TorchOp._execute`'s in_memory)."""
    seen = []
    for target, what in ((op, "forward"), (op.backward, "backward")):
        run = target._execute

        def spy(args, in_memory=False, run=run, what=what):
            seen.append((what, in_memory))
            return run(args, in_memory)
        target._execute = spy
    return seen


@pytest.mark.parametrize("backend,grad", [("aot_eager", True)])  # Inductor's CPU path: tests above
def test_scalars_read_from_memory_on_cpu_under_compile(backend, grad):
    """scalars_in_memory=True on CPU tensors: under torch.compile the op takes each float as a
    0-d float64 tensor that the sim's kernels read (the path CUDA tensors take by default),
    forward and backward; five values, two compilations (as test_a_new_float_argument_does_not_
    recompile), every value used; eager calls keep the Scalar."""
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"), scalars_in_memory=True)
    seen = _spy_in_memory(op)
    model = BiasGeluMLP(op, 16)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    _five_learning_rates(model, compiled, grad)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    compiled_runs = [m for what, m in seen if what == "forward"][0::2]  # compiled, then eager, each value
    eager_runs = [m for what, m in seen if what == "forward"][1::2]
    assert compiled_runs == [True] * 5 and eager_runs == [False] * 5
    if grad:
        assert [m for what, m in seen if what == "backward"] == [True, False] * 5


def test_scalars_in_memory_op_passes_opcheck_and_matches_the_by_value_op():
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"), scalars_in_memory=True)
    seen = _spy_in_memory(op)
    x, b = torch.randn(5, 7, requires_grad=True), torch.randn(7, requires_grad=True)
    scale = torch.tensor(1 / 3, dtype=torch.float64)
    torch.library.opcheck(op.op_tensor_scalars, (x, b, scale))
    seen.clear()
    with torch.no_grad():
        assert torch.equal(op(x, b, scale), op(x, b, 1 / 3))  # bit-identical
        assert seen == [("forward", True), ("forward", False)]
        seen.clear()
        op(x, b, torch.tensor(1 / 3))  # a float32 tensor: its value read on the host
        assert seen == [("forward", False)]


def test_on_cuda_tensors_the_traced_call_makes_the_scalar_on_their_device(monkeypatch):
    """What torch.compile traces on CUDA tensors (fake ones here: no GPU needed): a 0-d float64
    tensor made on the tensors' device, passed to op_tensor_scalars; with scalars_in_memory=False,
    the Scalar to the op; on CPU tensors (by default), a CPU tensor."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for mode, device, expected in (("auto", "cuda", "cuda"), (False, "cuda", None), ("auto", "cpu", "cpu")):
        op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"), scalars_in_memory=mode)
        calls = []
        op.op_tensor_scalars = lambda *args: calls.append(("tensor", args[2]))
        op.op = lambda *args: calls.append(("scalar", args[2]))
        with FakeTensorMode():
            op(torch.empty(4, 7, device=device), torch.empty(7, device=device), 0.5)
        ((kind, scale),) = calls
        if expected is None:
            assert kind == "scalar" and scale == 0.5
        else:
            assert kind == "tensor" and scale.device.type == expected
            assert scale.dtype == torch.float64 and scale.dim() == 0


def test_scalars_in_memory_option_is_checked():
    with pytest.raises(ValueError, match="scalars_in_memory= takes 'auto', True or False"):
        fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"), scalars_in_memory="yes")
