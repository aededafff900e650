import os
import shutil

import pytest
from helpers import TIERS, tier_of

# The sim's header is parsed once into a precompiled header (fusec.runtime.host_compiler): the
# libraries are the same bytes, built a quarter faster. Set here, it reaches the test workers and
# every process they start.
os.environ.setdefault("FUSEC_SIM_PCH", "1")


def pytest_collection_modifyitems(config, items):
    """Each test's tier markers are the one its file's name says (README: Tests);
    nvcc/sim tiers skip cleanly where their compiler is missing; gpu where there is no device."""
    wrong = [f"{item.nodeid}: marked {sorted(marks) or 'unit'}, but its file is {tier_of(item.path) or 'unit'} tier"
             for item in items
             if (marks := {m.name for m in item.iter_markers() if m.name in TIERS}) != {tier_of(item.path)} - {None}]
    if wrong:
        raise pytest.UsageError("tests whose markers disagree with their file's tier:\n  " + "\n  ".join(wrong))
    have_nvcc = shutil.which("nvcc") is not None
    have_gxx = shutil.which("g++") is not None
    for item in items:
        if "nvcc" in item.keywords and not have_nvcc:
            item.add_marker(pytest.mark.skip(reason="nvcc not found"))
        if "sim" in item.keywords and not have_gxx:
            item.add_marker(pytest.mark.skip(reason="g++ not found"))
        if "gpu" in item.keywords and not _have_gpu():
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))


# Tests that share a worker under pytest-xdist (`pytest -n N`), by what their node id holds: a file
# whose module fixture does the work of all its tests (the estimate corpus, every generated program
# at once), and the tests of fusion_hurts, the example the fusion pass takes seconds over (fused once
# where they compile it alike: helpers.compiled and the pass's own memory).
SHARE_A_WORKER = {"tests/test_estimate_nvcc.py::": "estimate corpus", "tests/test_generated_sim.py::": "generated",
                  "fusion_hurts": "fusion_hurts"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """For pytest-xdist's default mode (--dist load): each group of SHARE_A_WORKER goes to one
    worker, the groups first (the most tests first), then each other test to whichever worker is
    free, in order, so that both finish together. (--dist loadgroup would do it from markers, but
    pytest-xdist 3.8 cannot mark pytest 9.2's node ids: pytest-xdist issue 1386.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((group for part, group in SHARE_A_WORKER.items() if part in nodeid), nodeid)
    return Scheduler(config, log)


def _have_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.is_available()
    except Exception:
        return False


@pytest.fixture
def run_cli(capsys):
    """Runs the fusec CLI in-process; returns (exit code, stdout, stderr)."""
    from fusec.cli import main

    def run(*argv):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty fusec cache for this test (and its child processes)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(folder))
    return folder
