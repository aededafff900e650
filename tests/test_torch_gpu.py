"""The gpu tier for PyTorch (marker `gpu`; skipped without a device): CUDA
tensors in give CUDA tensors out on every call path; calls run on torch's
current stream (a side stream, a torch.cuda.graph capture); fusec.torch_op in
torch.compile(fullgraph=True) models, captured by mode="reduce-overhead"."""
import itertools

import numpy as np
import pytest
from helpers import ROOT

import fusec
from fusec.errors import ArgumentError

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

_names = itertools.count()
# f32 on the GPU: libdevice math within a few ulp, and FMA contraction (README, Accuracy)
F32 = {"rtol": 1e-4, "atol": 1e-5}
BF16 = {"rtol": 1.6e-2, "atol": 1e-2}

BIAS_GELU = """
pipeline bias_gelu(x: f32[rows, cols], b: f32[cols], scale: f32) -> (y: f32[rows, cols]) {
    h = x + b;
    y = scale * 0.5 * h * (1.0 + tanh(0.7978845608 * (h + 0.044715 * h * h * h)));
}
"""


def unique(name: str) -> str:
    return f"fusec_gpu_test::{name}_{next(_names)}"


def bias_gelu_torch(x, b, scale):
    h = x + b
    return scale * 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def test_cuda_tensors_in_give_cuda_tensors_out_on_every_call_path():
    """Checked, recorded (second call) and replayed (third call on): torch
    tensors on the input's device, bf16 as torch.bfloat16; out= tensors come
    back as given; CuPy in gives CuPy out."""
    f = fusec.jit(str(ROOT / "examples/scale_bias_relu.fz"), backend="cuda")
    x = torch.linspace(-2, 2, 1001, device="cuda")
    for _ in range(4):
        y = f(x, 2.0, 0.5)
        assert type(y) is torch.Tensor and y.device == x.device and y.dtype == torch.float32
        torch.testing.assert_close(y, torch.relu(x * 2 + 0.5), **F32)
    swiglu = fusec.jit(str(ROOT / "examples/bf16_swiglu.fz"), backend="cuda")
    gate, up = (torch.randn(8, 96, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(4):
        out = swiglu(gate, up)
        assert type(out) is torch.Tensor and out.dtype == torch.bfloat16
        expected = (gate.float() * torch.sigmoid(gate.float())).bfloat16().float() * up.float()
        torch.testing.assert_close(out.float(), expected, **BF16)
    given = torch.empty(8, 96, device="cuda", dtype=torch.bfloat16)
    assert swiglu(gate, up, out=given) is given
    assert torch.equal(given, out)
    z = f(cp.linspace(-2, 2, 1001, dtype=cp.float32), 2.0, 0.5)
    assert type(z) is cp.ndarray


def test_inout_cuda_tensors_are_updated_in_place():
    adam = fusec.jit(str(ROOT / "examples/adam.fz"), backend="cuda")
    p, g = torch.randn(4097, device="cuda"), torch.randn(4097, device="cuda")
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    reference = p.clone()
    address = p.data_ptr()
    for _ in range(3):
        adam(p, g, m, v, 0.1, 0.0, 0.0, 1.0, 1.0, 1.0)  # m = g, v = g*g: p -= 0.1 * g / (|g| + 1)
        reference -= 0.1 * g / (g.abs() + 1.0)
    assert p.data_ptr() == address
    torch.testing.assert_close(p, reference, **F32)


def test_kinds_do_not_mix_and_cpu_tensors_are_refused():
    f = fusec.jit(str(ROOT / "examples/dag.fz"), backend="cuda")
    a = torch.ones(10, device="cuda")
    with pytest.raises(ArgumentError, match=r"is a cupy.ndarray, but parameter '\w+' is a torch.Tensor"):
        f(a, cp.ones(10, cp.float32), a)
    with pytest.raises(ArgumentError, match=r"the tensor is on the cpu; the cuda backend takes CUDA tensors"):
        f(a, torch.ones(10), a)


def test_tensor_calls_run_on_torch_current_stream():
    """On a side stream that is still busy when the call is made: the call,
    on every path, reads the input written there and writes an output that the
    next op there reads, without any synchronization by the caller."""
    f = fusec.jit(str(ROOT / "examples/scale_bias_relu.fz"), backend="cuda")
    x = torch.zeros(1 << 24, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    results = []
    for value in (1.0, 2.0, 3.0, 4.0):
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # ~10 ms of the side stream before the write
            x.fill_(value)
            y = f(x, 1.5, 0.5)
            results.append(y + 1)  # reads y on the side stream
    torch.cuda.current_stream().wait_stream(side)
    for value, z in zip((1.0, 2.0, 3.0, 4.0), results):
        assert float(z.min()) == float(z.max()) == 1.5 * value + 0.5 + 1


def test_torch_cuda_graph_captures_a_call():
    """torch.cuda.graph captures a call made on its capturing stream: a launch on
    any other stream, or a synchronizing import, would fail the capture; the
    replay reads x's new contents and writes the output allocated in the capture."""
    f = fusec.jit(str(ROOT / "examples/scale_bias_relu.fz"), backend="cuda", fuse=False)  # 3 kernels, 2 temporaries
    x = torch.randn(1 << 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, record) off the default stream, as torch's docs ask
        for _ in range(3):
            f(x, 2.0, 0.5)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = f(x, 2.0, 0.5)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.testing.assert_close(y, torch.relu(x * 2 + 0.5), **F32)


class BiasGeluMLP(torch.nn.Module):
    def __init__(self, op, width: int):
        super().__init__()
        self.op = op
        self.linear = torch.nn.Linear(width, width)
        self.bias = torch.nn.Parameter(torch.randn(width))

    def forward(self, x, scale):
        return self.op(self.linear(x), self.bias, scale)

    def reference(self, x, scale):
        return bias_gelu_torch(self.linear(x), self.bias, scale)


@torch.no_grad()
def test_op_in_a_compiled_model_on_cuda():
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"))
    model = BiasGeluMLP(op, 256).cuda()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(64, 256, device="cuda")
    for scale in (0.5, 0.75, 1.25):
        torch.testing.assert_close(compiled(x, scale), model.reference(x, scale), **F32)
    torch.library.opcheck(op.op, (x, model.bias, 0.5))


@torch.no_grad()
def test_reduce_overhead_captures_and_replays_the_op():
    """mode="reduce-overhead": torch's CUDA graphs capture the op (no cudagraph
    skip) and replays compute from each call's inputs; a multi-kernel form
    (unfused: temporaries from torch's allocator, in the graph's pool) too."""
    for fuse in (True, False):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"), fuse=fuse)
        model = BiasGeluMLP(op, 256).cuda()
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for step in range(6):
            x = torch.randn(64, 256, device="cuda")
            y = compiled(x, 0.5).clone()  # a replay overwrites its outputs
            torch.testing.assert_close(y, model.reference(x, 0.5), **F32)
        assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0


@torch.no_grad()
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_new_learning_rate_is_never_replayed_stale(mode):
    """Every value of a float argument is used, in either mode. From torch 2.13
    on, compilations stop at two (the first value as a constant, then the float
    as a symbolic input, which a custom op's Scalar takes unguarded); torch
    2.11's Dynamo still specializes a symbolic float passed to a custom op, so
    there each value compiles (seen on the lent H200: 5 values, 5 graphs)."""
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"))
    model = BiasGeluMLP(op, 128).cuda()
    compiled = torch.compile(model, mode=mode, fullgraph=True)
    x = torch.randn(32, 128, device="cuda")
    for scale in np.linspace(0.1, 1.0, 7):
        y = compiled(x, float(scale)).clone()
        torch.testing.assert_close(y, model.reference(x, float(scale)), **F32)
    if torch.__version__ >= "2.13":
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


@torch.no_grad()
def test_bf16_op_in_and_out_under_compile():
    swiglu = fusec.torch_op(str(ROOT / "examples/bf16_swiglu.fz"), name=unique("swiglu"))

    def mlp(x, w_gate, w_up):
        return swiglu(x @ w_gate, x @ w_up)

    x = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    w_gate, w_up = (torch.randn(64, 128, device="cuda", dtype=torch.bfloat16) / 8 for _ in range(2))
    out = torch.compile(mlp, fullgraph=True)(x, w_gate, w_up)
    assert out.dtype == torch.bfloat16 and out.device == x.device
    gate, up = (x @ w_gate).float(), (x @ w_up).float()
    torch.testing.assert_close(out.float(), (gate * torch.sigmoid(gate)).bfloat16().float() * up, **BF16)


@torch.no_grad()
def test_op_runs_on_a_side_stream():
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"))
    x = torch.zeros(1024, 4096, device="cuda")
    b = torch.zeros(4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    results = []
    for value in (1.0, -1.0, 2.0):
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)
            x.fill_(value)
            results.append(op(x, b, 1.0) * 2)
    torch.cuda.current_stream().wait_stream(side)
    for value, z in zip((1.0, -1.0, 2.0), results):
        expected = 2 * bias_gelu_torch(torch.tensor(value), torch.tensor(0.0), 1.0).item()
        assert abs(float(z.min()) - expected) <= 1e-5 and abs(float(z.max()) - expected) <= 1e-5


# ---- float scalars read from device memory (scalars_in_memory): a new learning rate on CUDA


def test_scalars_in_memory_on_the_gpu_are_bit_identical_to_by_value():
    """The cuda backend's kernels reading 0-d float64 CUDA tensors, against the by-value module;
    on every call path (a new value each call); wrong arrays named. A memory scalar is one of
    the call's arrays (README): a CuPy one beside torch tensors is refused as two kinds."""
    source = """
pipeline p(x: bf16[n], s: bf16, t: f32) -> (y: f32[n]) {
    y = f32(x) * s + t;
}"""
    by_value = fusec.jit(source, backend="cuda")
    in_memory = fusec.jit(source, backend="cuda", scalars_in_memory=True)
    x = torch.linspace(-3, 3, 4099, device="cuda").to(torch.bfloat16)
    t = torch.tensor(0.125, dtype=torch.float64, device="cuda")
    for s in (0.0, 1 / 3, 1 + 2 ** -8 + 2 ** -30, -2.5, 1e-39):
        expected = by_value(x, s, 0.125)
        found = in_memory(x, torch.tensor(s, dtype=torch.float64, device="cuda"), t)
        assert torch.equal(found, expected), s
    with pytest.raises(ArgumentError, match=r"parameter 's' \(bf16\) is read from device memory.*on the cpu"):
        in_memory(x, torch.tensor(0.5, dtype=torch.float64), t)
    with pytest.raises(ArgumentError, match=r"parameter 't'.*(NumPy array is in host memory|numpy\.ndarray)"):
        in_memory(x, torch.tensor(0.5, dtype=torch.float64, device="cuda"), np.array(0.125))
    with pytest.raises(ArgumentError, match=r"parameter 't' is a cupy\.ndarray, but parameter 'x' is a torch\.Tensor"):
        in_memory(x, torch.tensor(0.5, dtype=torch.float64, device="cuda"), cp.asarray(np.float64(0.125)))
    with pytest.raises(ArgumentError, match=r"parameter 's' \(bf16\).*not a float"):
        in_memory(x, 0.5, t)


def _learning_rate_model(op):
    model = BiasGeluMLP(op, 128).cuda()
    return model, torch.randn(32, 128, device="cuda")


def test_a_new_learning_rate_reads_device_memory_and_does_not_recompile():
    """torch.compile(fullgraph=True) on CUDA tensors, forward and backward: five values, two
    compilations (the first value as a constant, then the float as an input); the op's kernels
    (forward and backward) read the value from device memory; results and gradients as eager."""
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"))
    runs = []
    for target in (op, op.backward):
        run = target._execute
        target._execute = lambda args, in_memory=False, run=run: runs.append(in_memory) or run(args, in_memory)
    model, x = _learning_rate_model(op)
    compiled = torch.compile(model, fullgraph=True)
    for scale in (0.1, 0.2, 0.3, 0.4, 0.5):
        runs.clear()
        y = compiled(x, scale)
        (grad,) = torch.autograd.grad(y.sum(), model.bias)
        assert runs == [True, True]  # the forward and its backward, each reading memory
        expected = model.reference(x, scale)
        (want,) = torch.autograd.grad(expected.sum(), model.bias)
        torch.testing.assert_close(y, expected, **F32)
        torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


@torch.no_grad()
def test_a_new_learning_rate_under_reduce_overhead():
    """mode="reduce-overhead": every value used (a stale one, baked into a captured graph, fails);
    two graphs (the first value as a constant, then the float as an input) and no cudagraph
    skipped (measured on the H200: 2 and 0)."""
    op = fusec.torch_op(BIAS_GELU, name=unique("bias_gelu"))
    model, x = _learning_rate_model(op)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(2):  # each value twice: warm-up, record, replay
        for scale in (0.1, 0.2, 0.3, 0.4, 0.5):
            y = compiled(x, scale).clone()  # a replay overwrites its outputs
            torch.testing.assert_close(y, model.reference(x, scale), **F32)
    counters = torch._dynamo.utils.counters
    assert (counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]) == (2, 0)
