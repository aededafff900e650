"""fusec's gradients against torch autograd's on the same maths, in f32 and bf16 (the
gpu tier's check of every differentiable example, tests/test_grad_gpu.py; the sim
tier runs it on the CPU at small sizes, tests/test_grad_sim.py).

For each pipeline of an example, its float arrays retyped to the dtype (a scalar
keeps its type): fusec's op (`fusec.torch_op`, its derived backward) and torch
autograd through the pipeline written in torch (`fusec.bench.peers`, stage by
stage: f16 and bf16 computed in f32 and rounded at each stage's store, as fusec
does) run on the same tensors with the same upstream gradients; both are measured
against the same torch maths in float64 on the same (rounded) inputs. The error of
an output or a gradient is its largest difference from the float64 one over the
float64 one's largest magnitude (a sum over rows grows with them). fusec passes
where its error is at most TORCH_FACTOR times torch's own in that dtype, or below
FLOOR[dtype].
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace

import numpy as np
from helpers import ROOT

import fusec
from fusec.bench.peers import TorchOps, peer_function
from fusec.errors import Source
from fusec.frontend import check_source
from fusec.passes.lower import lower

# The tolerance floor, relative to the float64 result's largest magnitude: f32, a few
# ulps beyond libdevice's and FMA contraction's differences (README, Accuracy) and a
# reduction's order; bf16, two of its ulps (2^-8 each).
FLOOR = {"f32": 1e-5, "bf16": 8e-3}
TORCH_FACTOR = 2.0
# Pipelines with many inputs and outputs run unfused (the cost model's search over
# fusion_hurts' backward takes minutes; tests/test_grad.py's WIDE).
UNFUSED = {"fusion_hurts"}
_names = itertools.count()


@dataclass(frozen=True)
class Comparison:
    """One output or gradient of one pipeline: fusec's and torch's errors, the tolerance."""

    example: str
    pipeline: str
    dtype: str
    what: str
    fusec: float
    torch: float

    @property
    def tolerance(self) -> float:
        return max(TORCH_FACTOR * self.torch, FLOOR[self.dtype])

    @property
    def ok(self) -> bool:
        return self.fusec <= self.tolerance  # NaN fails

    def line(self) -> str:
        return (f"{'PASS' if self.ok else 'FAIL'} grad {self.example}/{self.pipeline} {self.dtype} {self.what}: "
                f"fusec {self.fusec:.2e}, torch {self.torch:.2e}, tolerance {self.tolerance:.2e}")


def retyped(text: str, dtype: str) -> str:
    """The program with every float array of type `dtype` (scalars keep theirs)."""
    return re.sub(r"\b(f16|bf16|f32|f64)(?=\[)", dtype, text)


def compare_example(torch, example: str, dtype: str, device: str, dims: dict, backend: str = "sim",
                    seed: int = 0) -> list[Comparison]:
    """Every output and gradient of every pipeline of `example` (distinct once retyped), on
    torch device `device` (CPU tensors run on fusec's `backend`)."""
    text = retyped((ROOT / "examples" / f"{example}.fz").read_text(), dtype)
    program = check_source(Source(f"{example}.fz", text))
    reference = check_source(Source(f"{example}.fz", re.sub(r"\b(f16|bf16|f32)\b", "f64", text)))  # scalars too
    seen, found = [], []
    for pipeline in program.pipelines:
        if replace(pipeline, name="") in seen:  # softmax and softmax_bf16, once retyped
            continue
        seen.append(replace(pipeline, name=""))
        op = fusec.torch_op(text, name=f"grad_compare::{pipeline.name}{next(_names)}", pipeline=pipeline.name,
                            backend=backend, fuse="none" if example in UNFUSED else "auto")
        found += _compare(torch, op, example, program, reference, pipeline.name, dtype, device, dims, seed)
    return found


def _compare(torch, op, example, program, reference, name, dtype, device, dims, seed) -> list[Comparison]:
    pipeline = program.pipeline(name)
    rng = np.random.default_rng(seed)
    arrays = []  # float64 values of the arguments, rounded to their dtype; scalars as they are
    for p in pipeline.params:
        if p.shape is None:
            arrays.append(3 if p.type.is_int else True if p.type.is_bool else 0.7)
            continue
        shape = tuple(d if isinstance(d, int) else dims[d] for d in p.shape)
        if p.type.is_int:  # row indices: inside the row, ignored (-100), past its end
            length = dims.get("vocab", 1)
            values = rng.integers(0, length, shape)
            values.flat[0], values.flat[-1] = -100, length
            arrays.append(torch.tensor(values, dtype=getattr(torch, p.type.torch), device=device))
            continue
        value = rng.standard_normal(shape)
        if p.name == "x":  # kept away from 0 (tests/test_grad.py's gradcheck does the same)
            value = np.abs(value) + 0.5
        arrays.append(torch.tensor(value, device=device).to(getattr(torch, p.type.torch)).double())
    floats = [i for i, p in enumerate(pipeline.params) if p.shape is not None and p.type.is_float]
    seeded = [j for j, o in enumerate(pipeline.outputs) if o.type.is_float]
    seeds64 = [torch.tensor(rng.standard_normal([d if isinstance(d, int) else dims[d] for d in o.shape]),
                            device=device).to(getattr(torch, o.type.torch)).double()
               for o in (pipeline.outputs[j] for j in seeded)]

    def run(fn, types):
        """Outputs and gradients of fn on the arguments in `types` (slot -> torch dtype), as float64."""
        args = [a.detach().to(types(p)).requires_grad_(True) if i in floats else a
                for i, (p, a) in enumerate(zip(pipeline.params, arrays))]
        outputs = fn(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        seeds = [s.to(types(pipeline.outputs[j])) for j, s in zip(seeded, seeds64)]
        grads = torch.autograd.grad([outputs[j] for j in seeded], [args[i] for i in floats], seeds,
                                    allow_unused=True)
        grads = [torch.zeros_like(args[i]) if g is None else g for g, i in zip(grads, floats)]
        return [o.detach().double() if o.is_floating_point() else o.detach() for o in outputs] + \
            [g.double() for g in grads]

    def own(slot):
        return getattr(torch, slot.type.torch)

    def peer(prog):
        return peer_function(lower(prog, prog.pipeline(name)), TorchOps(torch), [p.name for p in pipeline.params])

    exact = run(peer(reference), lambda slot: torch.float64)
    theirs = run(peer(program), own)
    ours = run(op, own)
    whats = [f"output {o.name}" for o in pipeline.outputs] + [f"grad_{pipeline.params[i].name}" for i in floats]
    return [Comparison(example, name, dtype, what, _error(a, e), _error(t, e))
            for what, a, t, e in zip(whats, ours, theirs, exact)]


def _error(actual, exact) -> float:
    """The largest difference over the exact value's largest magnitude (the difference itself where
    that is 0); integers, 0 where equal."""
    if not exact.is_floating_point():
        return 0.0 if bool((actual == exact).all()) else float("inf")
    scale = float(exact.abs().max()) if exact.numel() else 0.0
    difference = float((actual - exact).abs().max()) if exact.numel() else 0.0
    return difference / scale if scale > 0 else difference
