"""The command line as a user meets it: several files and stdin, output paths,
closed pipes, `fusec cache`, `--version`, and the package that pip installs.

Every failure the user causes exits 1 or 2 with one line, never 3 (an
internal error) and never a traceback. Unit tier.
"""
import email
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT

import fusec

EXAMPLE = ROOT / "examples" / "scale_bias_relu.fz"
BAD = "pipeline p(x: f32[n]) -> (y: f32[n]) { y = x +; }\n"


def fusec_cli(*args, stdin: str | None = None, cache_dir=None, **env) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **env)
    if cache_dir is not None:
        environment["FUSEC_CACHE_DIR"] = str(cache_dir)
    return subprocess.run([sys.executable, "-m", "fusec", *map(str, args)], input=stdin, capture_output=True,
                          text=True, env=environment, cwd=ROOT, timeout=60)


@pytest.fixture
def cli(run_cli, monkeypatch):
    """fusec run in this process (quicker than a new one), `stdin` as its standard input."""
    def run(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        code, out, err = run_cli(*map(str, args))
        return subprocess.CompletedProcess(args, code, out, err)
    return run


def one_line_error(proc: subprocess.CompletedProcess, code: int) -> str:
    assert (proc.returncode, proc.stdout) == (code, ""), proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    return proc.stderr


# ---- --version, python -m fusec

def test_version():
    from importlib.metadata import version
    assert fusec.__version__ == version("fusec")
    for command in (["fusec"], [sys.executable, "-m", "fusec"]):
        if command == ["fusec"] and shutil.which("fusec") is None:
            command = [str(Path(sys.executable).with_name("fusec"))]
        proc = subprocess.run([*command, "--version"], capture_output=True, text=True)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"fusec {fusec.__version__}\n", "")


# ---- fusec check: several files, stdin

def test_check_reports_every_file_and_fails_if_any_fails(cli, tmp_path):
    bad = tmp_path / "bad.fz"
    bad.write_text(BAD)
    proc = cli("check", EXAMPLE, bad, ROOT / "examples" / "dag.fz", tmp_path / "missing.fz")
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [f"{EXAMPLE}: ok (3 stages; pipelines: scale_bias_relu)",
                                        f"{ROOT / 'examples' / 'dag.fz'}: ok (0 stages; pipelines: dag)"]
    assert proc.stderr.startswith(f"{bad}:1:47: error: unexpected ';'")
    assert proc.stderr.splitlines()[-1] == f"{tmp_path / 'missing.fz'}: error: cannot read file: No such file or directory"
    good = cli("check", EXAMPLE, ROOT / "examples" / "dag.fz")
    assert (good.returncode, len(good.stdout.splitlines()), good.stderr) == (0, 2, "")


def test_check_reads_stdin_as_dash(cli):
    proc = cli("check", "-", stdin=EXAMPLE.read_text())
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "<stdin>: ok (3 stages; pipelines: scale_bias_relu)\n", "")
    proc = cli("check", "-", EXAMPLE, stdin=BAD)
    assert proc.returncode == 1 and proc.stderr.startswith("<stdin>:1:47: error: unexpected ';'")
    assert proc.stdout == f"{EXAMPLE}: ok (3 stages; pipelines: scale_bias_relu)\n"


def test_compile_reads_stdin_as_dash(cli):
    proc = cli("compile", "-", stdin=EXAMPLE.read_text())
    assert proc.returncode == 0 and "from <stdin>: pipeline scale_bias_relu" in proc.stdout


def test_a_closed_stdin_is_one_line():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(f"exec 0<&-; {sys.executable} -m fusec check -", shell=True, capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert one_line_error(proc, 1) == "<stdin>: error: cannot read standard input: it is closed\n"


def test_check_with_no_file_is_a_usage_error(cli):
    proc = cli("check")
    assert proc.returncode == 2 and "the following arguments are required: FILE.fz" in proc.stderr


# ---- files that cannot be read or written

def test_a_folder_given_as_the_program_is_one_line(cli, tmp_path):
    for command in ("check", "compile"):
        err = one_line_error(cli(command, tmp_path), 1)
        assert err == f"{tmp_path}: error: cannot read file: Is a directory\n"


def test_output_to_a_folder_is_a_usage_error(cli, tmp_path):
    err = one_line_error(cli("compile", EXAMPLE, "-o", tmp_path), 2)
    assert err == f"fusec compile: -o {tmp_path}: is a directory; give a file name\n"


def test_output_into_a_missing_folder_is_a_usage_error_and_creates_nothing(cli, tmp_path):
    target = tmp_path / "missing" / "out.cu"
    err = one_line_error(cli("compile", EXAMPLE, "-o", target), 2)
    assert err == f"fusec compile: -o {target}: the folder {target.parent} does not exist (fusec does not create folders)\n"
    assert not target.parent.exists()


def test_output_over_the_program_itself_is_a_usage_error(cli, tmp_path):
    program = tmp_path / "p.fz"
    program.write_text(EXAMPLE.read_text())
    err = one_line_error(cli("compile", program, "-o", f"{tmp_path}/./p.fz"), 2)
    assert err == f"fusec compile: -o {tmp_path}/./p.fz: is the program itself; give another file name\n"
    assert program.read_text() == EXAMPLE.read_text()


def test_output_where_writing_is_refused_is_a_usage_error(cli):
    # /sys refuses new files even to root, where a chmod would not.
    err = one_line_error(cli("compile", EXAMPLE, "-o", "/sys/fusec-out.cu"), 2)
    assert err.startswith("fusec compile: -o /sys/fusec-out.cu: ") and "ermission denied" in err


def test_a_failed_write_is_a_usage_error(run_cli, tmp_path, monkeypatch):
    """The folder passes the early check, then the write fails (a full disk, a race)."""
    def refuse(self, *args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_text", refuse)
    code, out, err = run_cli("compile", str(EXAMPLE), "-o", str(tmp_path / "out.cu"))
    assert (code, out, err) == (2, "", f"fusec compile: -o {tmp_path / 'out.cu'}: cannot write: No space left on device\n")


def test_bench_checks_its_outputs_before_anything_else(cli, tmp_path):
    err = one_line_error(cli("bench", EXAMPLE, "--json", tmp_path / "no" / "rows.json"), 2)
    assert "fusec bench: --json" in err and "does not exist" in err
    err = one_line_error(cli("bench", EXAMPLE, "--plot", tmp_path), 2)
    assert err == f"fusec bench: --plot {tmp_path}: is a directory; give a file name\n"


def test_a_closed_pipe_is_not_an_internal_error():
    """The reader of stdout leaves before fusec writes (`fusec compile ... | head -0`)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as stdout:
        proc = subprocess.run([sys.executable, "-m", "fusec", "compile", str(EXAMPLE)], stdout=stdout,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == "fusec: output cut off: the pipe fusec was writing to was closed\n"


# ---- fusec cache

def test_cache_dir_follows_the_environment(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FUSEC_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cli("cache", "dir").stdout == f"{tmp_path}/home/.cache/fusec\n"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cli("cache", "dir").stdout == f"{tmp_path}/xdg/fusec\n"
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "mine"))
    assert cli("cache", "dir").stdout == f"{tmp_path}/mine\n"


def test_cache_clear_removes_fusecs_folders_only(tmp_path):
    folder = tmp_path / "shared"
    assert fusec_cli("compile", EXAMPLE, cache_dir=folder).returncode == 0
    (folder / "notes.txt").write_text("the user's, not fusec's")
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != "notes.txt"]
    size = sum(p.stat().st_size for p in files)
    proc = fusec_cli("cache", "clear", cache_dir=folder)
    assert proc.returncode == 0 and proc.stdout == f"removed {len(files)} files, {size / 1024:.1f} KiB, from {folder}\n"
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    again = fusec_cli("cache", "clear", cache_dir=folder)
    assert (again.returncode, again.stdout) == (0, f"nothing to remove in {folder}\n")


def test_cache_clear_that_cannot_remove_is_one_line(run_cli, tmp_path, monkeypatch):
    from fusec import cache
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path))
    cache.write("cuda", "k", ".ptx", b"ptx")

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr("shutil.rmtree", refuse)
    code, out, err = run_cli("cache", "clear")
    assert (code, out, err) == (1, "", f"fusec cache clear: cannot remove {tmp_path / 'cuda'}: Permission denied\n")


def test_cache_needs_an_action(run_cli):
    code, _, err = run_cli("cache")
    assert code == 2 and "required: ACTION" in err


# ---- a plain install

def test_a_plain_install_compiles_with_an_empty_cache(tmp_path):
    """Without the test extra (no interegular) and nothing cached, the README's command works."""
    blocker = ("import sys\nclass Absent:\n    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] in ('interegular', 'pytest', 'hypothesis'):\n"
               "            raise ImportError(f'{name} is not installed')\nsys.meta_path.insert(0, Absent())\n"
               f"from fusec.cli import main\nsys.exit(main(['compile', {str(EXAMPLE)!r}]))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), FUSEC_CACHE_DIR=str(tmp_path / "cache"),
               XDG_CACHE_HOME=str(tmp_path / "xdg"))
    proc = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "__global__ void scale_bias_relu_k0(" in proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The wheel pip would install."""
    tree = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "fusec", tree / "fusec", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(tree)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("fusec-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_ships_the_package_data(wheel):
    names = set(wheel.namelist())
    for needed in ("fusec/py.typed", "fusec/frontend/grammar/fz.lark", "fusec/codegen/templates/module.cu.j2",
                   "fusec/runtime/backends/fusec_sim.h", "fusec/runtime/host_compiler.py", "fusec/__main__.py"):
        assert needed in names
    assert f"fusec-{fusec.__version__}.dist-info/licenses/LICENSE" in names


def test_the_wheel_metadata(wheel):
    metadata = email.message_from_bytes(wheel.read(f"fusec-{fusec.__version__}.dist-info/METADATA"))
    assert metadata["Version"] == fusec.__version__
    assert metadata["License-Expression"] == "MIT" and metadata["Author"] == "fusec developers"
    assert "Typing :: Typed" in metadata.get_all("Classifier") and "cuda" in metadata["Keywords"].split(",")
    extras = {}
    for requirement in metadata.get_all("Requires-Dist"):
        name, _, marker = requirement.partition(";")
        extra = marker.split("extra ==")[-1].strip().strip("\"'") if "extra ==" in marker else None
        extras.setdefault(extra, set()).add(name.split(">")[0].split("=")[0].strip())
    assert extras[None] == {"lark", "jinja2", "numpy", "ml_dtypes"}  # no interegular at run time
    assert extras["bench"] == {"matplotlib", "torch"}
    assert "interegular" in extras["test"]
    entry_points = wheel.read(f"fusec-{fusec.__version__}.dist-info/entry_points.txt").decode()
    assert "fusec = fusec.cli:main" in entry_points
