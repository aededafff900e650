"""`fusec bench --grad` on the numpy backend (the CPU, small sizes): forward +
backward rows beside torch eager autograd and torch.compile, the gradients
checked before anything is timed (a wrong backward is reported, not timed),
the located error of a pipeline that cannot be differentiated, and the
options --grad refuses. Unit tier; tests/test_bench_grad_sim.py runs the sim."""
import functools
import json
import subprocess
import sys

import pytest
from helpers import ROOT

from fusec.bench import grad as bench_grad

RMSNORM = ROOT / "examples" / "rmsnorm.fz"
VARIANTS = ["copy (16-byte, the limit)", "fusec fused", "fusec unfused", "torch eager", "torch.compile", "Liger"]
SIZES = ("--sizes", "4096", "--row-length", "256")


@pytest.fixture
def cli(run_cli):
    """fusec run in this process (so that monkeypatch reaches it): a CompletedProcess-like result."""
    def run(*args):
        code, out, err = run_cli(*map(str, args))
        return subprocess.CompletedProcess(args, code, out, err)
    return run


@functools.cache
def torch_compile_runs() -> bool:
    """Whether torch.compile can compile a forward and its backward here (Inductor needs a C++ compiler)."""
    try:
        import torch
        x = torch.ones(4, requires_grad=True)
        (g,) = torch.autograd.grad(torch.compile(lambda t: (t * t).sum())(x), x)
        return bool((g == 2).all())
    except Exception:
        return False


def bench(cli, tmp_path, *args):
    out = tmp_path / "rows.json"
    proc = cli("bench", "--grad", *args, *SIZES, "--json", out)
    assert proc.returncode == 0, proc.stderr
    return proc, {(r["pipeline"], r["variant"]): r for r in json.loads(out.read_text())}


def assert_rows(proc, rows, pipelines):
    """Every pipeline has its six forward + backward rows, marked as such; fusec's and torch eager's timed."""
    assert sorted(rows) == sorted((p, v) for p in pipelines for v in VARIANTS)
    assert all(r["grad"] is True and r["size"] == 4096 for r in rows.values())
    for p in pipelines:
        assert f"| {p} (fwd+bwd) |" in proc.stdout
        for variant in ["copy (16-byte, the limit)", "fusec fused", "fusec unfused", "torch eager"]:
            row = rows[p, variant]
            assert row["us_per_call"] > 0 and row["tb_per_s"] > 0, row
            assert "not timed" not in row["note"] and "failed" not in row["note"], row
        compiled = rows[p, "torch.compile"]
        if torch_compile_runs():
            assert compiled["us_per_call"] > 0, compiled
        else:
            assert compiled["us_per_call"] is None and compiled["note"].startswith(("failed:", "skipped:")), compiled
        liger = rows[p, "Liger"]
        assert liger["us_per_call"] is None and liger["note"].startswith("skipped: Liger"), liger


def test_rmsnorm_forward_and_backward_beside_torch(cli, tmp_path):
    pytest.importorskip("torch")
    proc, rows = bench(cli, tmp_path, RMSNORM, "--backend", "numpy")
    assert_rows(proc, rows, ["rmsnorm", "rmsnorm_bf16"])
    # The copy's traffic is the forward's (x, w read, y written) plus the backward's (x, w, grad_y read,
    # grad_x, grad_w written; y too if it keeps y saved): its TB/s times its µs says so.
    copy = rows["rmsnorm", "copy (16-byte, the limit)"]
    moved = copy["tb_per_s"] * 1e12 * copy["us_per_call"] * 1e-6
    rows_, cols = 16, 256
    forward = 4 * (2 * rows_ * cols + cols)
    assert forward + 4 * (3 * rows_ * cols + 2 * cols) <= round(moved) <= forward + 4 * (4 * rows_ * cols + 2 * cols)


def _wrong_fused_backward(monkeypatch, factor=1.5):
    """fusec's fused step returns its gradients off by `factor` (the unfused one stays right)."""
    original = bench_grad.FusecStep.__call__

    def wrong(self, args, seeds):
        outputs, gradients = original(self, args, seeds)
        if self.forward.options.fuse != "none":
            gradients = tuple(g * factor for g in gradients)
        return outputs, gradients
    monkeypatch.setattr(bench_grad.FusecStep, "__call__", wrong)


def test_a_wrong_backward_is_reported_and_not_timed(cli, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "compile", lambda fn: fn)  # not what this test is about: quicker
    _wrong_fused_backward(monkeypatch)
    _, rows = bench(cli, tmp_path, RMSNORM, "--pipeline", "rmsnorm", "--backend", "numpy")
    fused = rows["rmsnorm", "fusec fused"]
    assert fused["us_per_call"] is None and fused["tb_per_s"] is None, fused
    assert fused["note"].startswith("not timed: gradient grad_x differs from torch autograd's"), fused
    unfused = rows["rmsnorm", "fusec unfused"]
    assert unfused["us_per_call"] > 0 and unfused["note"] == "", unfused


def test_without_torch_the_reference_of_the_backward_checks(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails: PyTorch is not installed
    proc, rows = bench(cli, tmp_path, RMSNORM, "--pipeline", "rmsnorm", "--backend", "numpy")
    for peer in ("torch eager", "torch.compile"):
        assert rows["rmsnorm", peer]["note"] == "skipped: PyTorch is not installed"
    fused = rows["rmsnorm", "fusec fused"]
    assert fused["us_per_call"] > 0 and "checked against the NumPy reference" in fused["note"], fused
    _wrong_fused_backward(monkeypatch, factor=1.01)
    _, rows = bench(cli, tmp_path, RMSNORM, "--pipeline", "rmsnorm", "--backend", "numpy")
    fused = rows["rmsnorm", "fusec fused"]
    assert fused["us_per_call"] is None and "differs from the reference's" in fused["note"], fused
    assert rows["rmsnorm", "fusec unfused"]["us_per_call"] > 0


def test_a_pipeline_that_cannot_be_differentiated_is_a_located_error(cli, tmp_path):
    inout = ROOT / "examples" / "bias_gelu.fz"  # updates h in place
    no_float = tmp_path / "count.fz"
    no_float.write_text("pipeline count(k: i32[n]) -> (y: f32[n]) {\n    y = f32(k);\n}\n")
    for path, message in ((inout, ":4:26: error: 'h' is updated in place (inout)"),
                          (no_float, ":1:10: error: pipeline 'count' has no float array parameter")):
        proc = cli("bench", "--grad", path, "--backend", "numpy", *SIZES, "--json", tmp_path / "rows.json")
        compiled = cli("compile", "--grad", path)
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
        assert proc.stderr == compiled.stderr and compiled.returncode == 1
        assert proc.stderr.startswith(f"{path}{message}"), proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
        assert not (tmp_path / "rows.json").exists()


@pytest.mark.parametrize("args,message", [
    (["--backend", "sim"], "--backend sim: without --grad, fusec bench times the forward on a GPU only"),
    (["--grad", "--backend", "numpy", "--graph"], "--graph times the forward only; leave it out with --grad"),
    (["--grad", "--backend", "numpy", "--dispatch"], "--dispatch times the forward only; leave it out with --grad"),
])
def test_options_grad_refuses(cli, args, message):
    proc = cli("bench", RMSNORM, *args)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.startswith(f"fusec bench: {message}"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1
