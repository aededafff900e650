"""Trains a small MLP model built from fusec ops against its pure-torch twin,
both under torch.compile(fullgraph=True), and checks that their losses agree
within 1e-4 (relative) at every step.

The fused ops are examples/mlp.fz's pipelines (and examples/rmsnorm.fz's
RMSNorm), each a `fusec.torch_op` whose backward is the pipeline fusec derives
from the source, so `loss.backward()` runs fusec's fused backward kernels:

    x = embed(inputs);  z = rmsnorm(x, w0)                                    # fusec rmsnorm
    block 1:  d = down1(bias_gelu(up1(z), b1))                               # fusec bias-GELU (tanh or erf)
              x, z = bias_residual_rmsnorm(d, c1, x, w1)                     # fusec tail: x + d + c1, RMSNorm
    block 2:  d = down2(swiglu(gate2(z), up2(z)))                            # fusec SwiGLU: silu(a) * b
              x, z = bias_residual_rmsnorm(d, c2, x, w2)
    loss = mse(head(z), targets)

The twin is the same module with torch's functions in place of the fusec ops
(F.gelu, F.silu, F.rms_norm) and the same initial parameters. Both train on the
same batches (inputs from the seed, targets from a fixed random "teacher")
with the same torch optimizer (SGD with momentum, or AdamW). The checks: at
step 1, every parameter's gradient (relative to its largest) and, at every
step, the loss. Exit status 0 only when both pass.

Commands (from the repository root):

    python examples/train_mlp.py
        100 steps on CUDA (the cuda backend) where torch sees a GPU, else on the
        CPU with fusec's sim backend (the emitted CUDA C run on the CPU).

    python examples/train_mlp.py --backend sim --steps 5 --no-compile
        CPU tensors, the sim backend (--backend numpy: fusec's NumPy reference),
        eager mode.

Options: --steps N (100), --backend auto|cuda|sim|numpy, --no-compile,
--compile-backend (inductor; aot_eager skips Inductor's code generation),
--gelu tanh|erf, --optimizer sgd|adamw, --lr, --batch, --inputs, --dim,
--hidden, --outputs, --seed, --rtol (1e-4), --every (rows of the table).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fusec

EXAMPLES = Path(__file__).resolve().parent
RTOL = 1e-4  # losses of the fusec model against its pure-torch twin, relative, at every step
GRAD_RTOL = 1e-4  # step 1's gradients, relative to each parameter's largest
EPS = 1e-6


# ---- the two sets of ops: fusec's (torch custom ops, derived backward) and torch's


_OPS: dict[str, dict] = {}


def fusec_ops(backend: str) -> dict:
    """The fusec ops, registered once per process for `backend` (where CPU tensors
    run: sim or numpy; CUDA tensors run on fusec's cuda backend)."""
    if backend not in _OPS:
        options = {} if backend == "cuda" else {"backend": backend}
        mlp = str(EXAMPLES / "mlp.fz")

        def op(name, path=mlp):
            return fusec.torch_op(path, name=f"train_mlp::{name}_{backend}", pipeline=name, **options)
        _OPS[backend] = {"bias_gelu": op("bias_gelu"), "bias_gelu_erf": op("bias_gelu_erf"),
                         "swiglu": op("swiglu"), "bias_residual_rmsnorm": op("bias_residual_rmsnorm"),
                         "rmsnorm": op("rmsnorm", str(EXAMPLES / "rmsnorm.fz"))}
    return _OPS[backend]


def _rms_norm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def _bias_residual_rmsnorm(d, b, residual, w, eps):
    h = d + b + residual
    return h, _rms_norm(h, w, eps)


TORCH_OPS = {"bias_gelu": lambda h, b: F.gelu(h + b, approximate="tanh"),
             "bias_gelu_erf": lambda h, b: F.gelu(h + b),
             "swiglu": lambda a, b: F.silu(a) * b,
             "bias_residual_rmsnorm": _bias_residual_rmsnorm,
             "rmsnorm": _rms_norm}


class MLPNet(torch.nn.Module):
    """Two pre-norm MLP blocks (GELU, then SwiGLU) and a linear head; `ops` says whose
    fused ops it calls (fusec's or torch's)."""

    def __init__(self, inputs: int, dim: int, hidden: int, outputs: int, ops: dict, gelu: str = "tanh"):
        super().__init__()
        linear = torch.nn.Linear
        self.embed = linear(inputs, dim)
        self.w0 = torch.nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.up1, self.down1 = linear(dim, hidden, bias=False), linear(hidden, dim, bias=False)
        self.b1 = torch.nn.Parameter(0.1 * torch.randn(hidden))
        self.c1, self.w1 = torch.nn.Parameter(0.1 * torch.randn(dim)), torch.nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.gate2, self.up2 = linear(dim, hidden, bias=False), linear(dim, hidden, bias=False)
        self.down2 = linear(hidden, dim, bias=False)
        self.c2, self.w2 = torch.nn.Parameter(0.1 * torch.randn(dim)), torch.nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.head = linear(dim, outputs)
        self.ops = ops
        self.gelu = ops["bias_gelu" if gelu == "tanh" else "bias_gelu_erf"]

    def forward(self, inputs, targets):
        ops = self.ops
        x = self.embed(inputs)
        z = ops["rmsnorm"](x, self.w0, EPS)
        d = self.down1(self.gelu(self.up1(z), self.b1))
        x, z = ops["bias_residual_rmsnorm"](d, self.c1, x, self.w1, EPS)
        d = self.down2(ops["swiglu"](self.gate2(z), self.up2(z)))
        x, z = ops["bias_residual_rmsnorm"](d, self.c2, x, self.w2, EPS)
        return F.mse_loss(self.head(z), targets)


# ---- data: each step's batch from the seed alone


def batch(step: int, args) -> tuple[torch.Tensor, torch.Tensor]:
    teacher = torch.randn(args.inputs, args.outputs, generator=torch.Generator().manual_seed(args.seed + 1))
    x = torch.randn(args.batch, args.inputs, generator=torch.Generator().manual_seed(args.seed * 100_003 + step))
    return x, torch.tanh(x @ teacher / math.sqrt(args.inputs))


def build(args, device):
    """(fusec model, torch twin), with the same initial parameters."""
    torch.manual_seed(args.seed)
    size = (args.inputs, args.dim, args.hidden, args.outputs)
    model = MLPNet(*size, fusec_ops(args.backend), args.gelu).to(device)
    twin = MLPNet(*size, TORCH_OPS, args.gelu).to(device)
    twin.load_state_dict(model.state_dict())
    return model, twin


def optimizer_for(model, args):
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-2)


def train(args, device) -> dict:
    """Trains the model and its twin side by side; returns both loss curves and step 1's
    gradient differences (name -> max |difference| / max |twin's gradient|)."""
    model, twin = build(args, device)
    optimizers = [optimizer_for(m, args) for m in (model, twin)]
    compile_options = {"fullgraph": True, "backend": args.compile_backend}
    steps = [torch.compile(m, **compile_options) if args.compile else m for m in (model, twin)]
    losses: list[list[float]] = [[], []]
    grads = {}
    for step in range(args.steps):
        x, y = (t.to(device) for t in batch(step, args))
        for run, optimizer, curve in zip(steps, optimizers, losses):
            optimizer.zero_grad(set_to_none=False)
            loss = run(x, y)
            loss.backward()
            curve.append(loss.item())
        if step == 0:
            for (name, p), q in zip(model.named_parameters(), twin.parameters()):
                grads[name] = ((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)).item()
        for optimizer in optimizers:
            optimizer.step()
    return {"fusec": losses[0], "torch": losses[1], "grads": grads}


# ---- the checks


def relative(a: list[float], b: list[float]) -> list[float]:
    return [abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b)]


def verdict(result: dict, rtol: float = RTOL, grad_rtol: float = GRAD_RTOL) -> tuple[bool, list[str]]:
    ours, theirs, grads = result["fusec"], result["torch"], result["grads"]
    rel = relative(ours, theirs)
    finite = all(map(math.isfinite, ours + theirs))
    losses_ok = bool(rel) and len(ours) == len(theirs) and finite and all(r <= rtol for r in rel)
    worst = max(range(len(rel)), key=rel.__getitem__) if rel else None
    lines = [f"losses: {'PASS' if losses_ok else 'FAIL'}: {len(rel)} steps, max relative difference "
             + (f"{rel[worst]:.3e} (step {worst + 1})" if rel else "-") + f", limit {rtol:.0e}"
             + ("" if finite else "; NOT FINITE")]
    grads_ok = bool(grads) and all(g <= grad_rtol for g in grads.values())
    if grads:
        name = max(grads, key=grads.get)
        lines.append(f"gradients at step 1: {'PASS' if grads_ok else 'FAIL'}: {len(grads)} parameters, max |difference| "
                     f"/ max |gradient| {grads[name]:.3e} ({name}), limit {grad_rtol:.0e}")
    else:
        lines.append("gradients at step 1: FAIL: no step ran")
    return losses_ok and grads_ok, lines


def print_table(result: dict, every: int):
    ours, theirs = result["fusec"], result["torch"]
    rel = relative(ours, theirs)
    worst = max(range(len(rel)), key=rel.__getitem__) if rel else -1
    print(f"{'step':>5}  {'fusec':>14}  {'torch':>14}  {'rel diff':>9}")
    for i, (a, b, r) in enumerate(zip(ours, theirs, rel)):
        if i == 0 or i == len(rel) - 1 or i == worst or (i + 1) % every == 0:
            print(f"{i + 1:>5}  {a:14.8f}  {b:14.8f}  {r:9.2e}{'  (max)' if i == worst else ''}")
    sys.stdout.flush()


# ---- the run


def resolve_backend(backend: str) -> tuple[str, torch.device]:
    """The fusec backend and the device its tensors live on."""
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "sim"
    if backend == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--backend cuda needs a CUDA device (use --backend sim on a machine without one)")
        return backend, torch.device("cuda", torch.cuda.current_device())
    return backend, torch.device("cpu")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--backend", choices=["auto", "cuda", "sim", "numpy"], default="auto",
                   help="fusec's backend: cuda (CUDA tensors), or sim/numpy (CPU tensors); auto: cuda if torch "
                        "sees a GPU, else sim")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="train in eager mode")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (inductor)")
    p.add_argument("--gelu", choices=["tanh", "erf"], default="tanh")
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--lr", type=float, default=None, help="default: 0.05 for sgd, 1e-3 for adamw")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--inputs", type=int, default=16)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--outputs", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=float, default=RTOL)
    p.add_argument("--every", type=int, default=None, help="print every Nth step (default: 1 up to 20 steps, else 10)")
    args = p.parse_args(argv)
    if args.lr is None:
        args.lr = 0.05 if args.optimizer == "sgd" else 1e-3
    if args.every is None:
        args.every = 1 if args.steps <= 20 else 10
    return args


def main(argv=None) -> int:
    args = parse(argv)
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 matrix products in f32 in both models
    args.backend, device = resolve_backend(args.backend)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    mode = f"torch.compile(fullgraph=True, backend={args.compile_backend!r})" if args.compile else "eager"
    print(f"train_mlp: {where}, fusec backend {args.backend}, {mode}, {args.steps} steps, {args.optimizer} "
          f"lr {args.lr:g}, gelu {args.gelu}, batch {args.batch}, inputs {args.inputs}, dim {args.dim}, "
          f"hidden {args.hidden}, outputs {args.outputs}, torch {torch.__version__}", flush=True)
    start = time.perf_counter()
    result = train(args, device)
    print(f"trained in {time.perf_counter() - start:.1f} s")
    print_table(result, args.every)
    ok, lines = verdict(result, args.rtol)
    for line in lines:
        print(line)
    print("PASS" if ok else "FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
