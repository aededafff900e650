"""Random pipelines with column sums (sim tier): elementwise statements over
[r, c] before and after `col_sum`s of them, several sums of the same elements,
outputs of both shapes. The fused form (the statements over the summed elements
in the sums' kernel) equals the unfused one bit for bit (the sums' order is
fixed: ir.program.COLUMN_CHUNKS) and follows the reference closely.
FUSEC_COLUMNS_SEED and FUSEC_COLUMNS_COUNT pick other programs."""
import os
import random

import numpy as np
import pytest

import fusec

pytestmark = pytest.mark.sim
SEED = int(os.environ.get("FUSEC_COLUMNS_SEED", "0"))
COUNT = int(os.environ.get("FUSEC_COLUMNS_COUNT", "12"))
UNARY = ["exp(-abs({}))", "tanh({})", "sigmoid({})", "abs({})", "({} * {})", "sqrt(abs({}))"]
BINARY = ["({} + {})", "({} - {})", "({} * {})", "({} / (1.0 + abs({})))"]


def generate(seed: int) -> tuple[str, list[str]]:
    rng = random.Random(seed)
    elements, sums, lines, outputs = ["x", "y", "w"], [], [], []

    def expression(depth: int, pool: list[str]) -> str:
        if depth <= 0 or rng.random() < 0.3:
            return rng.choice(pool)
        if rng.random() < 0.5:
            return rng.choice(UNARY).format(*[expression(depth - 1, pool)] * 2)
        return rng.choice(BINARY).format(expression(depth - 1, pool), expression(depth - 1, pool))

    for n in range(rng.randint(2, 6)):
        if sums and rng.random() < 0.3:  # an elementwise statement reading a sum: after the sums' kernels
            name = f"e{n}"
            lines.append(f"{name} = {rng.choice('xy')} * {expression(2, elements)} * {rng.choice(sums)};")
            elements.append(name)
        elif rng.random() < 0.5:
            name = f"s{n}"
            lines.append(f"{name} = col_sum({rng.choice('xy')} * {expression(2, elements)});")
            sums.append(name)
        else:
            name = f"e{n}"
            lines.append(f"{name} = {rng.choice('xy')} + {expression(3, elements)};")
            elements.append(name)
    if not sums:
        lines.append(f"s9 = col_sum({rng.choice(elements)});")
        sums.append("s9")
    for name in [e for e in elements if e.startswith("e")] + sums:
        if rng.random() < 0.6 or name == sums[-1]:
            outputs.append((name, "[c]" if name.startswith("s") else "[r, c]"))
    body = [f"{name}_out = {name};" for name, _ in outputs]
    decls = ", ".join(f"{name}_out: f32{shape}" for name, shape in outputs)
    text = (f"pipeline p(x: f32[r, c], y: f32[r, c], w: f32[c]) -> ({decls}) {{\n    "
            + "\n    ".join(lines + body) + "\n}")
    return text, [name for name, _ in outputs]


@pytest.mark.parametrize("seed", range(SEED, SEED + COUNT))
def test_random_column_pipeline_fused_equals_unfused_and_the_reference(seed):
    text, outputs = generate(seed)
    rng = np.random.default_rng(seed)
    rows, cols = [(1, 3), (7, 33), (300, 5), (129, 64)][seed % 4]
    args = [rng.standard_normal((rows, cols)).astype(np.float32), rng.standard_normal((rows, cols)).astype(np.float32),
            rng.standard_normal(cols).astype(np.float32)]
    results = {}
    for name, options in {"fused": dict(backend="sim"), "unfused": dict(backend="sim", fuse="none"),
                          "reference": dict(backend="numpy")}.items():
        got = fusec.jit(text, **options)(*args)
        results[name] = got if isinstance(got, tuple) else (got,)
    for out, fused, unfused, want in zip(outputs, results["fused"], results["unfused"], results["reference"]):
        np.testing.assert_array_equal(fused.view(np.uint32), unfused.view(np.uint32), err_msg=f"{out}\n{text}")
        np.testing.assert_allclose(fused, want, rtol=1e-4, atol=1e-4 * rows, equal_nan=True, err_msg=f"{out}\n{text}")


def test_the_generator_fuses_statements_into_the_sums_kernel():
    """The property the programs above exercise: some seed's sums kernel also stores elementwise results."""
    for seed in range(SEED, SEED + COUNT):
        text, _ = generate(seed)
        for launch in fusec.jit(text, backend="numpy").compiled.interface.kernels:
            stages = launch.kernel.stages
            if any(s.startswith("col_partial") for s in stages) and any(not s.startswith("col_") for s in stages):
                return
    pytest.fail("no program put an elementwise statement in a column sums kernel")
