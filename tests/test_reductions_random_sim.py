"""Random pipelines with row reductions (sim tier): chains of elementwise
statements and reductions over the same rows, each read before or after its
reduction, with per-row and per-column inputs and outputs of both shapes. The
fused form (one row kernel) equals the unfused one (a kernel per statement) bit
for bit, since both reduce in the same order, and both follow the reference
closely. FUSEC_ROWS_SEED and FUSEC_ROWS_COUNT pick other programs."""
import os
import random

import numpy as np
import pytest

import fusec

pytestmark = pytest.mark.sim
SEED = int(os.environ.get("FUSEC_ROWS_SEED", "0"))
COUNT = int(os.environ.get("FUSEC_ROWS_COUNT", "16"))
REDUCTIONS = ["row_sum", "row_mean", "row_max", "row_min", "row_var", "row_logsumexp"]
UNARY = ["exp({})", "tanh({})", "sigmoid({})", "abs({})", "({} * {})", "sqrt(abs({}))"]
BINARY = ["({} + {})", "({} - {})", "({} * {})", "({} / (1.0 + abs({})))"]


def generate(seed: int) -> tuple[str, list[str]]:
    """A pipeline over x, y: f32[r, c], w: f32[c], g: f32[r, 1]; its outputs' names."""
    rng = random.Random(seed)
    elements, rows = ["x", "y", "w"], ["g"]  # values over the row, and one per row
    lines, outputs = [], []

    def expression(depth: int) -> str:
        pick = rng.random()
        if depth == 0 or pick < 0.3:
            return rng.choice(elements + rows + ["0.5", "2.0"])
        if pick < 0.55:
            inner = expression(depth - 1)
            return rng.choice(UNARY).format(inner, inner)
        if pick < 0.75 and depth > 1:
            reduction = rng.choice(REDUCTIONS)
            return f"{reduction}({rng.choice(elements)} * {expression(depth - 2)})"
        return rng.choice(BINARY).format(expression(depth - 1), expression(depth - 1))

    for n in range(rng.randint(2, 5)):
        name = f"t{n}"
        if rng.random() < 0.4:  # a reduction statement: one value per row
            lines.append(f"{name} = {rng.choice(REDUCTIONS)}({rng.choice(elements)} * {expression(2)});")
            rows.append(name)
        else:
            lines.append(f"{name} = {rng.choice(elements)} + {expression(3)};")
            elements.append(name)
    finals = [v for v in elements + rows if v.startswith("t")][-2:]
    body = []
    for n, value in enumerate(finals):
        shape = "[r, 1]" if value in rows else "[r, c]"
        outputs.append((f"out{n}", shape))
        body.append(f"out{n} = {value};")
    decls = ", ".join(f"{name}: f32{shape}" for name, shape in outputs)
    text = (f"pipeline p(x: f32[r, c], y: f32[r, c], w: f32[c], g: f32[r, 1]) -> ({decls}) {{\n    "
            + "\n    ".join(lines + body) + "\n}")
    return text, [name for name, _ in outputs]


@pytest.mark.parametrize("seed", range(SEED, SEED + COUNT))
def test_random_row_pipeline_fused_equals_unfused_and_the_reference(seed):
    text, outputs = generate(seed)
    rng = np.random.default_rng(seed)
    length = [1, 5, 33, 300, 2052][seed % 5]  # one element, odd, a warp and one; vectors a warp, a block a row
    args = [rng.standard_normal((3, length)).astype(np.float32), rng.standard_normal((3, length)).astype(np.float32),
            rng.standard_normal(length).astype(np.float32), rng.standard_normal((3, 1)).astype(np.float32)]
    results = {}
    for name, options in {"fused": dict(backend="sim"), "unfused": dict(backend="sim", fuse="none"),
                          "reference": dict(backend="numpy")}.items():
        got = fusec.jit(text, **options)(*args)
        results[name] = got if isinstance(got, tuple) else (got,)
    kernels = fusec.jit(text, backend="sim").compiled.interface.kernels
    assert any(k.kernel.rows for k in kernels) or "row_" not in text, text
    for out, fused, unfused, want in zip(outputs, results["fused"], results["unfused"], results["reference"]):
        np.testing.assert_array_equal(fused.view(np.uint32), unfused.view(np.uint32), err_msg=f"{out}\n{text}")
        np.testing.assert_allclose(fused, want, rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=f"{out}\n{text}")
