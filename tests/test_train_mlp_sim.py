"""examples/train_mlp.py on the CPU (sim tier: the model's fusec ops and their
derived backward run on the sim, a few on the numpy backend): the fusec model
trains like its pure-torch twin, eager and under torch.compile(fullgraph=True),
and the script's checks fail when a fusec op's backward is wrong by 1 %."""
import importlib.util
import subprocess
import sys

import pytest
from helpers import ROOT

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.sim

SCRIPT = ROOT / "examples" / "train_mlp.py"


@pytest.fixture(scope="module")
def train_mlp():
    """examples/train_mlp.py as a module (its functions, without running it)."""
    spec = importlib.util.spec_from_file_location("train_mlp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def scale_backward(monkeypatch, op, factor: float):
    """The op's derived backward with every gradient it returns scaled by `factor`."""
    derived = op.backward

    def scaled(*args):
        result = derived(*args)
        return tuple(g * factor for g in result) if isinstance(result, tuple) else result * factor
    monkeypatch.setattr(op, "backward", scaled)


@pytest.mark.parametrize("argv", [
    ["--backend", "sim"],                                                     # Inductor, the defaults
    ["--backend", "sim", "--no-compile", "--gelu", "erf", "--optimizer", "adamw"],
    ["--backend", "numpy", "--compile-backend", "aot_eager"],
], ids=["sim-inductor", "sim-eager-erf-adamw", "numpy-aot_eager"])
def test_trains_like_its_torch_twin(train_mlp, capsys, argv):
    assert train_mlp.main([*argv, "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "losses: PASS: 5 steps" in out and "gradients at step 1: PASS: 15 parameters" in out
    assert out.rstrip().endswith("PASS")


def test_the_fusec_backward_runs_under_compile(train_mlp, monkeypatch, capsys):
    """The compiled model's backward is made from every fusec op's derived backward op (AOT
    autograd traces through each one)."""
    ops = train_mlp.fusec_ops("sim")
    called = []

    def counted(name, derived):
        def backward(*args):
            called.append(name)
            return derived(*args)
        return backward
    for name in ("bias_gelu", "swiglu", "bias_residual_rmsnorm", "rmsnorm"):
        monkeypatch.setattr(ops[name], "backward", counted(name, ops[name].backward))
    assert train_mlp.main(["--backend", "sim", "--steps", "2", "--compile-backend", "aot_eager"]) == 0
    assert sorted(set(called)) == ["bias_gelu", "bias_residual_rmsnorm", "rmsnorm", "swiglu"]
    capsys.readouterr()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_backward_wrong_by_one_percent_fails(train_mlp, monkeypatch, capsys, compiled):
    scale_backward(monkeypatch, train_mlp.fusec_ops("sim")["bias_gelu"], 1.01)
    argv = ["--backend", "sim", "--steps", "5"] + ([] if compiled else ["--no-compile"])
    assert train_mlp.main([*argv, "--compile-backend", "aot_eager"]) == 1
    out = capsys.readouterr().out
    assert "losses: FAIL: 5 steps" in out and "gradients at step 1: FAIL" in out
    assert out.rstrip().endswith("FAIL")


def test_a_wrong_swiglu_backward_is_caught_by_the_gradient_check(train_mlp, monkeypatch, capsys):
    """1 % off in swiglu's gradients moves the losses of 5 steps by only ~3e-5: the step-1
    gradient check is what catches it."""
    scale_backward(monkeypatch, train_mlp.fusec_ops("sim")["swiglu"], 1.01)
    assert train_mlp.main(["--backend", "sim", "--steps", "5", "--no-compile"]) == 1
    out = capsys.readouterr().out
    assert "gradients at step 1: FAIL" in out and "1.000e-02" in out


def test_verdict_and_table(train_mlp, capsys):
    ok, lines = train_mlp.verdict({"fusec": [1.0, 2.0], "torch": [1.0, 2.0 * (1 + 2e-4)], "grads": {"w": 0.0}})
    assert not ok and lines[0].startswith("losses: FAIL: 2 steps") and "(step 2)" in lines[0]
    assert train_mlp.verdict({"fusec": [1.0, 2.0], "torch": [1.0, 2.0 + 1e-5], "grads": {"w": 1e-6}})[0]
    assert not train_mlp.verdict({"fusec": [float("nan")], "torch": [float("nan")], "grads": {"w": 0.0}})[0]
    assert not train_mlp.verdict({"fusec": [1.0], "torch": [1.0], "grads": {"w": 2e-4}})[0]
    assert not train_mlp.verdict({"fusec": [], "torch": [], "grads": {}})[0]
    train_mlp.print_table({"fusec": [1.0] * 25, "torch": [1.0] * 24 + [1.1]}, every=10)
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == ["1", "10", "20", "25"]


def test_the_script_runs_as_a_command():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--backend", "sim", "--steps", "2", "--no-compile"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("PASS")
