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
