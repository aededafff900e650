"""The tests show their tiers: a file's name, its marker and the README's tier
table agree; nothing imports from conftest.py; the examples are listed once."""
import ast
import re
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT, TIERS, tier_of

TESTS = ROOT / "tests"
TEST_FILES = sorted(TESTS.glob("test_*.py"))


def tier_marks(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(tiers of `pytestmark = ...`, tiers named by any pytest.mark.TIER elsewhere)."""
    module, anywhere = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TIERS and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "mark":
            anywhere.add(node.attr)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                 for t in node.targets):
            module |= {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute) and n.attr in TIERS}
    return module, anywhere


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_a_files_marker_is_the_tier_its_name_says(path):
    module, anywhere = tier_marks(ast.parse(path.read_text()))
    tier = tier_of(path)
    if tier is None:
        assert not anywhere, f"{path.name} is a unit-tier file but marks tests {sorted(anywhere)}"
    else:
        assert module == {tier}, f"{path.name} needs pytestmark = pytest.mark.{tier}"
        assert anywhere == {tier}, f"{path.name} also marks tests {sorted(anywhere - {tier})}"


def test_nothing_imports_from_conftest():
    for path in sorted(TESTS.glob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            assert "conftest" not in names, f"{path.name} imports from conftest.py"


def test_the_examples_are_listed_once():
    listing = re.compile(r"""["']examples["']\)?\.glob\(""")
    where = [p.name for p in sorted(TESTS.glob("*.py")) if listing.search(p.read_text())]
    assert where == ["helpers.py"], where


def test_the_readme_table_names_each_tiers_files_and_marker():
    readme = (ROOT / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1].startswith("`tests/test_"):
            rows[cells[0].split(":")[0]] = (cells[1], cells[2])
    assert rows == {"unit": ("`tests/test_*.py`", "none"),
                    **{tier: (f"`tests/test_*_{tier}.py`", f"`{tier}`") for tier in TIERS}}, rows
    for tier in TIERS:
        assert f"`pytest -m {tier}`" in readme


# Collection refuses a test whose marker disagrees with its file's name.
DISAGREEING = {
    "test_unmarked_sim.py": "def test_x():\n    pass\n",
    "test_marked.py": "import pytest\n\n@pytest.mark.sim\ndef test_x():\n    pass\n",
    "test_param_nvcc.py": "import pytest\npytestmark = pytest.mark.nvcc\n\n"
                          "@pytest.mark.parametrize('b', ['numpy', pytest.param('sim', marks=pytest.mark.sim)])\n"
                          "def test_x(b):\n    pass\n",
}


@pytest.mark.parametrize("name", sorted(DISAGREEING))
def test_collection_fails_where_a_marker_disagrees(tmp_path, name):
    for shared in ("conftest.py", "helpers.py", "generator.py"):
        shutil.copy(TESTS / shared, tmp_path / shared)
    (tmp_path / name).write_text(DISAGREEING[name])
    (tmp_path / "test_fine_sim.py").write_text("import pytest\npytestmark = pytest.mark.sim\n\n"
                                               "def test_y():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "disagree with their file's tier" in proc.stderr and name in proc.stderr, proc.stderr
    assert "test_fine_sim" not in proc.stderr
