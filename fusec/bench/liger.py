"""Liger (liger_kernel: Triton kernels for LLM training) as a peer of `fusec bench` and `fusec bench --grad`.

The one mapping from a pipeline to Liger's function for it, shared by both benches. It is
decided from the pipeline itself, not its name:

1. Its parameters and outputs have the roles, shapes and types of the kernel's arguments
   and results: e.g. RMSNorm takes rows x: float[R, C], a weight w: float[C] of x's type and
   a float scalar eps, and gives y: float[R, C] of x's type. Every binding of the pipeline's
   parameters (and outputs) to the kernel's that fits is tried: two weights of shape [C] may
   be LayerNorm's weight and bias either way round, SwiGLU's two inputs its gate and up.
2. Its statements compute what the kernel computes: fusec's NumPy reference runs the
   pipeline on two small random probes (rows of 40, two different eps, some labels the
   ignore index -100) and each output must equal a NumPy model of Liger's function (f64)
   under that binding, within the pipeline's precision (3e-2 for 16-bit floats, 1e-4 f32).

So an RMSNorm under any name maps, and a pipeline named rmsnorm that computes something
else (another eps, no weight, a log-softmax) maps to nothing. The kernels, as Liger 0.8.5
has them (liger_kernel/ops/*.py, the positional arguments liger_kernel/transformers/
functional.py passes; taken from `liger_kernel.ops`, which a non-CUDA Liger backend may
replace):

- RMSNorm: LigerRMSNormFunction.apply(X, W, eps, offset=0.0, casting_mode="llama",
  in_place=False) (ops/rms_norm.py; in_place=False: its backward would overwrite dY).
- LayerNorm, y alone: LigerLayerNormFunction.apply(X, W, B, eps) (ops/layer_norm.py); with
  the row statistics too (examples/layernorm.fz: y, mean, rstd), the same kernel through
  layer_norm_forward(X, W, B, eps) -> (Y, X, Mean, RSTD, BLOCK_SIZE, num_warps), which
  writes Mean and RSTD (f32, one a row) anyway; forward only (Liger's backward takes dY alone).
- softmax over the last axis: LigerSoftmaxFunction.apply(x) (ops/softmax.py).
- SwiGLU silu(a) * b: LigerSiLUMulFunction.apply(a, b) (ops/swiglu.py; multipliers 1.0).
- residual add + RMSNorm: LigerFusedAddRMSNormFunction.apply(X, R, W, eps, 0.0, "llama",
  False) -> (Y, S), S = X + R (ops/fused_add_rms_norm.py).
- cross-entropy from logits and labels [R, 1], ignore index -100:
  LigerCrossEntropyFunction.apply(input, target, weight=None, ignore_index=-100,
  lse_square_scale=0.0, label_smoothing=0.0, reduction, softcap=None, False, False, False)
  -> (loss, z_loss, token_accuracy, predicted_tokens) (ops/cross_entropy.py). Per-row
  losses: reduction "none" (a loss a row, in the logits' type, 0 where ignored); with the
  mean too, the mean of those losses over the counted rows by torch (Liger gives one
  reduction a call); the mean alone: reduction "mean". Forward only in --grad: with
  logits that require grad, Liger's forward writes the gradient over the logits.
"""
from __future__ import annotations

import importlib
import importlib.util
import itertools
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

IGNORE_INDEX = -100
_PROBES = ((6, 40, 0.4, 1), (5, 40, 0.15, 2))  # (rows, cols, eps, seed)
_TOLERANCE = {16: 3e-2, 32: 1e-4, 64: 1e-7}  # the probe's, by the narrowest float the pipeline has


# ---- NumPy models of Liger's functions (f64): role -> array

def _rms(x, eps):
    return 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _model_rms_norm(x, w, eps):
    return {"y": x * _rms(x, eps) * w}


def _model_layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    return {"y": (x - mean) * rstd * w + b, "mean": mean, "rstd": rstd}


def _model_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return {"y": e / e.sum(-1, keepdims=True)}


def _model_swiglu(gate, up):
    return {"y": gate / (1 + np.exp(-gate)) * up}


def _model_add_rms_norm(x, residual, w, eps):
    h = x + residual
    return {"h": h, "y": h * _rms(h, eps) * w}


def _model_cross_entropy(logits, label):
    m = logits.max(-1, keepdims=True)
    lse = m + np.log(np.exp(logits - m).sum(-1, keepdims=True))
    counted = label != IGNORE_INDEX
    picked = np.take_along_axis(logits, np.where(counted, label, 0), axis=-1)
    loss = np.where(counted, lse - picked, 0.0)
    return {"loss": loss, "mean": np.array([loss.sum() / counted.sum()])}


# ---- Liger's functions: (liger_kernel.ops, torch, the output roles wanted) -> f(**role tensors) -> role -> tensor

def _liger_rms_norm(ops, torch, wanted):
    return lambda x, w, eps: {"y": ops.LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)}


def _liger_layer_norm(ops, torch, wanted):
    if wanted == {"y"}:
        return lambda x, w, b, eps: {"y": ops.LigerLayerNormFunction.apply(x, w, b, eps)}

    def layer_norm(x, w, b, eps):
        y, _, mean, rstd, _, _ = ops.layer_norm_forward(x.contiguous(), w.contiguous(), b.contiguous(), eps)
        return {"y": y, "mean": mean, "rstd": rstd}
    return layer_norm


def _liger_softmax(ops, torch, wanted):
    return lambda x: {"y": ops.LigerSoftmaxFunction.apply(x)}


def _liger_swiglu(ops, torch, wanted):
    return lambda gate, up: {"y": ops.LigerSiLUMulFunction.apply(gate, up)}


def _liger_add_rms_norm(ops, torch, wanted):
    def add_rms_norm(x, residual, w, eps):
        y, s = ops.LigerFusedAddRMSNormFunction.apply(x, residual, w, eps, 0.0, "llama", False)
        return {"h": s, "y": y}
    return add_rms_norm


def _liger_cross_entropy(ops, torch, wanted):
    def apply(logits, label, reduction):
        loss, _, _, _ = ops.LigerCrossEntropyFunction.apply(
            logits, label.reshape(-1), None, IGNORE_INDEX, 0.0, 0.0, reduction, None, False, False, False)
        return loss

    def cross_entropy(logits, label):
        if "loss" not in wanted:
            return {"mean": apply(logits, label, "mean")}
        loss = apply(logits, label, "none")
        found = {"loss": loss}
        if "mean" in wanted:
            found["mean"] = loss.float().sum() / (label != IGNORE_INDEX).sum()
        return found
    return cross_entropy


@dataclass(frozen=True)
class Spec:
    """One Liger kernel: its arguments and results as (role, kind), the output sets it
    can give (each with whether --grad may take Liger's backward for it), its model, its call."""
    name: str
    params: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    forms: tuple[tuple[frozenset, bool], ...]
    model: Callable
    make: Callable
    note: str = ""


def _forms(*forms):
    return tuple((frozenset(roles), grad) for roles, grad in forms)


# kinds: "rows" a float [R, C] of the rows' type; "weight" a float [C] of the rows' type; "eps" a float
# scalar; "labels" an integer [R, 1]; outputs "rows" as the parameter, "stat" a float [R, 1], "total" a float [1].
SPECS = (
    Spec("LigerRMSNormFunction", (("x", "rows"), ("w", "weight"), ("eps", "eps")), (("y", "rows"),),
         _forms((("y",), True)), _model_rms_norm, _liger_rms_norm, "casting_mode llama"),
    Spec("LigerLayerNormFunction", (("x", "rows"), ("w", "weight"), ("b", "weight"), ("eps", "eps")),
         (("y", "rows"), ("mean", "stat"), ("rstd", "stat")),
         _forms((("y",), True), (("y", "mean", "rstd"), False)), _model_layer_norm, _liger_layer_norm),
    Spec("LigerSoftmaxFunction", (("x", "rows"),), (("y", "rows"),), _forms((("y",), True)),
         _model_softmax, _liger_softmax),
    Spec("LigerSiLUMulFunction", (("gate", "rows"), ("up", "rows")), (("y", "rows"),), _forms((("y",), True)),
         _model_swiglu, _liger_swiglu),
    Spec("LigerFusedAddRMSNormFunction", (("x", "rows"), ("residual", "rows"), ("w", "weight"), ("eps", "eps")),
         (("h", "rows"), ("y", "rows")), _forms((("h", "y"), True)), _model_add_rms_norm, _liger_add_rms_norm,
         "casting_mode llama"),
    Spec("LigerCrossEntropyFunction", (("logits", "rows"), ("label", "labels")),
         (("loss", "stat"), ("mean", "total")),
         _forms((("loss", "mean"), False), (("loss",), False), (("mean",), False)),
         _model_cross_entropy, _liger_cross_entropy),
)
_NO_BACKWARD = {
    "LigerLayerNormFunction": "its backward takes the gradient of y alone, not of the row statistics",
    "LigerCrossEntropyFunction": "with logits that require grad its forward writes the gradient over the logits",
}


@dataclass(frozen=True)
class LigerKernel:
    """Liger's function for one pipeline: which kernel, and where the pipeline's parameters and outputs go."""
    spec: Spec
    pipeline: object
    params: dict          # role -> index of the pipeline's parameter
    outputs: tuple        # the role of each of the pipeline's outputs, in order
    grad: bool            # whether --grad may take Liger's backward

    @property
    def note(self) -> str:
        note = f"liger_kernel.ops.{self.spec.name}"
        if self.spec.name == "LigerLayerNormFunction" and set(self.outputs) != {"y"}:
            note = "liger_kernel.ops.layer_norm_forward (LigerLayerNormFunction's, with Mean and RSTD)"
        if self.spec.name == "LigerCrossEntropyFunction":
            note += " (reduction none; the mean of its losses by torch)" if len(self.outputs) == 2 else \
                " (reduction none)" if self.outputs == ("loss",) else " (reduction mean)"
        return f"{note}, {self.spec.note}" if self.spec.note else note

    def function(self) -> Callable:
        """f(*the pipeline's arguments as torch tensors) -> its outputs (a tuple if more than one)."""
        import torch
        ops = importlib.import_module("liger_kernel.ops")
        call = self.spec.make(ops, torch, frozenset(self.outputs))
        slots = self.pipeline.outputs

        def liger(*args):
            found = call(**{role: args[i] for role, i in self.params.items()})
            results = tuple(_as_output(torch, found[role], slot) for role, slot in zip(self.outputs, slots))
            return results if len(results) != 1 else results[0]
        return liger


def _as_output(torch, t, slot):
    """Liger's result in the pipeline's output's shape ([R] -> [R, 1], a scalar -> [1]) and type."""
    if t.dim() == 0:
        t = t.reshape(1)
    elif t.dim() == 1 and len(slot.shape) == 2:
        t = t.reshape(-1, 1)
    dtype = getattr(torch, slot.type.torch)
    return t if t.dtype == dtype else t.to(dtype)


def liger_kernel_for(program, name: str, grad: bool = False) -> LigerKernel | None:
    """Liger's function for pipeline `name` of `program` (None: Liger has no kernel for it; with
    grad=True, none whose backward is Liger's). See the module's docstring for how it is matched."""
    found = _match(program, name)
    return found if found is None or not grad or found.grad else None


def _match(program, name: str) -> LigerKernel | None:
    pipeline = program.pipeline(name)
    if any(p.role not in ("in", "scalar") for p in pipeline.params) or not pipeline.outputs:
        return None
    for spec in SPECS:
        for params, outputs, grad in _bindings(spec, pipeline):
            if _computes(spec, program, pipeline, params, outputs):
                return LigerKernel(spec, pipeline, params, outputs, grad)
    return None


def _bindings(spec: Spec, pipeline):
    """(role -> parameter index, output roles in the pipeline's order, grad) for each binding whose shapes and types fit."""
    params, outs = pipeline.params, pipeline.outputs
    if len(params) != len(spec.params):
        return
    kinds = dict(spec.outputs)
    for order in itertools.permutations(range(len(params))):
        bound = {role: params[i] for (role, _), i in zip(spec.params, order)}
        rows = [bound[role] for role, kind in spec.params if kind == "rows"]
        if not rows or rows[0].shape is None or len(rows[0].shape) != 2 or not rows[0].type.is_float:
            continue
        shape, rows_type = rows[0].shape, rows[0].type
        if not all(_fits(bound[role], kind, shape, rows_type) for role, kind in spec.params):
            continue
        for roles, grad in spec.forms:
            if len(roles) != len(outs):
                continue
            for named in itertools.permutations(sorted(roles)):
                if all(o.role == "out" and _fits(o, kinds[r], shape, rows_type) for o, r in zip(outs, named)):
                    yield {role: i for (role, _), i in zip(spec.params, order)}, named, grad


def _fits(slot, kind: str, shape: tuple, rows_type) -> bool:
    rows, cols = shape
    if kind == "eps":
        return slot.shape is None and slot.type.is_float
    if slot.shape is None:
        return False
    if kind in ("rows", "weight"):
        return slot.type == rows_type and tuple(slot.shape) == (shape if kind == "rows" else (cols,))
    if kind == "labels":
        return slot.type.is_int and tuple(slot.shape) == (rows, 1)
    want = {"stat": (rows, 1), "total": (1,)}[kind]
    return slot.type.is_float and tuple(slot.shape) == want


def _computes(spec: Spec, program, pipeline, params: dict, outputs: tuple) -> bool:
    """Whether fusec's reference of the pipeline equals the kernel's model on the probes, under this binding."""
    from fusec.reference import run as reference
    bits = min(s.type.bits for s in list(pipeline.params) + list(pipeline.outputs) if s.type.is_float)
    tol = _TOLERANCE[min(64, max(16, bits))]
    x = pipeline.params[next(i for role, i in params.items() if dict(spec.params)[role] == "rows")]
    for rows, cols, eps, seed in _PROBES:
        rows = x.shape[0] if isinstance(x.shape[0], int) else rows
        cols = x.shape[1] if isinstance(x.shape[1], int) else cols
        rng = np.random.default_rng(seed)
        values = {}
        for role, kind in spec.params:
            slot = pipeline.params[params[role]]
            if kind == "eps":
                values[role] = eps
            elif kind == "rows":
                values[role] = rng.standard_normal((rows, cols)) * rng.uniform(0.3, 2.0, (rows, 1))
            elif kind == "weight":
                values[role] = rng.uniform(0.5, 1.5, cols) if role == "w" else rng.standard_normal(cols) * 0.5
            else:
                label = rng.integers(0, cols, (rows, 1))
                label[rows // 2] = IGNORE_INDEX
                values[role] = label
        # the arguments in the pipeline's types, and the model given the same (rounded) values
        args = [None] * len(pipeline.params)
        for role, i in params.items():
            slot, value = pipeline.params[i], values[role]
            args[i] = float(value) if slot.shape is None else np.asarray(value).astype(slot.type.numpy_dtype)
            values[role] = value if slot.shape is None else args[i].astype(np.float64 if slot.type.is_float else np.int64)
        try:
            with np.errstate(all="ignore"):
                got = reference(program, pipeline.name, *args)
            expected = spec.model(**values)
        except Exception:  # a pipeline the probe cannot run is not this kernel
            return False
        got = got if isinstance(got, tuple) else (got,)
        for role, actual in zip(outputs, got):
            actual, want = np.asarray(actual, dtype=np.float64), np.asarray(expected[role], dtype=np.float64)
            if actual.shape != want.shape or not np.allclose(actual, want, rtol=tol, atol=tol):
                return False
    return True


# ---- the peer, or why there is none

def installed() -> bool:
    try:
        return importlib.util.find_spec("liger_kernel") is not None
    except (ValueError, ImportError):  # in sys.modules without a spec
        return sys.modules.get("liger_kernel") is not None


def liger_peer(program, name: str, backend: str, grad: bool = False) -> tuple[Callable | None, str]:
    """(f(*torch tensors) -> the pipeline's outputs, its note), or (None, why it is skipped)."""
    if not installed():
        return None, "skipped: Liger is not installed"
    kernel = liger_kernel_for(program, name)
    if kernel is None:
        return None, "skipped: Liger has no kernel for this pipeline"
    if grad and not kernel.grad:
        return None, (f"skipped: Liger has no kernel for this pipeline's forward + backward "
                      f"({kernel.spec.name}: {_NO_BACKWARD[kernel.spec.name]})")
    if backend != "cuda":
        return None, "skipped: Liger's Triton kernels run on CUDA only"
    try:
        return kernel.function(), kernel.note
    except Exception as exc:  # Triton or a Liger backend missing here
        return None, f"skipped: Liger cannot be imported: {type(exc).__name__}: {str(exc)[:80]}"
