"""`fusec bench`: fusec against the copy limit and the peers, side by side, on a GPU.

For each size it first checks fusec's result against the NumPy reference (on
fresh random data; at the large sizes, fused against unfused on the device),
then times, in one run: a 16-byte copy of the pipeline's minimum traffic (the
limit), fusec fused and unfused, torch eager, torch.compile and cupy.fuse
(each generated from the IR; a missing peer is listed as skipped), and Liger
where it has a kernel for the pipeline (RMSNorm, LayerNorm, softmax, SwiGLU,
residual add + RMSNorm, cross-entropy: fusec.bench.liger matches the pipeline
by its parameters and what it computes, not its name). Each peer's outputs are
checked before anything is timed: against fusec fused's on the same call
(itself checked against unfused there, and the reference at the check size),
and Liger's first against the NumPy reference on at most 2^20 elements in rows
of the same length; a peer that differs is not timed and its row says why. Time per
call is the median of 5 repetitions of a back-to-back loop timed with CUDA
events (PERF.md's method), so at small sizes it is the host's dispatch rate.
"""
from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from fusec.bench.liger import liger_peer
from fusec.bench.peers import TorchOps, Unsupported, XpOps, check_supported, peer_function
from fusec.errors import Source
from fusec.frontend import check_source
from fusec.ir.program import Program
from fusec.jit import JitOptions, JitPipeline
from fusec.passes.lower import lower
from fusec.reference import run as reference
from fusec.types import BF16

FLOATS = ("f16", "bf16", "f32", "f64")
# The innermost dim of a 2-D pipeline in the benchmark (a transformer's hidden size).
INNER = 4096
# One repetition of the timing loop runs at least this long (seconds).
REP_SECONDS = 0.02
REPS = 5
# Liger's outputs are checked against the reference on at most this many elements (rows of the timed length).
CHECK_ELEMENTS = 2 ** 20
# Peers that take torch tensors (the others take CuPy arrays).
TORCH_PEERS = ("torch eager", "torch.compile", "Liger")


@dataclass
class Row:
    pipeline: str
    dtype: str
    size: int
    variant: str
    us_per_call: float | None
    tb_per_s: float | None = None
    pct_of_copy: float | None = None
    speedup_vs_unfused: float | None = None
    note: str = ""
    grad: bool = False  # forward + backward (`fusec bench --grad`), not the forward alone


def _code(program_text: str) -> str:
    return "\n".join(line for line in program_text.splitlines() if not line.lstrip().startswith("#"))


def float_types(program_text: str) -> list[str]:
    """The float types a program's text names (comments aside)."""
    code = _code(program_text)
    return sorted({t for t in FLOATS if re.search(rf"\b{t}\b", code)})


def retype(program_text: str, float_type: str, name: str) -> Program:
    """The program with its one float type replaced (comments dropped)."""
    code, found = _code(program_text), float_types(program_text)
    if len(found) > 1:
        raise ValueError(f"--dtype needs a program with one float type; this one has {', '.join(found)}")
    if found:
        code = re.sub(rf"\b{found[0]}\b", float_type, code)
    return check_source(Source(f"{name}[{float_type}]", code))


def dims_for(pipeline, size: int, row_length: int = INNER) -> dict[str, int]:
    """Dim sizes giving `size` elements: innermost dims `row_length` wide (or all of it), the first outer the rest."""
    inner = {p.shape[-1] for p in pipeline.params if p.shape and len(p.shape) > 1 and isinstance(p.shape[-1], str)}
    names = [d for p in pipeline.params if p.shape for d in p.shape if isinstance(d, str)]
    dims = {}
    width = min(row_length, size)
    for d in dict.fromkeys(names):
        dims[d] = width if d in inner else (size // width if inner else size)
    return dims


def chosen(f, length: int) -> str:
    """The variant the runtime takes for rows of `length` (arrays aligned) of each
    row kernel of jitted pipeline `f`, and the count of its other kernels."""
    from fusec.ir.launch import RowBlock
    from fusec.passes.variants import variant_for_rows
    kernels = f.compiled.interface.kernels
    rows = [k for k in kernels if isinstance(k.form, RowBlock)]
    names = [variant_for_rows(k.variants, length).name for k in rows]
    return "+".join(names) + (f" (+{len(kernels) - len(rows)} more)" if len(kernels) > len(rows) else "")


def minimum_bytes(pipeline, dims: dict[str, int]) -> int:
    """The minimum traffic of a call: each array parameter read once (an inout
    also written once), each output written once (a softmax's x and y; a
    cross-entropy's logits, labels and one loss a row)."""
    total = 0
    for slot in list(pipeline.params) + list(pipeline.outputs):
        if slot.shape is not None:
            size = math.prod(dims[d] if isinstance(d, str) else d for d in slot.shape) * slot.type.itemsize
            total += size * (2 if slot.role == "inout" else 1)
    return total


def make_args(cp, pipeline, dims: dict[str, int], seed: int):
    """Fresh random device arrays (never zeros) and scalars for a call."""
    rng = cp.random.default_rng(seed)
    args = []
    for p in pipeline.params:
        if p.shape is None:
            args.append(3 if p.type.is_int else True if p.type.is_bool else 0.7)
            continue
        shape = tuple(d if isinstance(d, int) else dims[d] for d in p.shape)
        if p.type.is_bool:
            args.append(rng.random(shape, dtype=cp.float32) < 0.5)
        elif p.type.is_int:
            args.append(rng.integers(1, 50, shape).astype(p.type.numpy_dtype))
        else:
            args.append((rng.standard_normal(shape, dtype=cp.float32) * 0.5 + 0.1).astype(p.type.numpy_dtype))
    return args


def time_gpu(cp, fn) -> float:
    """Median µs per call of a back-to-back loop, timed with CUDA events."""
    fn()
    cp.cuda.Device().synchronize()
    start = time.perf_counter()
    fn()
    cp.cuda.Device().synchronize()
    iters = max(1, min(2000, int(REP_SECONDS / max(time.perf_counter() - start, 1e-6))))
    samples = []
    for _ in range(REPS):
        begin, end = cp.cuda.Event(), cp.cuda.Event()
        begin.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(begin, end) * 1000 / iters)
    return statistics.median(samples)


def time_host(cp, fn, iters: int = 2000) -> float:
    """Host µs per call (what the caller's thread spends), the median of 5 loops."""
    for _ in range(20):
        fn()
    samples = []
    for _ in range(REPS):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - start) * 1e6 / iters)
        cp.cuda.Device().synchronize()
    return statistics.median(samples)


_COPY = r'''
extern "C" __global__ void fz_copy16(const float4* __restrict__ src, float4* __restrict__ dst, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
'''


def time_copy(cp, nbytes: int) -> float:
    """µs of a 16-byte copy moving `nbytes` (half read, half written): the limit
    a pipeline of that minimum traffic is held to."""
    words = max(1, nbytes // 32)  # float4s read (and as many written)
    src, dst = cp.empty(words * 4, cp.float32), cp.empty(words * 4, cp.float32)
    src[...] = 1.0
    copy = cp.RawKernel(_COPY, "fz_copy16")
    return time_gpu(cp, lambda: copy((-(-words // 256),), (256,), (src, dst, np.int64(words))))


class Bench:
    def __init__(self, program: Program, name: str, float_type: str, graph: bool = False, fuse: str = "auto",
                 row_length: int = INNER):
        self.row_length = row_length
        import cupy as cp
        self.cp = cp
        self.program, self.name, self.float_type = program, name, float_type
        self.pipeline = program.pipeline(name)
        self.fused = JitPipeline(program, name, JitOptions(fuse=fuse, backend="cuda"))
        self.unfused = JitPipeline(program, name, JitOptions(fuse="none", backend="cuda"))
        # With graph=True, both forms again, each call one CUDA graph replay.
        self.graphs = {f"fusec {form}, graph": JitPipeline(program, name, JitOptions(fuse=fuse if form == "fused" else "none", backend="cuda", graph=True))
                       for form in ("fused", "unfused")} if graph else {}
        self.peers = self._peers()

    def _peers(self) -> dict:
        """name -> (callable(args) or None, note)."""
        cp, graph = self.cp, lower(self.program, self.pipeline)
        params = [p.name for p in self.pipeline.params]
        peers = {}
        try:
            import torch
            self._torch = torch
            ops = TorchOps(torch)
            check_supported(graph, ops)
            eager = peer_function(graph, ops, params)
            peers["torch eager"] = (lambda args: eager(*args), "")
            compiled = torch.compile(eager)
            peers["torch.compile"] = (lambda args: compiled(*args), "")
        except ImportError:
            peers["torch eager"] = peers["torch.compile"] = (None, "skipped: PyTorch is not installed")
        except Unsupported as why:
            peers["torch eager"] = peers["torch.compile"] = (None, f"skipped: {why}")
        try:
            import cupyx.scipy.special as special
            ops = XpOps(cp, erf=special.erf)
            check_supported(graph, ops)
            if any(v.type.name == "bf16" for v in graph.values):
                raise Unsupported("cupy.fuse has no bfloat16 (CuPy 14)")
            if graph.loops:
                raise Unsupported("cupy.fuse cannot loop a repeat count")
            fused = cp.fuse(peer_function(graph, ops, params, in_place=False))
            peers["cupy.fuse"] = (lambda args: fused(*args), "out of place")
        except Unsupported as why:
            peers["cupy.fuse"] = (None, f"skipped: {why}")
        if hasattr(self, "_torch"):
            liger, note = liger_peer(self.program, self.name, "cuda")
            peers["Liger"] = (None if liger is None else lambda args: liger(*args), note)
        else:
            peers["Liger"] = (None, "skipped: Liger needs PyTorch")
        return peers

    def _torch_args(self, args):
        torch = self._torch
        return [torch.from_dlpack(a) if isinstance(a, self.cp.ndarray) else a for a in args]

    def check(self, size: int) -> None:
        """fused == reference on fresh random host data at `size` (odd sizes test the tails)."""
        cp = self.cp
        dims = dims_for(self.pipeline, size, self.row_length)
        args = make_args(cp, self.pipeline, dims, seed=size)
        host = [a.get() if isinstance(a, cp.ndarray) else a for a in args]
        expected = reference(self.program, self.name, *host)
        got = self.fused(*args)
        inout = [(a, h) for p, a, h in zip(self.pipeline.params, args, host) if p.role == "inout"]
        pairs = list(zip(_tuple(got), _tuple(expected))) + inout
        for actual, want in pairs:
            _assert_close(actual.get(), want, f"{self.name}: fused result differs from the reference at n={size}")

    def run(self, size: int) -> list[Row]:
        cp = self.cp
        dims = dims_for(self.pipeline, size, self.row_length)
        args = make_args(cp, self.pipeline, dims, seed=size + 1)
        # The same call fused and unfused agree on the device before anything is timed.
        fused_out = self.fused(*[a.copy() if isinstance(a, cp.ndarray) else a for a in args])
        unfused_out = self.unfused(*[a.copy() if isinstance(a, cp.ndarray) else a for a in args])
        for a, b in zip(_tuple(fused_out), _tuple(unfused_out)):
            _assert_close(a.get(), b.get(), f"{self.name}: fused and unfused differ at n={size}")
        # Each peer's outputs checked before anything is timed (a peer that differs is not timed).
        notes = {}
        for name, (fn, note) in self.peers.items():
            why = None if fn is None else self._check_peer(name, fn, size, args, fused_out)
            notes[name] = note if why is None else f"{note}; {why}" if note else why
        nbytes = self.minimum_bytes(dims)
        times = {"copy (16-byte, the limit)": time_copy(cp, nbytes)}
        times["fusec fused"] = time_gpu(cp, lambda: self.fused(*args))
        times["fusec unfused"] = time_gpu(cp, lambda: self.unfused(*args))
        for label, pipeline in self.graphs.items():
            times[label] = time_gpu(cp, lambda: pipeline(*args))
        for name, (fn, note) in self.peers.items():
            times[name] = None
            if fn is None or notes[name] != note:  # skipped, or its check found it wrong or failing
                continue
            peer_args = self._torch_args(args) if name in TORCH_PEERS else args
            try:
                times[name] = time_gpu(cp, lambda: fn(peer_args))
            except Exception as exc:  # a peer failing is recorded, not fatal
                times[name], notes[name] = None, f"failed: {type(exc).__name__}: {str(exc)[:80]}"
        rows = []
        for variant, us in times.items():
            row = Row(self.name, self.float_type, size, variant, us, note=notes.get(variant, ""))
            if us:
                row.tb_per_s = nbytes / (us * 1e-6) / 1e12
                row.pct_of_copy = 100 * times["copy (16-byte, the limit)"] / us
                row.speedup_vs_unfused = times["fusec unfused"] / us
            rows.append(row)
        return rows

    def _check_peer(self, name: str, fn, size: int, args: list, fused_out) -> str | None:
        """Why peer `name` is not timed (None: its outputs agree), on copies of the arguments.
        Liger's first against the reference on at most CHECK_ELEMENTS (its mapping is matched, not
        generated from the IR), then every peer's against fusec fused's on the timed call."""
        cp = self.cp
        try:
            if name == "Liger":
                dims = dims_for(self.pipeline, min(size, CHECK_ELEMENTS), self.row_length)
                small = make_args(cp, self.pipeline, dims, seed=size + 2)
                got = self._peer_outputs(name, fn, small)
                expected = _tuple(reference(self.program, self.name, *[_host(a) for a in small]))
                why = outputs_mismatch(self.pipeline, got, expected, "the reference's")
                if why is not None:
                    return f"not timed: {why}"
            why = outputs_mismatch(self.pipeline, self._peer_outputs(name, fn, args), _tuple(fused_out), "fusec fused's")
            return None if why is None else f"not timed: {why}"
        except Exception as exc:  # a peer failing is recorded, not fatal
            return f"failed: {type(exc).__name__}: {str(exc)[:80]}"

    def _peer_outputs(self, name: str, fn, args: list) -> tuple:
        """The pipeline's outputs as peer `name` gives them (cupy.fuse's out-of-place inout values left out)."""
        args = [a.copy() if isinstance(a, self.cp.ndarray) else a for a in args]
        result = fn(self._torch_args(args) if name in TORCH_PEERS else args)
        return _tuple(result)[:len(self.pipeline.outputs)]

    def minimum_bytes(self, dims: dict[str, int]) -> int:
        return minimum_bytes(self.pipeline, dims)

    def dispatch(self, size: int = 4096) -> list[Row]:
        """Host µs per call at `size`: fusec (allocating, and with out=) against a bare CuPy launch."""
        cp = self.cp
        args = make_args(cp, self.pipeline, dims_for(self.pipeline, size, self.row_length), seed=7)
        interface = self.fused.compiled.interface
        rows = [Row(self.name, self.float_type, size, "host: fusec call", time_host(cp, lambda: self.fused(*args)))]
        if len(interface.kernels) == 1 and self.pipeline.outputs:
            outs = self.fused(*args)
            rows.append(Row(self.name, self.float_type, size, "host: fusec call with out=",
                            time_host(cp, lambda: self.fused(*args, out=outs))))
            (launch,) = interface.kernels
            variant = launch.variants[0]  # the widest, where the arrays are aligned (fresh CuPy arrays are)
            raw = cp.RawKernel(self.fused.cuda_source, variant.name)
            bare = self._bare_args(args, outs, launch)
            per_thread = variant.elements_per_thread
            grid = (-(-(-(-size // per_thread)) // 256),)  # one vector per thread, 256 threads a block
            rows.append(Row(self.name, self.float_type, size, "host: bare cupy.RawKernel launch",
                            time_host(cp, lambda: raw(grid, (256,), bare))))
        return rows

    def _bare_args(self, args, outs, launch):
        """The kernel's arguments packed as CuPy takes them, from its parameters' sources."""
        from fusec.ir.launch import ArrayArg, NumElements, ScalarArg
        values = list(args) + list(_tuple(outs))
        n = int(np.prod(_tuple(outs)[0].shape))
        packed = []
        for p in launch.params:
            match p.source:
                case ArrayArg(slot) | ScalarArg(slot):
                    value = values[slot]
                case NumElements():
                    value = n
                case source:
                    raise ValueError(f"the bare launch takes a plain elementwise kernel, not {source}")
            packed.append(value if p.pack is None else p.pack.numpy_dtype.type(value))
        return tuple(packed)


def _tuple(x):
    return x if isinstance(x, tuple) else (x,) if x is not None else ()


def outputs_mismatch(pipeline, got: tuple, expected: tuple, source: str) -> str | None:
    """Why a peer's outputs (torch tensors, CuPy or NumPy arrays) differ from the expected
    ones (None: they agree, at the tolerance of the narrowest float of the pair and the
    pipeline's float parameters: a peer may keep an f32 result of bf16 inputs in bf16, as
    Liger's cross-entropy keeps its losses in the logits' type)."""
    widths = [p.type.itemsize for p in pipeline.params if p.type.is_float and p.shape is not None]
    if len(got) != len(expected):
        return f"{len(got)} outputs, {source} {len(expected)}"
    for slot, actual, want in zip(pipeline.outputs, got, expected):
        tol = TOLERANCE[min(_itemsize(actual), _itemsize(want), *widths, 8)]
        found = array_mismatch(f"output {slot.name}", _host(actual), _host(want), source, tol, tol)
        if found:
            return found
    return None


# A float result against its expectation, by the bytes of its type.
TOLERANCE = {2: 2e-2, 4: 1e-4, 8: 1e-9}


def array_mismatch(what: str, actual: np.ndarray, expected: np.ndarray, source: str, rtol: float,
                   atol: float) -> str | None:
    """Why `actual` differs from `expected` (host arrays: integers and bools exactly,
    floats within rtol and atol, NaN equal to NaN), None where they agree."""
    if actual.shape != expected.shape:
        return f"{what} has shape {actual.shape}, {source} {expected.shape}"
    if actual.dtype.kind in "biu" or expected.dtype.kind in "biu":
        return None if np.array_equal(actual, expected) else f"{what} differs from {source}"
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    if np.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
        return None
    worst = float(np.nanmax(np.abs(a - e))) if a.size else 0.0
    return f"{what} differs from {source} (max |diff| {worst:.3g}, tolerance {atol:.3g})"


def _host(a):
    """A torch tensor (floats as f64), CuPy or NumPy array as NumPy on the host (CuPy's bf16 as
    ml_dtypes' bfloat16); a scalar as it is."""
    if hasattr(a, "detach"):  # torch
        a = a.detach()
        return (a.double() if a.is_floating_point() else a).cpu().numpy()
    if not hasattr(a, "dtype"):
        return a
    if hasattr(a, "get"):  # CuPy
        a = a.get()
    a = np.asarray(a)
    return a.view(BF16.numpy_dtype) if a.dtype.kind == "V" else a


def _itemsize(a) -> int:
    if hasattr(a, "element_size"):  # torch
        return a.element_size()
    return np.dtype(a.dtype).itemsize if hasattr(a, "dtype") else 8


def _assert_close(actual, expected, message: str) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype.kind in "biu":
        ok = np.array_equal(actual, expected)
    else:
        tol = {2: 2e-2, 4: 1e-4, 8: 1e-9}[actual.dtype.itemsize]
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        ok = np.allclose(a, e, rtol=tol, atol=tol, equal_nan=True)
    if not ok:
        raise AssertionError(message)


def format_rows(rows: list[Row]) -> str:
    header = "| pipeline | dtype | elements | variant | µs/call | TB/s | % of copy | × unfused | note |"
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        cells = [f"{r.pipeline} (fwd+bwd)" if r.grad else r.pipeline, r.dtype, _size(r.size), r.variant, _num(r.us_per_call, 1), _num(r.tb_per_s, 2),
                 _num(r.pct_of_copy, 1), _num(r.speedup_vs_unfused, 2), r.note]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _size(n: int) -> str:
    return f"2^{int(math.log2(n))}" if n & (n - 1) == 0 else str(n)


def _num(x, digits: int) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def to_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]


def plot(rows: list[Row], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for variant in dict.fromkeys(r.variant for r in rows if not r.variant.startswith("host")):
        points = [(r.size, r.tb_per_s) for r in rows if r.variant == variant and r.tb_per_s]
        if points:
            ax.plot(*zip(*points), marker="o", label=variant)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements")
    ax.set_ylabel("TB/s of minimum traffic")
    title = ", ".join(dict.fromkeys(f"{r.pipeline} ({r.dtype})" for r in rows))
    ax.set_title(title[:100])
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
