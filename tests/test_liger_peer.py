"""Liger as a peer of `fusec bench` and `fusec bench --grad` (fusec.bench.liger), on the CPU:
which pipelines map to which of Liger's functions (by their parameters and what they compute,
not their names), with which arguments in which order, and the rows' notes when Liger is
missing, has no kernel, or cannot run here. A fake `liger_kernel.ops` stands in for Liger
(its Triton kernels need CUDA): each Function has Liger 0.8.5's positional parameters, checks
their kinds, records the call and computes what Liger's kernel computes in torch, so that a
wrong mapping (arguments swapped, outputs swapped) fails both the recorded call and the result."""
import dataclasses
import importlib.machinery
import json
import subprocess
import sys
import types

import numpy as np
import pytest
from helpers import ROOT, load_program

from fusec.bench import harness
from fusec.bench.liger import liger_kernel_for, liger_peer
from fusec.errors import Source
from fusec.frontend import check_source
from fusec.reference import run as reference

EXAMPLES = ROOT / "examples"

# (example, pipeline) -> (Liger's function, role -> parameter, output roles); every other example pipeline maps to none.
MAPPED = {
    ("rmsnorm", "rmsnorm"): ("LigerRMSNormFunction", {"x": 0, "w": 1, "eps": 2}, ("y",)),
    ("rmsnorm", "rmsnorm_bf16"): ("LigerRMSNormFunction", {"x": 0, "w": 1, "eps": 2}, ("y",)),
    ("layernorm", "layernorm"): ("LigerLayerNormFunction", {"x": 0, "w": 1, "b": 2, "eps": 3}, ("y", "mean", "rstd")),
    ("layernorm", "layernorm_bf16"): ("LigerLayerNormFunction", {"x": 0, "w": 1, "b": 2, "eps": 3}, ("y", "mean", "rstd")),
    ("softmax", "softmax"): ("LigerSoftmaxFunction", {"x": 0}, ("y",)),
    ("softmax", "softmax_bf16"): ("LigerSoftmaxFunction", {"x": 0}, ("y",)),
    ("bf16_swiglu", "swiglu"): ("LigerSiLUMulFunction", {"gate": 0, "up": 1}, ("y",)),
    ("mlp", "swiglu"): ("LigerSiLUMulFunction", {"gate": 0, "up": 1}, ("y",)),
    ("add_rmsnorm", "add_rmsnorm"): ("LigerFusedAddRMSNormFunction", {"x": 0, "residual": 1, "w": 2, "eps": 3}, ("h", "y")),
    ("add_rmsnorm", "add_rmsnorm_bf16"): ("LigerFusedAddRMSNormFunction", {"x": 0, "residual": 1, "w": 2, "eps": 3}, ("h", "y")),
    ("cross_entropy", "cross_entropy"): ("LigerCrossEntropyFunction", {"logits": 0, "label": 1}, ("loss", "mean")),
    ("cross_entropy", "cross_entropy_bf16"): ("LigerCrossEntropyFunction", {"logits": 0, "label": 1}, ("loss", "mean")),
}
# The call each makes: P(i) the pipeline's parameter i (the same tensor, or the same eps), Flat(i) its
# labels flattened to one a row, anything else Liger's other arguments as they must be passed.
P = type("P", (int,), {})
Flat = type("Flat", (int,), {})
CALLS = {
    "LigerRMSNormFunction": [P(0), P(1), P(2), 0.0, "llama", False],
    "LigerFusedAddRMSNormFunction": [P(0), P(1), P(2), P(3), 0.0, "llama", False],
    "LigerLayerNormFunction": [P(0), P(1), P(2), P(3)],
    "layer_norm_forward": [P(0), P(1), P(2), P(3)],
    "LigerSoftmaxFunction": [P(0)],
    "LigerSiLUMulFunction": [P(0), P(1)],
    "LigerCrossEntropyFunction": [P(0), Flat(1), None, -100, 0.0, 0.0, "none", None, False, False, False],
}


def program_of(text: str):
    return check_source(Source("test.fz", text))


def example(name: str):
    return load_program(EXAMPLES / f"{name}.fz")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.fz")), ids=lambda p: p.stem)
def test_each_example_maps_to_its_liger_function_or_none(path):
    program = load_program(path)
    for pipeline in program.pipelines:
        kernel = liger_kernel_for(program, pipeline.name)
        want = MAPPED.get((path.stem, pipeline.name))
        if want is None:
            assert kernel is None, (pipeline.name, kernel and kernel.spec.name)
            continue
        assert kernel is not None, pipeline.name
        assert (kernel.spec.name, kernel.params, kernel.outputs) == want


# ---- pipelines written otherwise: other names, other parameter and output orders

RENAMED = [
    ("""pipeline norm(inp: f32[n, d], eps: f32, scale: f32[d]) -> (out: f32[n, d]) {
    out = scale * inp / sqrt(row_mean(inp * inp) + eps);
}""", "LigerRMSNormFunction", {"x": 0, "w": 2, "eps": 1}, ("y",)),
    ("""pipeline ln(x: f32[r, c], bias: f32[c], gain: f32[c], e: f32) -> (y: f32[r, c]) {
    mu = row_mean(x);
    y = (x - mu) * rsqrt(row_var(x) + e) * gain + bias;
}""", "LigerLayerNormFunction", {"x": 0, "w": 2, "b": 1, "eps": 3}, ("y",)),
    ("""pipeline gate_mul(up: bf16[t, h], gate: bf16[t, h]) -> (out: bf16[t, h]) {
    out = up * (gate * sigmoid(gate));
}""", "LigerSiLUMulFunction", {"gate": 1, "up": 0}, ("y",)),
    ("""pipeline block_tail(a: f32[r, c], b: f32[r, c], g: f32[c], e: f32) -> (normed: f32[r, c], total: f32[r, c]) {
    total = a + b;
    normed = total * rsqrt(row_mean(total * total) + e) * g;
}""", "LigerFusedAddRMSNormFunction", {"x": 0, "residual": 1, "w": 2, "eps": 3}, ("y", "h")),
    ("""pipeline probabilities(z: f32[r, c]) -> (p: f32[r, c]) {
    p = exp(z - row_logsumexp(z));
}""", "LigerSoftmaxFunction", {"x": 0}, ("y",)),
    ("""pipeline nll(z: f32[n, v], t: i64[n, 1]) -> (l: f32[n, 1]) {
    l = t == -100 ? 0.0 : row_logsumexp(z) - row_pick(z, t);
}""", "LigerCrossEntropyFunction", {"logits": 0, "label": 1}, ("loss",)),
]

# Named as Liger's kernels, computing something else: none maps.
IMPOSTORS = {
    "eps doubled": """pipeline rmsnorm(x: f32[rows, cols], w: f32[cols], eps: f32) -> (y: f32[rows, cols]) {
    y = x * rsqrt(row_mean(x * x) + 2.0 * eps) * w;
}""",
    "eps baked in (the first probe's)": """pipeline rmsnorm(x: f32[rows, cols], w: f32[cols], eps: f32) -> (y: f32[rows, cols]) {
    y = x * rsqrt(row_mean(x * x) + 0.4 + 0.0 * eps) * w;
}""",
    "weight added": """pipeline rmsnorm(x: f32[rows, cols], w: f32[cols], eps: f32) -> (y: f32[rows, cols]) {
    y = x * rsqrt(row_mean(x * x) + eps) + w;
}""",
    "not centred": """pipeline layernorm(x: f32[rows, cols], w: f32[cols], b: f32[cols], eps: f32) -> (y: f32[rows, cols]) {
    y = x * rsqrt(row_mean(x * x) + eps) * w + b;
}""",
    "a log-softmax": """pipeline softmax(x: f32[rows, cols]) -> (y: f32[rows, cols]) {
    y = x - row_logsumexp(x);
}""",
    "sigmoid, not silu": """pipeline swiglu(a: f32[rows, cols], b: f32[rows, cols]) -> (y: f32[rows, cols]) {
    y = sigmoid(a) * b;
}""",
    "another ignore index": """pipeline cross_entropy(logits: f32[rows, vocab], label: i64[rows, 1]) -> (loss: f32[rows, 1]) {
    loss = label == -1 ? 0.0 : row_logsumexp(logits) - row_pick(logits, label);
}""",
    "y in another type": """pipeline rmsnorm(x: f32[rows, cols], w: f32[cols], eps: f32) -> (y: bf16[rows, cols]) {
    y = x * rsqrt(row_mean(x * x) + eps) * w;
}""",
}


@pytest.mark.parametrize("text,function,params,outputs", RENAMED, ids=[r[1] for r in RENAMED])
def test_a_kernel_written_otherwise_still_maps(text, function, params, outputs):
    program = program_of(text)
    kernel = liger_kernel_for(program, program.pipelines[0].name)
    assert kernel is not None
    assert (kernel.spec.name, kernel.params, kernel.outputs) == (function, params, outputs)


@pytest.mark.parametrize("text", IMPOSTORS.values(), ids=list(IMPOSTORS))
def test_a_pipeline_that_only_has_the_name_does_not_map(text):
    program = program_of(text)
    assert liger_kernel_for(program, program.pipelines[0].name) is None


# ---- a fake liger_kernel: Liger 0.8.5's signatures (liger_kernel/ops/*.py), its maths in torch

@pytest.fixture
def fake_liger(monkeypatch):
    """Installs a fake `liger_kernel.ops`; returns the list its calls are recorded in: (name, args)."""
    torch = pytest.importorskip("torch")
    calls = []

    def tensor(t, dims):
        assert isinstance(t, torch.Tensor) and t.dim() == dims, t

    def number(v):
        assert isinstance(v, float) and not isinstance(v, bool), v

    def rms(X, eps):
        return torch.rsqrt((X.float() ** 2).mean(-1, keepdim=True) + eps)

    def rms_norm(X, W, eps, offset=0.0, casting_mode="llama", in_place=True, row_mode=None):
        tensor(X, 2), tensor(W, 1), number(eps)
        assert offset == 0.0 and casting_mode == "llama" and in_place is False and row_mode is None
        return (X.float() * rms(X, eps)).to(X.dtype) * (offset + W)  # llama: only the rstd in f32

    def fused_add_rms_norm(X, R, W, eps, offset=0.0, casting_mode="llama", in_place=False):
        tensor(X, 2), tensor(R, 2), tensor(W, 1), number(eps)
        assert offset == 0.0 and casting_mode == "llama" and in_place is False
        S = X + R
        return (S.float() * rms(S, eps)).to(X.dtype) * (offset + W), S

    def layer_norm_forward(X, W, B, eps):
        tensor(X, 2), tensor(W, 1), tensor(B, 1), number(eps)
        x = X.float()
        mean = x.mean(-1)
        rstd = torch.rsqrt(x.var(-1, unbiased=False) + eps)
        Y = ((x - mean[:, None]) * rstd[:, None] * W.float() + B.float()).to(X.dtype)
        return Y, X, mean, rstd, 1024, 4

    def layer_norm(X, W, B, eps):
        return layer_norm_forward(X, W, B, eps)[0]

    def softmax(input_):
        tensor(input_, 2)
        return torch.softmax(input_.float(), -1).to(input_.dtype)

    def silu_mul(a, b, gate_multiplier=1.0, down_multiplier=1.0):
        tensor(a, 2), tensor(b, 2)
        assert gate_multiplier == 1.0 and down_multiplier == 1.0
        return (torch.nn.functional.silu(a.float()) * b.float()).to(a.dtype)

    def cross_entropy(_input, target, weight, ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0,
                      reduction="mean", softcap=None, return_z_loss=False, return_token_accuracy=False,
                      return_predicted_tokens=False):
        tensor(_input, 2), tensor(target, 1)
        assert target.dtype == torch.int64 and weight is None and lse_square_scale == 0.0 and label_smoothing == 0.0
        assert softcap is None and not (return_z_loss or return_token_accuracy or return_predicted_tokens)
        counted = target != ignore_index
        picked = _input.float().gather(-1, torch.where(counted, target, 0)[:, None])[:, 0]
        loss = torch.where(counted, torch.logsumexp(_input.float(), -1) - picked, 0.0).to(_input.dtype)
        if reduction != "none":
            loss = loss.sum() / counted.sum() if reduction == "mean" else loss.sum()
        return loss, None, None, None

    def function(name, forward):
        def apply(*args):
            calls.append((name, args))
            return forward(*args)
        return type(name, (), {"apply": staticmethod(apply)})

    ops = types.ModuleType("liger_kernel.ops")
    ops.LigerRMSNormFunction = function("LigerRMSNormFunction", rms_norm)
    ops.LigerFusedAddRMSNormFunction = function("LigerFusedAddRMSNormFunction", fused_add_rms_norm)
    ops.LigerLayerNormFunction = function("LigerLayerNormFunction", layer_norm)
    ops.LigerSoftmaxFunction = function("LigerSoftmaxFunction", softmax)
    ops.LigerSiLUMulFunction = function("LigerSiLUMulFunction", silu_mul)
    ops.LigerCrossEntropyFunction = function("LigerCrossEntropyFunction", cross_entropy)
    ops.layer_norm_forward = function("layer_norm_forward", layer_norm_forward).apply
    package = types.ModuleType("liger_kernel")
    package.__path__ = []
    package.__spec__ = importlib.machinery.ModuleSpec("liger_kernel", None, is_package=True)
    package.ops = ops
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.ops", ops)
    return calls


def probe_args(pipeline, rows=8, cols=64, seed=3):
    """Random arguments (some labels the ignore index), and the same as torch tensors."""
    import torch
    rng = np.random.default_rng(seed)
    args = []
    for p in pipeline.params:
        if p.shape is None:
            args.append(1e-2)
        elif p.type.is_int:
            label = rng.integers(0, cols, (rows, 1))
            label[::3] = -100
            args.append(label.astype(p.type.numpy_dtype))
        else:
            shape = (rows, cols) if len(p.shape) == 2 else (cols,)
            args.append((rng.standard_normal(shape) + 0.2).astype(np.float32).astype(p.type.numpy_dtype))

    def as_tensor(a):
        if not isinstance(a, np.ndarray):
            return a
        if a.dtype.itemsize == 2 and a.dtype.kind == "V" or str(a.dtype) == "bfloat16":
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy())
    return args, [as_tensor(a) for a in args]


def run_peer(program, name, calls, kernel=None):
    """The Liger peer's outputs on random arguments, the reference's, and the one call it made."""
    pipeline = program.pipeline(name)
    if kernel is None:
        function, note = liger_peer(program, name, "cuda")
        assert function is not None, note
    else:
        function = kernel.function()
    args, tensors = probe_args(pipeline)
    calls.clear()
    got = harness._tuple(function(*tensors))
    expected = harness._tuple(reference(program, name, *[a.copy() if isinstance(a, np.ndarray) else a for a in args]))
    return got, expected, tensors


def assert_called(calls, function, tensors):
    import torch
    (called, args), = calls
    assert called == function
    want = CALLS[function]
    assert len(args) == len(want), args
    for actual, w in zip(args, want):
        if isinstance(w, Flat):
            assert torch.equal(actual, tensors[w].reshape(-1)) and actual.dim() == 1, (called, args)
        elif isinstance(w, P):
            assert actual is tensors[w] or (not isinstance(actual, torch.Tensor) and actual == tensors[w]), (called, args)
        else:
            assert actual == w and type(actual) is type(w), (called, args)


@pytest.mark.parametrize("key", list(MAPPED), ids=["/".join(k) for k in MAPPED])
def test_each_example_calls_liger_with_its_arguments_in_order_and_agrees_with_the_reference(fake_liger, key):
    program = example(key[0])
    kernel = liger_kernel_for(program, key[1])
    got, expected, tensors = run_peer(program, key[1], fake_liger)
    function = "layer_norm_forward" if len(kernel.outputs) == 3 else kernel.spec.name
    assert_called(fake_liger, function, tensors)
    assert harness.outputs_mismatch(program.pipeline(key[1]), got, expected, "the reference's") is None


@pytest.mark.parametrize("text,function,params,outputs", RENAMED, ids=[r[1] for r in RENAMED])
def test_a_kernel_written_otherwise_is_called_in_its_order(fake_liger, text, function, params, outputs):
    program = program_of(text)
    name = program.pipelines[0].name
    got, expected, tensors = run_peer(program, name, fake_liger)
    (called, args), = fake_liger
    assert called == function
    order = [role for role, _ in liger_kernel_for(program, name).spec.params]  # Liger's positional order
    for role, i in params.items():
        actual = args[order.index(role)]
        assert actual is tensors[i] or (role == "label" and actual.shape == (8,)) or actual == tensors[i], (role, args)
    assert harness.outputs_mismatch(program.pipeline(name), got, expected, "the reference's") is None


# A wrong mapping: weight and eps swapped, weight and bias swapped, gate and up swapped, the outputs swapped.
WRONG = [
    ("rmsnorm", "rmsnorm", {"params": {"x": 0, "w": 2, "eps": 1}}),
    ("layernorm", "layernorm", {"params": {"x": 0, "w": 2, "b": 1, "eps": 3}}),
    ("bf16_swiglu", "swiglu", {"params": {"gate": 1, "up": 0}}),
    ("add_rmsnorm", "add_rmsnorm", {"outputs": ("y", "h")}),
    ("layernorm", "layernorm", {"outputs": ("y", "rstd", "mean")}),
    ("cross_entropy", "cross_entropy", {"params": {"logits": 0, "label": 1}, "outputs": ("loss",)}),
]


@pytest.mark.parametrize("example_name,name,change", WRONG, ids=[f"{w[0]}-{'-'.join(w[2])}" for w in WRONG])
def test_a_wrong_mapping_is_caught(fake_liger, example_name, name, change):
    program = example(example_name)
    kernel = dataclasses.replace(liger_kernel_for(program, name), **change)
    try:
        got, expected, _ = run_peer(program, name, fake_liger, kernel)
    except (AssertionError, TypeError, RuntimeError, IndexError):
        return  # the fake refused the arguments
    assert harness.outputs_mismatch(program.pipeline(name), got, expected, "the reference's") is not None


# ---- the rows' notes

def test_without_liger_the_peer_is_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # `import liger_kernel` fails
    assert liger_peer(example("rmsnorm"), "rmsnorm", "cuda") == (None, "skipped: Liger is not installed")
    assert liger_peer(example("rmsnorm"), "rmsnorm", "cuda", grad=True) == (None, "skipped: Liger is not installed")


def test_with_liger_the_notes_say_why_a_pipeline_has_no_peer(fake_liger):
    program = example("log_softmax")
    assert liger_peer(program, "log_softmax", "cuda") == (None, "skipped: Liger has no kernel for this pipeline")
    assert liger_peer(example("rmsnorm"), "rmsnorm", "sim") == (None, "skipped: Liger's Triton kernels run on CUDA only")
    assert liger_peer(example("rmsnorm"), "rmsnorm", "numpy", grad=True)[1] == \
        "skipped: Liger's Triton kernels run on CUDA only"
    function, note = liger_peer(example("cross_entropy"), "cross_entropy", "cuda", grad=True)
    assert function is None and note.startswith("skipped: Liger has no kernel for this pipeline's forward + backward")
    function, note = liger_peer(example("cross_entropy"), "cross_entropy", "cuda")
    assert function is not None and note.startswith("liger_kernel.ops.LigerCrossEntropyFunction (reduction none")


@pytest.mark.parametrize("installed", [False, True], ids=["without_liger", "with_liger"])
def test_bench_grad_rows_name_liger(run_cli, tmp_path, monkeypatch, request, installed):
    """`fusec bench --grad` (numpy backend) takes the shared mapping: its Liger row's note."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "compile", lambda fn: fn)  # not what this test is about: quicker
    if installed:
        request.getfixturevalue("fake_liger")
    else:
        monkeypatch.setitem(sys.modules, "liger_kernel", None)
    out = tmp_path / "rows.json"
    code, stdout, stderr = run_cli("bench", "--grad", str(EXAMPLES / "rmsnorm.fz"), "--pipeline", "rmsnorm",
                                   "--backend", "numpy", "--sizes", "1024", "--row-length", "64", "--json", str(out))
    assert code == 0, stderr
    (row,) = [r for r in json.loads(out.read_text()) if r["variant"] == "Liger"]
    want = "skipped: Liger's Triton kernels run on CUDA only" if installed else "skipped: Liger is not installed"
    assert row["us_per_call"] is None and row["note"] == want, row


# ---- the forward bench's check of the peer (Bench._check_peer), with NumPy standing in for CuPy

def forward_bench(program, name, row_length=64):
    torch = pytest.importorskip("torch")
    bench = object.__new__(harness.Bench)
    bench.program, bench.name, bench.pipeline, bench.row_length = program, name, program.pipeline(name), row_length
    bench.cp, bench._torch = np, torch  # NumPy has the CuPy names the check uses
    return bench


@pytest.mark.parametrize("key", [("rmsnorm", "rmsnorm"), ("layernorm", "layernorm"), ("cross_entropy", "cross_entropy"),
                                 ("add_rmsnorm", "add_rmsnorm")], ids=lambda k: k[1])
def test_the_forward_bench_checks_liger_before_timing(fake_liger, key):
    program = example(key[0])
    bench = forward_bench(program, key[1])
    function, _ = liger_peer(program, key[1], "cuda")
    size = 4096
    args = harness.make_args(np, bench.pipeline, harness.dims_for(bench.pipeline, size, 64), seed=5)
    fused = harness._tuple(reference(program, key[1], *[a.copy() if isinstance(a, np.ndarray) else a for a in args]))
    peer = lambda a: function(*a)  # noqa: E731 (as Bench._peers makes it)
    assert bench._check_peer("Liger", peer, size, args, fused) is None
    assert len(fake_liger) == 2  # once against the reference (a smaller call), once against fused
    wrong = tuple(f * 1.1 if f.dtype.kind == "f" else f for f in fused)
    assert bench._check_peer("Liger", peer, size, args, wrong).startswith("not timed: output ")
    assert "differs from fusec fused's" in bench._check_peer("Liger", peer, size, args, wrong)


def test_the_forward_bench_reports_a_wrong_liger_against_the_reference(fake_liger):
    program = example("layernorm")
    bench = forward_bench(program, "layernorm")
    kernel = dataclasses.replace(liger_kernel_for(program, "layernorm"), params={"x": 0, "w": 2, "b": 1, "eps": 3})
    function = kernel.function()
    args = harness.make_args(np, bench.pipeline, harness.dims_for(bench.pipeline, 4096, 64), seed=5)
    note = bench._check_peer("Liger", lambda a: function(*a), 4096, args, ())
    assert note.startswith("not timed: output y differs from the reference's"), note


def test_rows_device_script_carries_liger():
    text = (ROOT / "benchmarks" / "rows_device.sh").read_text()
    assert ".whl" in text and "liger_kernel" in text
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "rows_device.sh")]).returncode == 0
