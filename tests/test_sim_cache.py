"""The sim backend's host builds through fusec's cache: several processes at
once, and a damaged cached library. Sim tier (g++)."""
import os
import subprocess
import sys

import pytest
from helpers import ROOT

CALL = f"""
import numpy as np, fusec
f = fusec.jit({str(ROOT / "examples" / "scale_bias_relu.fz")!r}, backend="sim")
y = f(np.arange(-4, 4, dtype=np.float32), 1.5, -0.25)
assert y.tolist() == [0, 0, 0, 0, 0, 1.25, 2.75, 4.25], y
"""


def _run(cache_dir, count):
    env = dict(os.environ, FUSEC_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", CALL], env=env, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(count)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    return [p.returncode for p in procs], errors


@pytest.mark.sim
def test_six_processes_build_one_sim_module_at_once(tmp_path):
    codes, errors = _run(tmp_path, 6)
    assert codes == [0] * 6, errors
    assert len(list((tmp_path / "sim").glob("*.so"))) == 1


@pytest.mark.sim
def test_a_truncated_sim_module_is_rebuilt_not_loaded(tmp_path):
    assert _run(tmp_path, 1)[0] == [0]
    for library in (tmp_path / "sim").rglob("*.so"):
        library.write_bytes(library.read_bytes()[:4096])
    codes, errors = _run(tmp_path, 1)
    assert codes == [0], (codes, errors[0][-2000:])  # -7 is SIGBUS: the truncated file was loaded
