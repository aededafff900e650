"""`fusec bench --grad` on the sim backend (the emitted CUDA C, run on the CPU):
an out-of-place bias-GELU (f32, and retyped to bf16) and RMSNorm,
forward + backward beside torch eager autograd and torch.compile, fusec's
gradients checked against torch autograd's before timing. Sim tier."""
import pytest
from helpers import ROOT
from test_bench_grad import RMSNORM, _wrong_fused_backward, assert_rows, bench, cli  # noqa: F401 (a fixture)

pytestmark = pytest.mark.sim

BIAS_GELU = """\
pipeline bias_gelu(x: f32[rows, cols], b: f32[cols]) -> (y: f32[rows, cols]) {
    h = x + b;
    y = 0.5 * h * (1.0 + tanh(0.7978845608 * (h + 0.044715 * h * h * h)));
}
"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_bias_gelu_forward_and_backward_on_the_sim(cli, tmp_path, dtype):  # noqa: F811
    pytest.importorskip("torch")
    path = tmp_path / "bias_gelu.fz"
    path.write_text(BIAS_GELU)
    proc, rows = bench(cli, tmp_path, path, "--backend", "sim", "--dtype", dtype)
    assert_rows(proc, rows, ["bias_gelu"])
    assert all(r["dtype"] == dtype for r in rows.values())


def test_rmsnorm_forward_and_backward_on_the_sim(cli, tmp_path):  # noqa: F811
    pytest.importorskip("torch")
    proc, rows = bench(cli, tmp_path, RMSNORM, "--backend", "sim")
    assert_rows(proc, rows, ["rmsnorm", "rmsnorm_bf16"])


def test_a_wrong_backward_on_the_sim_is_not_timed(cli, tmp_path, monkeypatch):  # noqa: F811
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "compile", lambda fn: fn)
    _wrong_fused_backward(monkeypatch)
    _, rows = bench(cli, tmp_path, ROOT / "examples" / "softmax.fz", "--backend", "sim")
    for (pipeline, variant), row in rows.items():
        if variant == "fusec fused":
            assert row["us_per_call"] is None and row["note"].startswith("not timed: gradient"), row
        elif variant == "fusec unfused":
            assert row["us_per_call"] > 0, row
