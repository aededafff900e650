"""examples/ddp_train.py on the CPU (sim tier: the model's fusec ops, their
backward and the multi-tensor AdamW run on the sim): two processes under
torchrun (gloo) train like one process over the same global batch, and their
parameters stay bit-identical; the checks fail where they should; fusec's
AdamW (examples/adamw.fz, foreach) steps as torch.optim.AdamW does."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

import fusec

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.sim

SCRIPT = ROOT / "examples" / "ddp_train.py"


def script():
    """examples/ddp_train.py as a module (its functions, without running it)."""
    spec = importlib.util.spec_from_file_location("ddp_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*argv, torchrun=False) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"] \
        if torchrun else [sys.executable]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    return subprocess.run([*launcher, str(SCRIPT), "--backend", "sim", *argv], check=False, capture_output=True,
                          text=True, env=environment, cwd=ROOT, timeout=180)


@pytest.fixture(scope="module")
def gloo():
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")


def test_two_ranks_train_like_one_device_with_bit_identical_parameters(gloo, tmp_path):
    ddp = run("--steps", "3", "--check", str(tmp_path / "ddp.json"), torchrun=True)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    assert "losses: PASS: 3 steps" in ddp.stdout and "parameters: PASS: 2 ranks bit-identical" in ddp.stdout
    record = json.loads((tmp_path / "ddp.json").read_text())
    assert record["world_size"] == 2 and len(record["losses"]) == 3
    assert len(set(record["param_sha256"])) == 1 and len(record["param_sha256"]) == 2
    for a, b in zip(record["losses"], record["single_losses"]):
        assert abs(a - b) <= 1e-5 * abs(b)
    # The one-device run alone, as its own process, gives the same losses as rank 0's, and --compare agrees.
    single = run("--single", "--steps", "3", "--check", str(tmp_path / "single.json"))
    assert single.returncode == 0, single.stdout + single.stderr
    assert json.loads((tmp_path / "single.json").read_text())["losses"] == record["single_losses"]
    compared = run("--compare", str(tmp_path / "single.json"), str(tmp_path / "ddp.json"))
    assert compared.returncode == 0 and compared.stdout.rstrip().endswith("PASS"), compared.stdout + compared.stderr


def test_a_rank_whose_parameters_differ_fails_the_run(gloo):
    proc = run("--steps", "1", "--no-reference", "--fault-rank", "1", torchrun=True)
    assert proc.returncode != 0, proc.stdout
    assert "parameters: FAIL: 2 ranks DIFFER" in proc.stdout


def test_compare_fails_on_losses_apart_or_ranks_apart(tmp_path, capsys):
    ddp_train = script()
    ok, rel = ddp_train.compare_losses([1.0, 2.0], [1.0, 2.0 * (1 + 2e-5)])
    assert not ok and rel[0] == 0.0
    assert ddp_train.compare_losses([1.0, 2.0], [1.0 + 5e-6, 2.0])[0]
    assert not ddp_train.compare_losses([float("nan")], [float("nan")])[0]
    assert not ddp_train.compare_losses([1.0], [1.0, 1.0])[0]
    args = ddp_train.parse(["--backend", "sim", "--steps", "2"])
    single = ddp_train.record(args, 1, [2.5, 2.4], ["a"])
    for losses, digests, fails in [([2.5, 2.4], ["b", "b"], None),
                                   ([2.5, 2.41], ["b", "b"], "losses: FAIL"),
                                   ([2.5, 2.4], ["b", "c"], "parameters: FAIL")]:
        (tmp_path / "s.json").write_text(json.dumps(single))
        (tmp_path / "d.json").write_text(json.dumps(ddp_train.record(args, 2, losses, digests)))
        code = ddp_train.main(["--compare", str(tmp_path / "d.json"), str(tmp_path / "s.json")])  # either order
        out = capsys.readouterr().out
        assert code == (0 if fails is None else 1), out
        assert fails is None or fails in out
    other = ddp_train.record(ddp_train.parse(["--seed", "1", "--steps", "2"]), 2, [2.5, 2.4], ["b", "b"])
    (tmp_path / "d.json").write_text(json.dumps(other))
    assert ddp_train.main(["--compare", str(tmp_path / "s.json"), str(tmp_path / "d.json")]) == 1
    assert "the runs differ in seed (0 and 1)" in capsys.readouterr().out


def test_fusec_adamw_steps_as_torch_adamw():
    """Three steps of examples/adamw.fz over several tensors in one foreach launch
    (the script's FusecAdamW) against torch.optim.AdamW, in f32."""
    ddp_train = script()
    generator = torch.Generator().manual_seed(0)
    shapes = [(5, 7), (300,), (1,), (64, 33)]
    ours = [torch.randn(s, generator=generator).requires_grad_() for s in shapes]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    adamw = fusec.jit(str(ROOT / "examples" / "adamw.fz"), backend="sim")
    optimizer = ddp_train.FusecAdamW(ours, adamw, lr=1e-2, weight_decay=0.1)
    reference = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1, eps=1e-8)
    for _ in range(3):
        grads = [torch.randn(s, generator=generator) for s in shapes]
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        optimizer.step()
        reference.step()
    assert adamw._foreach_runner.backend.launched == ["adamw_k0_mt"] * 3  # one launch a step
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    for m, v, q in zip(optimizer.m, optimizer.v, theirs):
        state = reference.state[q]
        torch.testing.assert_close(m, state["exp_avg"], rtol=1e-5, atol=1e-7)
        # adamw.fz takes 1 - beta2 of the f32 beta2 (0.999f: 1 - beta2 is 1.3e-5 off 0.001), torch in f64.
        torch.testing.assert_close(v, state["exp_avg_sq"], rtol=2e-5, atol=1e-9)
