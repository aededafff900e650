"""Where cross-entropy's time goes: the per-row loss alone, the loss and its mean
(examples/cross_entropy.fz), and the mean alone over stored losses, at 2^26 logits.

    PYTHONPATH=. python3 benchmarks/cross_entropy_parts.py [--dtype f32|bf16]
"""
from __future__ import annotations

import sys

import cupy as cp
import numpy as np

import fusec
from fusec.bench.harness import make_args, time_gpu
from fusec.errors import Source
from fusec.frontend import check_source

ELEMENTS = 2 ** 26
T = sys.argv[sys.argv.index("--dtype") + 1] if "--dtype" in sys.argv else "f32"
LOSS = f"""pipeline loss(logits: {T}[rows, vocab], label: i64[rows, 1]) -> (loss: f32[rows, 1]) {{
    loss = label == -100 ? 0.0 : row_logsumexp(logits) - row_pick(logits, label);
}}"""
_TEXT = open("examples/cross_entropy.fz").read()
_START = _TEXT.index("pipeline cross_entropy" + ("(" if T == "f32" else "_bf16("))
FULL = _TEXT[_START:_TEXT.index("\n}", _START) + 2]
MEAN = """pipeline mean(loss: f32[rows, 1], label: i64[rows, 1]) -> (mean: f32[1]) {
    counted = label == -100 ? 0.0 : 1.0;
    mean = col_sum(loss) / col_sum(counted);
}"""

print("| vocab | rows | loss alone µs | loss + mean µs | mean alone µs | logits TB/s (loss alone) |\n|---|---|---|---|---|---|")
for vocab in (4096, 32768, 65536, 131072, 262144):
    rows = ELEMENTS // vocab
    program = check_source(Source("loss.fz", LOSS))
    logits, label = make_args(cp, program.pipelines[0], {"rows": rows, "vocab": vocab}, seed=1)
    label = cp.random.default_rng(2).integers(0, vocab, (rows, 1)).astype(cp.int64)
    f_loss, f_full, f_mean = (fusec.jit(s, backend="cuda") for s in (LOSS, FULL, MEAN))
    want = fusec.jit(LOSS, backend="numpy")(logits.get(), label.get())
    np.testing.assert_allclose(f_loss(logits, label).get(), want, rtol=1e-3, atol=1e-3)
    loss = f_loss(logits, label)
    us = [time_gpu(cp, lambda: f_loss(logits, label)), time_gpu(cp, lambda: f_full(logits, label)),
          time_gpu(cp, lambda: f_mean(loss, label))]
    print(f"| {vocab} | {rows} | {us[0]:.1f} | {us[1]:.1f} | {us[2]:.1f} | {logits.nbytes / us[0] / 1e6:.2f} |", flush=True)
