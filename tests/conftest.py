import shutil

import pytest
from helpers import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.fz"))


def pytest_collection_modifyitems(config, items):
    """nvcc/sim tiers skip cleanly where their compiler is missing; gpu where there is no device."""
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
