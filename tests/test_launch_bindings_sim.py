"""The cuda backend's launches through NVIDIA's real bindings (cuda.bindings), with the
driver a stub library that records each launch (benchmarks/host_path_cpu.py --check, and
--launch-floor for benchmarks/launch_floor.py): the
bindings take the arguments as fusec passes them (the extended launch's configuration,
its stream, the function handle, kernelParams as an address), and a replayed launch read
back through the kernelParams the driver got is the checked path's launch of the same
call. In a process of its own: the stub stays loaded as the process's CUDA driver."""
import os
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT

pytest.importorskip("cuda.bindings.driver")
pytestmark = pytest.mark.sim


@pytest.mark.skipif(shutil.which("cc") is None, reason="the stub driver needs a C compiler")
@pytest.mark.parametrize("entry", ["ex", "plain"])
def test_replayed_launches_through_the_bindings_are_the_checked_paths(entry):
    result = subprocess.run([sys.executable, "benchmarks/host_path_cpu.py", "--check", "--entry", entry], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failed" in result.stdout and result.stdout.count("ok: ") == 10


@pytest.mark.skipif(shutil.which("cc") is None, reason="the stub driver needs a C compiler")
def test_the_launch_floor_benchmark_runs_through_on_stand_ins():
    """benchmarks/launch_floor.py end to end but for its torch rows (no CUDA here): every
    fusec internal it reads and every driver call it makes, each row a few calls."""
    result = subprocess.run([sys.executable, "benchmarks/host_path_cpu.py", "--launch-floor"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "its output reused: True" in result.stdout and "| target (issue 13) |" in result.stdout


@pytest.mark.skipif(shutil.which("cc") is None, reason="the stub driver needs a C compiler")
def test_the_host_path_benchmark_runs_through_with_its_parts():
    """benchmarks/host_path_cpu.py end to end (a few windows a row): every call's row, the
    torch-tensor call's rows where torch is installed, and where the µs of the allocating
    calls go (the fusec internals it reads: the recorded call last, its generated code's names)."""
    result = subprocess.run([sys.executable, "benchmarks/host_path_cpu.py", "--parts", "--quick"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| f(x, s, b), replayed, the last three results held |" in result.stdout
    assert "| where the µs of f(x, s, b) replayed, the last three results held (CuPy, allocates) go" in result.stdout
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    assert "| f(t, s, b), torch tensors, replayed, the result dropped |" in result.stdout
    assert "| where the µs of f(t, s, b), torch tensors, replayed (allocates) go" in result.stdout
