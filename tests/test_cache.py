"""The disk cache (`fusec.cache`): where it is, its entries' integrity, several
processes at once, and an unwritable cache. Unit tier. Every process that
these tests start gets a cache folder of its own (the `fresh_cache` fixture).
"""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import DAMAGE, ROOT, flip, python_process

from fusec import cache

EXAMPLE = str(ROOT / "examples" / "scale_bias_relu.fz")


def fusec(*args, cache_dir, **env) -> subprocess.CompletedProcess:
    return python_process(f"import sys; from fusec.cli import main; sys.exit(main({list(args)!r}))", cache_dir, **env)


# ---- where the cache is

def test_precedence_fusec_cache_dir_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FUSEC_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache.root() == tmp_path / "home" / ".cache" / "fusec"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # the XDG spec: a relative path is ignored
    assert cache.root() == tmp_path / "home" / ".cache" / "fusec"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.root() == tmp_path / "xdg" / "fusec"
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.root() == tmp_path / "mine"
    assert cache.directory("sim") == tmp_path / "mine" / "sim" and (tmp_path / "mine" / "sim").is_dir()


def test_a_compile_writes_only_under_xdg_cache_home(tmp_path):
    """The grammar and the templates land in $XDG_CACHE_HOME/fusec when FUSEC_CACHE_DIR is unset."""
    env = {k: v for k, v in os.environ.items() if k != "FUSEC_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-m", "fusec", "compile", EXAMPLE], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in (tmp_path / "xdg" / "fusec").iterdir()} == {"grammar", "templates"}
    assert not (tmp_path / "home").exists()


def test_bad_kinds_and_keys_are_refused(fresh_cache):
    with pytest.raises(ValueError, match="kind: expected one of grammar, templates, sim, cuda"):
        cache.entry("nope", "abc")
    for key in ("../escape", "a/b", "", ".."):
        with pytest.raises(ValueError, match="key, suffix"):
            cache.entry("sim", key)


# ---- entries: built once, published whole, damaged ones rebuilt

def test_load_or_build_builds_once_then_reads(fresh_cache):
    calls = []

    def build():
        calls.append(1)
        return b"tables"
    assert cache.load_or_build("cuda", "k1", ".ptx", build) == b"tables"
    assert cache.load_or_build("cuda", "k1", ".ptx", build) == b"tables"
    assert len(calls) == 1
    assert sorted(p.name for p in (fresh_cache / "cuda").iterdir()) == ["k1.ptx", "k1.ptx.lock", "k1.ptx.sha256"]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_entry_is_rebuilt(fresh_cache, damage):
    content = bytes(range(256)) * 8
    cache.load_or_build("cuda", "k", ".cubin", lambda: content)
    DAMAGE[damage](cache.entry("cuda", "k", ".cubin"))
    if damage == "a_folder":  # cannot be replaced by a file: the right bytes all the same, not kept
        assert cache.load_or_build("cuda", "k", ".cubin", lambda: content) == content
        return
    rebuilt = []
    assert cache.load_or_build("cuda", "k", ".cubin", lambda: rebuilt.append(1) or content) == content
    assert rebuilt == [1]
    assert cache.read("cuda", "k", ".cubin") == content  # and what was rebuilt is intact


def test_validate_refuses_an_entry_and_it_is_rebuilt(fresh_cache):
    cache.load_or_build("cuda", "k", ".ptx", lambda: b"old")
    assert cache.load_or_build("cuda", "k", ".ptx", lambda: b"new", validate=lambda data: data == b"new") == b"new"
    assert cache.read("cuda", "k", ".ptx") == b"new"


def test_a_failed_build_leaves_no_entry_and_no_scratch(fresh_cache):
    def build(path):
        path.write_bytes(b"half")
        raise RuntimeError("compiler died")
    with pytest.raises(RuntimeError, match="compiler died"):
        cache.build_file("sim", "k", ".so", build)
    assert cache.read("sim", "k", ".so") is None
    assert [p.name for p in (fresh_cache / "sim").iterdir()] == ["k.so.lock"]


# Records every file a process opens for writing under the cache.
_AUDIT = """
import os, sys
written = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path, mode, flags = os.fsdecode(args[0]), args[1], args[2]
        writes = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & (os.O_WRONLY | os.O_RDWR))
        if writes and path.startswith(os.environ["FUSEC_CACHE_DIR"]):
            written.append(os.path.abspath(path))
sys.addaudithook(hook)
"""


def test_no_cached_file_is_written_in_place(fresh_cache):
    """Every file written under the cache is a temporary that is renamed (only lock files stay open)."""
    fresh_cache.mkdir()
    code = _AUDIT + f"""
from fusec.cli import main
assert main(["compile", {EXAMPLE!r}, "-o", os.devnull]) == 0
print("\\n".join(written))
"""
    proc = python_process(code, fresh_cache)
    assert proc.returncode == 0, proc.stderr
    written = [Path(p) for p in proc.stdout.split()]
    assert {p.relative_to(fresh_cache).parts[0] for p in written} == {"grammar", "templates"}
    in_place = [p for p in written if p.exists() and not p.name.endswith(".lock")]
    assert in_place == [], "written in place (a reader could see half of it)"


# Each keeps a file's first bytes, as a half-written file would (Lark's and Jinja2's headers).
HEADER_KEPT = {
    "truncated": lambda data: data[: len(data) // 2],
    "garbage_after_header": lambda data: data[:16] + b"\x80garbage" * 8,
    "one_bit_flipped": flip,
}


@pytest.mark.parametrize("damage", sorted(HEADER_KEPT))
def test_a_damaged_grammar_or_template_cache_is_rebuilt(fresh_cache, damage):
    """Every file of a warm cache damaged: the same output, no error."""
    first = fusec("compile", EXAMPLE, cache_dir=fresh_cache)
    assert first.returncode == 0, first.stderr
    entries = [p for p in fresh_cache.rglob("*") if p.is_file() and p.suffix not in (".lock", ".sha256")]
    assert {p.parent.name for p in entries} == {"grammar", "templates"}
    for path in entries:
        path.write_bytes(HEADER_KEPT[damage](path.read_bytes()))
    again = fusec("compile", EXAMPLE, cache_dir=fresh_cache)
    assert (again.returncode, again.stdout, again.stderr) == (0, first.stdout, "")


def test_concurrent_builders_build_once(fresh_cache):
    """Six processes want one entry at once: one builds, all read the whole of it."""
    fresh_cache.mkdir()
    code = f"""
import time
from fusec import cache
def build():
    with open({str(fresh_cache / "builds")!r}, "a") as log:
        log.write("built\\n")
    time.sleep(0.5)
    return b"x" * 1_000_000
assert cache.load_or_build("cuda", "shared", ".cubin", build) == b"x" * 1_000_000
"""
    procs = [subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors
    assert (fresh_cache / "builds").read_text() == "built\n"


# ---- a cache that cannot be written

UNWRITABLE = {
    "below_a_file": lambda tmp: tmp / "a_file" / "cache",  # cannot be created
    "read_only_folder": lambda tmp: Path("/sys"),  # exists; not writable, even by root
}


@pytest.mark.parametrize("where", sorted(UNWRITABLE))
def test_an_unwritable_cache_falls_back_with_one_warning(tmp_path, where):
    (tmp_path / "a_file").write_text("")
    folder = UNWRITABLE[where](tmp_path)
    code = """
import warnings
warnings.simplefilter("always")
from fusec.cli import main
assert main(["compile", %r, "-o", %r]) == 0
from fusec import cache
print(cache.load_or_build("cuda", "k", ".ptx", lambda: b"ptx"), cache.directory("sim"))
""" % (EXAMPLE, str(tmp_path / "out.cu"))
    proc = python_process(code, folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("Warning: ") == 1, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if "Warning: " in line]
    assert "RuntimeWarning: " in warning and f"cannot write its cache directory {folder}/" in warning
    assert "using a private temporary one" in warning and "Traceback" not in proc.stderr
    assert proc.stdout.startswith("b'ptx' ") and "/fusec-cache-" in proc.stdout
    assert not Path(proc.stdout.split()[1]).exists(), "the private cache outlived its process"
    assert "__global__" in (tmp_path / "out.cu").read_text()


def test_the_fallback_is_used_in_process(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "_private_root", None)  # as in a new process
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "a_file" / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grammar, cuda = cache.directory("grammar"), cache.directory("cuda")
        cache.write("cuda", "k", ".ptx", b"ptx")
    assert len(caught) == 1 and caught[0].category is RuntimeWarning
    assert grammar.parent == cuda.parent and cache.read("cuda", "k", ".ptx") == b"ptx"

