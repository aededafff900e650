"""`fusec bench --grad`: forward + backward, one training step's worth of a pipeline.

fusec's step is the forward pipeline (fused, or unfused) then its backward,
`<name>_grad` (fusec.frontend.grad), jitted the same way, on the same arrays,
with seeded random gradients for every float output. Beside it: the copy of
the step's minimum traffic (the forward's parameters read and outputs
written, then the backward's parameters read and gradients written), torch
eager (the peer generated from the IR, then `torch.autograd.grad`),
torch.compile of that forward with AOTAutograd's backward, and Liger where it
has a kernel for the pipeline whose backward is Liger's too (RMSNorm, LayerNorm
of y alone, softmax, SwiGLU, residual add + RMSNorm; Triton, so on CUDA only;
the mapping, shared with `fusec bench`, is fusec.bench.liger's). Each variant's
gradients are checked before it is timed, against torch autograd's (the NumPy
reference of the derived backward where PyTorch is missing or cannot express
the pipeline); one that differs is not timed and its row says why.

On the cuda backend the arrays are CuPy's and the time per call is measured
with CUDA events, as `fusec bench` does; on the sim and numpy backends (the
CPU: small sizes, what CI runs) they are NumPy's and the time is the host's.
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from fusec.bench.harness import (
    INNER,
    REP_SECONDS,
    REPS,
    TOLERANCE,
    Row,
    _itemsize,
    _tuple,
    array_mismatch,
    dims_for,
    make_args,
    minimum_bytes,
    time_copy,
    time_gpu,
)
from fusec.bench.liger import liger_peer
from fusec.bench.peers import TorchOps, Unsupported, check_supported, peer_function
from fusec.frontend.grad import backward_program
from fusec.ir.program import Program
from fusec.jit import JitOptions, JitPipeline
from fusec.passes.lower import lower
from fusec.reference import run as reference
from fusec.types import BF16

COPY = "copy (16-byte, the limit)"
FUSED, UNFUSED = "fusec fused", "fusec unfused"
EAGER, COMPILED, LIGER = "torch eager", "torch.compile", "Liger"
# The forward bench's tolerances (harness.TOLERANCE); a gradient's absolute tolerance
# scales with its largest magnitude (a sum over rows grows with them; a softmax's shrinks
# with its rows' length).


class Device:
    """Where the bench runs: its arrays (CuPy or NumPy), its clock, torch's device."""

    def __init__(self, backend: str):
        self.backend = backend
        if backend == "cuda":
            import cupy as cp
            self.xp, self.torch_device = cp, "cuda"
        else:
            self.xp, self.torch_device = np, "cpu"

    def time(self, fn) -> float:
        """Median µs per call of a back-to-back loop."""
        if self.backend == "cuda":
            return time_gpu(self.xp, fn)
        return time_host(fn)

    def time_copy(self, nbytes: int) -> float:
        """µs of a copy moving `nbytes` (half read, half written)."""
        if self.backend == "cuda":
            return time_copy(self.xp, nbytes)
        words = max(1, nbytes // 32)
        src, dst = np.ones(words * 4, np.float32), np.empty(words * 4, np.float32)
        return self.time(lambda: np.copyto(dst, src))

    def native(self, a):
        """A device array as NumPy in its own dtype (scalars as they are): what the reference takes."""
        if self.backend == "cuda" and isinstance(a, self.xp.ndarray):
            a = a.get()
            return a.view(BF16.numpy_dtype) if a.dtype.kind == "V" else a
        return a.copy() if isinstance(a, np.ndarray) else a

    def host(self, a) -> np.ndarray:
        """An array (CuPy, NumPy or torch) as NumPy float64 on the host (integers as they are)."""
        if _is_tensor(a):
            a = a.detach()
            return a.double().cpu().numpy() if a.is_floating_point() else a.cpu().numpy()
        if self.backend == "cuda" and isinstance(a, self.xp.ndarray):
            a = a.get()
        a = np.asarray(a)
        if a.dtype.kind == "V":  # CuPy's bfloat16 comes back as two raw bytes
            a = a.view(BF16.numpy_dtype)
        return a.astype(np.float64) if a.dtype.kind not in "biu" else a


def time_host(fn) -> float:
    """Median µs per call of a back-to-back loop, timed on the host (the CPU backends)."""
    fn()
    start = time.perf_counter()
    fn()
    iters = max(1, min(2000, int(REP_SECONDS / max(time.perf_counter() - start, 1e-6))))
    samples = []
    for _ in range(REPS):
        begin = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - begin) * 1e6 / iters)
    return statistics.median(samples)


def _is_tensor(a) -> bool:
    import sys
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


class FusecStep:
    """fusec's training step: the forward, then the derived backward, each a jitted pipeline.
    The backward takes the forward's parameters, the outputs it keeps saved (if the cost
    model chose to save any: the forward's results of this call), then the upstream gradients."""

    def __init__(self, forward: JitPipeline, backward: JitPipeline, layout: "BackwardLayout"):
        self.forward, self.backward, self.layout = forward, backward, layout

    def __call__(self, args: list, seeds: list) -> tuple[tuple, tuple]:
        outputs = _tuple(self.forward(*args))
        gradients = _tuple(self.backward(*self.layout.arguments(args, outputs, seeds)))
        return outputs, gradients


class BackwardLayout:
    """Where the backward's arguments come from: the forward's parameters, its saved outputs, the seeds."""

    def __init__(self, forward, backward):
        n, outputs = len(forward.params), [o.name for o in forward.outputs]
        seeds = sum(o.type.is_float for o in forward.outputs)
        saved = [p.name for p in backward.params[n:len(backward.params) - seeds]]
        unknown = [name for name in saved if name not in outputs]
        if unknown:
            raise ValueError(f"{backward.name} takes {', '.join(unknown)}, which {forward.name} does not return")
        self.saved = [outputs.index(name) for name in saved]

    def arguments(self, args: list, outputs: tuple, seeds: list) -> list:
        return list(args) + [outputs[i] for i in self.saved] + list(seeds)


class TorchStep:
    """A torch forward (eager, compiled, or Liger's), then `torch.autograd.grad` to the float array
    parameters, with the same upstream gradients. `prepare` makes the tensors once, outside the timing."""

    def __init__(self, torch, device: Device, forward, pipeline):
        self.torch, self.device, self.forward = torch, device, forward
        self.differentiable = [i for i, p in enumerate(pipeline.params) if p.is_array and p.type.is_float]
        self.seeded = [i for i, o in enumerate(pipeline.outputs) if o.type.is_float]

    def prepare(self, args: list, seeds: list) -> tuple[list, list]:
        tensors = [self._tensor(a) for a in args]
        for i in self.differentiable:
            tensors[i] = tensors[i].detach().requires_grad_(True)
        return tensors, [self._tensor(s) for s in seeds]

    def _tensor(self, a):
        torch, xp = self.torch, self.device.xp
        if not isinstance(a, xp.ndarray):
            return a  # a scalar
        bf16 = a.dtype == BF16.numpy_dtype or a.dtype.kind == "V"
        if bf16:
            a = a.view(xp.int16)
        t = torch.from_dlpack(a) if self.device.backend == "cuda" else torch.from_numpy(a)
        return t.view(torch.bfloat16) if bf16 else t

    def __call__(self, tensors: list, seeds: list) -> tuple[tuple, tuple]:
        torch = self.torch
        outputs = _tuple(self.forward(*tensors))
        pairs = [(outputs[i], s) for i, s in zip(self.seeded, seeds) if outputs[i].requires_grad]
        inputs = [tensors[i] for i in self.differentiable]
        found = torch.autograd.grad([o for o, _ in pairs], inputs, [s for _, s in pairs],
                                    allow_unused=True) if pairs else [None] * len(inputs)
        return outputs, tuple(torch.zeros_like(x) if g is None else g for g, x in zip(found, inputs))


class Variant:
    """One row's step: how to make its arguments and run it, or why it is skipped."""

    def __init__(self, step=None, note: str = ""):
        self.step, self.note = step, note

    def prepare(self, args, seeds):
        prepare = getattr(self.step, "prepare", None)
        return prepare(args, seeds) if prepare else (args, seeds)


class GradBench:
    """Times forward + backward of pipeline `name` of `program` on `backend`."""

    def __init__(self, program: Program, name: str, float_type: str, backend: str = "cuda", fuse: str = "auto",
                 row_length: int = INNER):
        self.program, self.name, self.float_type, self.row_length = program, name, float_type, row_length
        self.pipeline = program.pipeline(name)
        self.backward_program = backward_program(program, name)  # FzError: it cannot be differentiated
        self.backward_name = f"{name}_grad"
        self.backward_pipeline = self.backward_program.pipeline(self.backward_name)
        self.layout = BackwardLayout(self.pipeline, self.backward_pipeline)
        self.device = Device(backend)
        self.variants: dict[str, Variant] = {}
        for label, mode in ((FUSED, fuse), (UNFUSED, "none")):
            options = JitOptions(fuse=mode, backend=backend)
            backward = JitPipeline(self.backward_program, self.backward_name, options)
            self.variants[label] = Variant(FusecStep(JitPipeline(program, name, options), backward, self.layout))
        self.variants.update(self._peers())

    def _peers(self) -> dict[str, Variant]:
        try:
            import torch
        except ImportError:
            skipped = Variant(note="skipped: PyTorch is not installed")
            return {EAGER: skipped, COMPILED: skipped, LIGER: Variant(note="skipped: Liger needs PyTorch")}
        peers = {}
        graph = lower(self.program, self.pipeline)
        try:
            ops = TorchOps(torch)
            check_supported(graph, ops)
            eager = peer_function(graph, ops, [p.name for p in self.pipeline.params])
            peers[EAGER] = Variant(TorchStep(torch, self.device, eager, self.pipeline))
            peers[COMPILED] = Variant(TorchStep(torch, self.device, torch.compile(eager), self.pipeline),
                                      "forward compiled, backward by AOTAutograd")
        except Unsupported as why:
            peers[EAGER] = peers[COMPILED] = Variant(note=f"skipped: {why}")
        peers[LIGER] = self._liger(torch)
        return peers

    def _liger(self, torch) -> Variant:
        function, note = liger_peer(self.program, self.name, self.device.backend, grad=True)
        if function is None:
            return Variant(note=note)
        return Variant(TorchStep(torch, self.device, function, self.pipeline), note)

    # ---- the arguments of a step
    def arguments(self, size: int, seed: int) -> tuple[dict, list, list]:
        """Dims, the forward's arguments and one upstream gradient per float output (seeded, random)."""
        xp = self.device.xp
        dims = dims_for(self.pipeline, size, self.row_length)
        args = make_args(xp, self.pipeline, dims, seed)
        rng = xp.random.default_rng(seed + 1000)
        seeds = []
        for o in self.pipeline.outputs:
            if o.type.is_float:
                shape = tuple(d if isinstance(d, int) else dims[d] for d in o.shape)
                seeds.append(rng.standard_normal(shape, dtype=xp.float32).astype(o.type.numpy_dtype))
        return dims, args, seeds

    def minimum_bytes(self, dims: dict) -> int:
        """The forward's minimum traffic plus the backward's."""
        return minimum_bytes(self.pipeline, dims) + minimum_bytes(self.backward_pipeline, dims)

    # ---- the check
    def expected(self, args: list, seeds: list) -> tuple[str, tuple, tuple]:
        """(what it is, outputs, gradients): torch autograd's, else the NumPy reference's."""
        eager = self.variants.get(EAGER)
        if eager is not None and eager.step is not None:
            try:
                outputs, gradients = eager.step(*eager.prepare(args, seeds))
                return "torch autograd's", outputs, gradients
            except Exception as exc:  # the peer failing: the reference decides, and the row says so
                eager.step, eager.note = None, _failed(exc)
        host = [self.device.native(a) for a in args]
        host_seeds = [self.device.native(s) for s in seeds]
        outputs = _tuple(reference(self.program, self.name, *host))
        backward_args = self.layout.arguments(host, tuple(o.copy() for o in outputs), host_seeds)
        gradients = _tuple(reference(self.backward_program, self.backward_name, *backward_args))
        return "the reference's", outputs, gradients

    def mismatch(self, got: tuple[tuple, tuple], expected: tuple[str, tuple, tuple]) -> str | None:
        """Why a step's outputs and gradients differ from the expected ones (None: they agree)."""
        source, outputs, gradients = expected
        names = [("output", o.name) for o in self.pipeline.outputs] + \
            [("gradient", f"grad_{p.name}") for p in self.pipeline.params if p.is_array and p.type.is_float]
        if len(got[0]) + len(got[1]) != len(names):
            return f"{len(got[0])} outputs and {len(got[1])} gradients, expected {len(names)} in all"
        for (kind, name), actual, want in zip(names, got[0] + got[1], outputs + gradients):
            a, e = self.device.host(actual), self.device.host(want)
            tol = TOLERANCE[_itemsize(actual)]
            # a gradient's absolute tolerance is relative to its largest magnitude, however small
            # (softmax's over rows of 4 Ki are below 0.003: a floor of 1 let a gradient 1.5x too
            # large pass in bf16)
            largest = float(np.nanmax(np.abs(e.astype(np.float64)))) if kind == "gradient" and e.size else 0.0
            scale = largest if np.isfinite(largest) and largest > 0 else 1.0
            found = array_mismatch(f"{kind} {name}", a, e, source, tol, tol * scale)
            if found:
                return found
        return None

    # ---- a size
    def run(self, size: int) -> list[Row]:
        dims, args, seeds = self.arguments(size, seed=size + 1)
        expected = self.expected(args, seeds)
        nbytes = self.minimum_bytes(dims)
        times = {COPY: self.device.time_copy(nbytes)}
        notes = {COPY: "forward + backward traffic"}
        for label, variant in self.variants.items():
            times[label], notes[label] = None, variant.note
            if variant.step is None:
                continue
            try:
                call_args = variant.prepare(args, seeds)
                why = self.mismatch(variant.step(*call_args), expected)
                if why is not None:
                    notes[label] = f"not timed: {why}"
                    continue
                times[label] = self.device.time(lambda: variant.step(*call_args))
            except Exception as exc:  # a peer failing is recorded, not fatal
                notes[label] = _failed(exc)
        if expected[0] != "torch autograd's":
            for label in (FUSED, UNFUSED):
                if times[label] is not None:
                    notes[label] = _join(notes[label], "checked against the NumPy reference of the derived backward")
        rows = []
        for variant, us in times.items():
            row = Row(self.name, self.float_type, size, variant, us, note=notes.get(variant, ""), grad=True)
            if us:
                row.tb_per_s = nbytes / (us * 1e-6) / 1e12
                row.pct_of_copy = 100 * times[COPY] / us
                if times[UNFUSED]:
                    row.speedup_vs_unfused = times[UNFUSED] / us
            rows.append(row)
        return rows


def _failed(exc: Exception) -> str:
    return f"failed: {type(exc).__name__}: {str(exc)[:80]}"


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
