"""Data-parallel training with fusec: one process per GPU, NCCL all-reduce of
the gradients, fusec's fused ops in the model (with their derived backward
kernels) and fusec's multi-tensor AdamW (examples/adamw.fz, `foreach`: every
parameter stepped in one launch) as the optimizer.

The model is a small SwiGLU classifier:

    x -> Linear -> h;  h = h + Linear(swiglu(Linear_gate(h), Linear_up(h)));  log_softmax(Linear(h))

where `swiglu` is examples/bf16_swiglu.fz in f32 and `log_softmax` is
examples/log_softmax.fz, both `fusec.torch_op`s, so `loss.backward()` runs
fusec's derived backward pipelines. The loss is the mean negative
log-likelihood of labels that a fixed random linear "teacher" gives.

Each step draws a global batch from the seed; rank r of W takes rows
[r * B/W, (r + 1) * B/W). Each rank's gradients are summed over the ranks with
`dist.all_reduce` (one call per parameter, explicitly) and divided by W: the
gradient of the global-batch mean. Every rank then takes the same AdamW step on
the same gradients, so the ranks' parameters stay bit-identical; the printed
loss of a step is the global-batch loss (the ranks' losses averaged).

Commands (from the repository root):

    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py
        2 GPUs, NCCL, the cuda backend, 50 steps. Afterwards rank 0 trains the
        same model (same seed, same initial parameters) on one GPU over the
        same global batches, prints both loss curves, and checks that they are
        within 1e-5 (relative) at every step and that every rank's final
        parameters are bit-identical (all-gathered, compared as bits, SHA-256
        printed). Exit status 0 only when both checks pass.

    python examples/ddp_train.py --single
        the one-device run alone (the same global batches), printing its losses.

    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --backend sim --steps 3
        the same on the CPU: gloo, CPU tensors, fusec's sim backend (the emitted
        CUDA C run on the CPU), for a machine without a GPU. --backend numpy
        runs fusec's NumPy reference instead.

    ... --check FILE writes the run's losses and parameter digests as JSON
    (rank 0); `python examples/ddp_train.py --compare SINGLE.json DDP.json`
    checks two such files (a --single run and a torchrun run) the same way.
    --no-reference skips the one-device run inside the torchrun run.

Options: --steps N (50), --backend cuda|sim|numpy (cuda), --seed, --global-batch,
--dim, --hidden, --classes, --lr, --weight-decay. NCCL's environment is left as
the launcher sets it.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import fusec

EXAMPLES = Path(__file__).resolve().parent
RTOL = 1e-5  # losses of the data-parallel run against the one-device run, relative


# ---- fusec's parts: two ops with a backward, and the multi-tensor AdamW

_OPS: dict[str, tuple] = {}


def fusec_parts(backend: str):
    """(swiglu, log_softmax, adamw): the torch ops (registered once per process)
    and the AdamW pipeline, on `backend`. CUDA tensors always run on fusec's
    cuda backend; `backend` says where CPU tensors run (sim or numpy)."""
    if backend not in _OPS:
        cpu_backend = {"cuda": {}, "sim": {"backend": "sim"}, "numpy": {"backend": "numpy"}}[backend]
        # examples/bf16_swiglu.fz in f32 (the loss curves are compared at 1e-5; bf16 rounds at 4e-3).
        swiglu_text = re.sub(r"\bbf16\b", "f32", (EXAMPLES / "bf16_swiglu.fz").read_text())
        swiglu = fusec.torch_op(swiglu_text, name=f"ddp_example::swiglu_{backend}", **cpu_backend)
        log_softmax = fusec.torch_op(str(EXAMPLES / "log_softmax.fz"), name=f"ddp_example::log_softmax_{backend}",
                                     pipeline="log_softmax", **cpu_backend)
        adamw = fusec.jit(str(EXAMPLES / "adamw.fz"), backend=backend)
        _OPS[backend] = (swiglu, log_softmax, adamw)
    return _OPS[backend]


class SwiGLUClassifier(torch.nn.Module):
    def __init__(self, inputs: int, dim: int, hidden: int, classes: int, swiglu, log_softmax):
        super().__init__()
        self.embed = torch.nn.Linear(inputs, dim)
        self.gate = torch.nn.Linear(dim, hidden, bias=False)
        self.up = torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim)
        self.head = torch.nn.Linear(dim, classes)
        self.swiglu, self.log_softmax = swiglu, log_softmax

    def forward(self, x):
        h = self.embed(x)
        h = h + self.down(self.swiglu(self.gate(h), self.up(h)))  # fusec: silu(gate) * up, and its backward
        return self.log_softmax(self.head(h))  # fusec: a row kernel, and its backward


class FusecAdamW:
    """torch.optim.AdamW's update (decoupled weight decay) as one fusec launch
    over every parameter: `adamw.foreach([(param, grad, m, v), ...], scalars...)`."""

    def __init__(self, params, adamw, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2):
        self.params = list(params)
        self.adamw, self.lr, self.betas, self.eps, self.weight_decay = adamw, lr, betas, eps, weight_decay
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    def zero_grad(self):
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()  # in place: the same grad tensors every step, so foreach keeps its tables

    @torch.no_grad()
    def step(self):
        self.t += 1
        beta1, beta2 = self.betas
        # adamw.fz's arrays are 1-D ([n]): each tensor as a flat view of its memory.
        sets = [(p.view(-1), p.grad.view(-1), m.view(-1), v.view(-1)) for p, m, v in zip(self.params, self.m, self.v)]
        with self._device():
            self.adamw.foreach(sets, self.lr, beta1, beta2, self.eps, self.weight_decay,
                               1.0 - beta1 ** self.t, 1.0 - beta2 ** self.t)

    def _device(self):
        """CUDA tensors: their device as CuPy's current one (fusec's cuda backend
        loads its module there; the launch runs on torch's current stream)."""
        device = self.params[0].device
        if device.type != "cuda":
            return contextlib.nullcontext()
        import cupy
        return cupy.cuda.Device(device.index)


# ---- data: the global batch of a step, from the seed alone


def global_batch(step: int, args) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, labels) of the whole global batch of `step`, made on the CPU (the
    same bits in every process), labels from a fixed random linear teacher."""
    teacher = torch.randn(args.inputs, args.classes, generator=torch.Generator().manual_seed(args.seed + 1))
    x = torch.randn(args.global_batch, args.inputs, generator=torch.Generator().manual_seed(args.seed * 100_003 + step))
    return x, (x @ teacher).argmax(dim=1)


def build(args, device):
    """The model, with the same initial parameters in every process (the seed),
    and its optimizer."""
    swiglu, log_softmax, adamw = fusec_parts(args.backend)
    torch.manual_seed(args.seed)
    model = SwiGLUClassifier(args.inputs, args.dim, args.hidden, args.classes, swiglu, log_softmax).to(device)
    return model, FusecAdamW(model.parameters(), adamw, lr=args.lr, weight_decay=args.weight_decay)


def train(args, device, rank: int = 0, world: int = 1, log=None) -> tuple[list[float], torch.nn.Module]:
    """Trains args.steps steps; returns the global-batch loss of each step and the model.
    world > 1: this process is rank `rank` of a process group, and takes its slice."""
    model, optimizer = build(args, device)
    if world > 1:
        for p in model.parameters():  # the same start on every rank, whatever the seed gave
            dist.broadcast(p.data, src=0)
    rows = args.global_batch // world
    losses = []
    for step in range(args.steps):
        x, labels = global_batch(step, args)
        x = x[rank * rows:(rank + 1) * rows].to(device)
        labels = labels[rank * rows:(rank + 1) * rows].to(device)
        optimizer.zero_grad()
        loss = -model(x).gather(1, labels[:, None]).mean()
        loss.backward()
        loss = loss.detach().clone()
        if world > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(world)  # the gradient of the global-batch mean
            dist.all_reduce(loss, op=dist.ReduceOp.SUM)
            loss.div_(world)
        optimizer.step()
        losses.append(loss.item())
        if log is not None:
            log(step, losses[-1])
    return losses, model


def flat_parameters(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def digest(flat: torch.Tensor) -> str:
    return hashlib.sha256(flat.cpu().numpy().tobytes()).hexdigest()


# ---- the checks


def compare_losses(ddp: list[float], single: list[float], rtol: float = RTOL) -> tuple[bool, list[float]]:
    """Each step's relative difference; ok when every one is within rtol (and none is NaN)."""
    if len(ddp) != len(single):
        return False, []
    rel = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(ddp, single)]
    return all(r <= rtol for r in rel) and all(map(math.isfinite, ddp + single)), rel


def verdict_lines(ddp: list[float], single: list[float], digests: list[str]) -> tuple[bool, list[str]]:
    losses_ok, rel = compare_losses(ddp, single)
    params_ok = len(set(digests)) == 1
    lines = []
    if rel:
        lines.append(f"losses: {'PASS' if losses_ok else 'FAIL'}: {len(rel)} steps, max relative difference "
                     f"{max(rel):.3e} (limit {RTOL:.0e}) against one device with the same global batch")
    else:
        lines.append(f"losses: FAIL: {len(ddp)} steps data-parallel against {len(single)} on one device")
    lines.append(f"parameters: {'PASS' if params_ok else 'FAIL'}: {len(digests)} ranks "
                 f"{'bit-identical' if params_ok else 'DIFFER'}: " + ", ".join(f"rank {r} sha256 {d[:16]}"
                                                                              for r, d in enumerate(digests)))
    return losses_ok and params_ok, lines


def print_table(ddp: list[float], single: list[float] | None):
    if single is None:
        print(f"{'step':>5}  {'loss':>12}", flush=True)
        for i, a in enumerate(ddp):
            print(f"{i + 1:>5}  {a:12.8f}")
        return
    print(f"{'step':>5}  {'data-parallel':>14}  {'one device':>14}  {'rel diff':>9}")
    for i, (a, b) in enumerate(zip(ddp, single)):
        print(f"{i + 1:>5}  {a:14.8f}  {b:14.8f}  {abs(a - b) / max(abs(b), 1e-30):9.2e}")
    sys.stdout.flush()


CONFIG = ("seed", "steps", "global_batch", "inputs", "dim", "hidden", "classes", "lr", "weight_decay")


def record(args, world: int, losses: list[float], digests: list[str], **more) -> dict:
    """What --check writes: the run's settings, its losses and each rank's parameter digest."""
    return {"world_size": world, "backend": args.backend, "config": {k: getattr(args, k) for k in CONFIG},
            "losses": losses, "param_sha256": digests, **more}


def write_check(path: str, record: dict):
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}", flush=True)


def compare_files(single_path: str, ddp_path: str) -> int:
    single, ddp = (json.loads(Path(p).read_text()) for p in (single_path, ddp_path))
    if single["world_size"] != 1:  # given the other way round
        (single, single_path), (ddp, ddp_path) = (ddp, ddp_path), (single, single_path)
    print(f"one device: {single_path} ({single['world_size']} process, fusec backend {single['backend']}); "
          f"data-parallel: {ddp_path} ({ddp['world_size']} processes, fusec backend {ddp['backend']})")
    print_table(ddp["losses"], single["losses"])
    ok, lines = verdict_lines(ddp["losses"], single["losses"], ddp["param_sha256"])
    if ddp["world_size"] < 2:
        ok, lines = False, lines + ["FAIL: neither file is from a data-parallel run"]
    differ = {k: (single["config"][k], ddp["config"][k]) for k in CONFIG if single["config"][k] != ddp["config"][k]}
    if differ:
        ok, lines = False, lines + ["FAIL: the runs differ in " + ", ".join(f"{k} ({a} and {b})"
                                                                           for k, (a, b) in differ.items())]
    for line in lines:
        print(line)
    print("PASS" if ok else "FAIL", flush=True)
    return 0 if ok else 1


# ---- the runs


def device_for(backend: str, local_rank: int = 0) -> torch.device:
    if backend != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit("--backend cuda needs a CUDA device (use --backend sim on a machine without one)")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def describe(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def run_single(args) -> int:
    device = device_for(args.backend)
    print(f"one device: {describe(device)}, fusec backend {args.backend}, global batch {args.global_batch}, "
          f"{args.steps} steps", flush=True)
    losses, model = train(args, device)
    print_table(losses, None)
    flat = flat_parameters(model)
    print(f"final parameters: {flat.numel()} floats, sha256 {digest(flat)}", flush=True)
    if args.check:
        write_check(args.check, record(args, 1, losses, [digest(flat)]))
    return 0


def run_distributed(args) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if args.global_batch % world:
        sys.exit(f"--global-batch {args.global_batch} is not a multiple of the {world} processes")
    device = device_for(args.backend, local_rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if rank == 0:
        print(f"data-parallel: {world} processes ({dist.get_backend()}), rank 0 on {describe(device)}, "
              f"fusec backend {args.backend}, global batch {args.global_batch} ({args.global_batch // world} a rank), "
              f"{args.steps} steps", flush=True)
    losses, model = train(args, device, rank, world)

    flat = flat_parameters(model)
    if rank == args.fault_rank:  # for the test: one bit of one parameter flipped on this rank
        flat.view(torch.int32)[0] ^= 1
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    bits = [g.view(torch.int32) for g in gathered]  # compared as bits: -0.0 and NaN payloads count
    identical = all(torch.equal(b, bits[0]) for b in bits)
    digests = [digest(g) for g in gathered]
    assert identical == (len(set(digests)) == 1)

    ok = torch.ones(1, device=device)
    if rank == 0:
        single = None
        if not args.no_reference:
            print(f"one device (rank 0's {describe(device)}): the same model and global batches", flush=True)
            single, reference_model = train(args, device)
            drift = (flat_parameters(reference_model) - flat).abs().max().item()
        print_table(losses, single)
        if single is not None:
            passed, lines = verdict_lines(losses, single, digests)
            lines.append(f"(final parameters, data-parallel against one device: max |difference| {drift:.3e})")
        else:
            passed = identical
            lines = [f"parameters: {'PASS' if identical else 'FAIL'}: {world} ranks "
                     f"{'bit-identical' if identical else 'DIFFER'}: "
                     + ", ".join(f"rank {r} sha256 {d[:16]}" for r, d in enumerate(digests))]
        for line in lines:
            print(line)
        print("PASS" if passed else "FAIL", flush=True)
        if args.check:
            write_check(args.check, record(args, world, losses, digests, single_losses=single))
        ok.fill_(1.0 if passed else 0.0)
    dist.broadcast(ok, src=0)  # every rank exits with rank 0's verdict
    passed = ok.item() == 1.0
    del ok, gathered, bits, flat
    shut_down()
    return 0 if passed else 1


def shut_down():
    """Destroys the process group, then sleeps a moment: a gloo worker thread
    drops the last collective's tensors after the collective has returned,
    and dropping them takes the GIL. Were the interpreter finalizing by then,
    that thread would exit inside a destructor and abort the process ("terminate
    called without an active exception" from ProcessGroupGloo::runLoop, about
    one run in ten of --backend sim --steps 3 with torch 2.13's gloo); the
    sleep releases the GIL to it first."""
    dist.destroy_process_group()
    time.sleep(0.2)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--backend", choices=["cuda", "sim", "numpy"], default="cuda",
                   help="fusec's backend: cuda (GPUs, NCCL) or sim/numpy (CPU tensors, gloo)")
    p.add_argument("--single", action="store_true", help="train on one device over the global batch, no torchrun")
    p.add_argument("--no-reference", action="store_true", help="under torchrun: skip rank 0's one-device run")
    p.add_argument("--check", metavar="FILE", help="write the losses and parameter digests as JSON")
    p.add_argument("--compare", nargs=2, metavar=("SINGLE", "DDP"), help="compare two --check files and exit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--inputs", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=1e-2)
    p.add_argument("--fault-rank", type=int, default=-1, help=argparse.SUPPRESS)  # the test's: a check must fail
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 matrix products in f32 (torch's default, said again)
    if args.compare:
        return compare_files(*args.compare)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if not launched:
        print("command: python " + " ".join(sys.argv), flush=True)
    elif os.environ["RANK"] == "0":
        print(f"command: torchrun (WORLD_SIZE={os.environ['WORLD_SIZE']}, LOCAL_WORLD_SIZE="
              f"{os.environ.get('LOCAL_WORLD_SIZE', '?')}) " + " ".join(sys.argv), flush=True)
    if args.single or not launched:
        return run_single(args)
    return run_distributed(args)


if __name__ == "__main__":
    sys.exit(main())
