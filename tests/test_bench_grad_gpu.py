"""`fusec bench --grad` on the cuda backend at a small size: the same rows as on
the CPU (tests/test_bench_grad_sim.py), fusec's gradients checked against torch
autograd's on the device before timing; Liger's row timed where it is installed
(checked like the others: Liger casts as it does, so it may differ), else skipped. GPU tier."""
import pytest
from test_bench_grad import RMSNORM, VARIANTS, bench, cli  # noqa: F401 (a fixture)

pytestmark = pytest.mark.gpu


def test_rmsnorm_forward_and_backward_on_the_device(cli, tmp_path):  # noqa: F811
    pytest.importorskip("torch")
    proc, rows = bench(cli, tmp_path, RMSNORM, "--backend", "cuda")
    assert sorted(rows) == sorted((p, v) for p in ("rmsnorm", "rmsnorm_bf16") for v in VARIANTS)
    for (pipeline, variant), row in rows.items():
        assert row["grad"] is True
        if variant == "Liger":
            assert row["us_per_call"] is not None or row["note"].startswith(("skipped:", "not timed:")), row  # its maths may differ
        else:
            assert row["us_per_call"] > 0 and "not timed" not in row["note"], row
