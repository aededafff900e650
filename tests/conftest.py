import shutil

import pytest
from helpers import TIERS, tier_of


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
