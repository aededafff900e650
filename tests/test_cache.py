"""The disk cache (`fusec.cache`) and the host compiler that builds through it.

Unit tier, except the tests marked `sim` (they run g++). Every process that
these tests start gets a cache folder of its own.
"""
import ctypes
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import ROOT

from fusec import cache
from fusec.runtime.host_compiler import (
    HostCompilerError,
    HostCompilerNotFound,
    compile_shared_library,
)

EXAMPLE = str(ROOT / "examples" / "scale_bias_relu.fz")
ADD = {"add.cpp": '#include "add.h"\nextern "C" int add(int a, int b) { return a + b + OFFSET; }\n',
       "add.h": "#define OFFSET 1000\n"}


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache for this test (and its child processes)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(folder))
    return folder


def python(code: str, cache_dir, **env) -> subprocess.CompletedProcess:
    environment = dict(os.environ, FUSEC_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(sys.path), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, cwd=ROOT,
                          timeout=120)


def fusec(*args, cache_dir, **env) -> subprocess.CompletedProcess:
    return python(f"import sys; from fusec.cli import main; sys.exit(main({list(args)!r}))", cache_dir, **env)


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


def test_bad_kinds_and_keys_are_refused(fresh):
    with pytest.raises(ValueError, match="kind: expected one of grammar, templates, sim, cuda"):
        cache.entry("nope", "abc")
    for key in ("../escape", "a/b", "", ".."):
        with pytest.raises(ValueError, match="key, suffix"):
            cache.entry("sim", key)


# ---- entries: built once, published whole, damaged ones rebuilt

def test_load_or_build_builds_once_then_reads(fresh):
    calls = []

    def build():
        calls.append(1)
        return b"tables"
    assert cache.load_or_build("cuda", "k1", ".ptx", build) == b"tables"
    assert cache.load_or_build("cuda", "k1", ".ptx", build) == b"tables"
    assert len(calls) == 1
    assert sorted(p.name for p in (fresh / "cuda").iterdir()) == ["k1.ptx", "k1.ptx.lock", "k1.ptx.sha256"]


DAMAGE = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "empty": lambda path: path.write_bytes(b""),
    "one_bit_flipped": lambda path: path.write_bytes(_flip(path.read_bytes())),
    "digest_missing": lambda path: path.with_name(path.name + ".sha256").unlink(),
    "garbage_digest": lambda path: path.with_name(path.name + ".sha256").write_bytes(b"\xff" * 70),
    "a_folder": lambda path: (path.unlink(), path.mkdir()),
}


def _flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1:]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_entry_is_rebuilt(fresh, damage):
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


def test_validate_refuses_an_entry_and_it_is_rebuilt(fresh):
    cache.load_or_build("cuda", "k", ".ptx", lambda: b"old")
    assert cache.load_or_build("cuda", "k", ".ptx", lambda: b"new", validate=lambda data: data == b"new") == b"new"
    assert cache.read("cuda", "k", ".ptx") == b"new"


def test_a_failed_build_leaves_no_entry_and_no_scratch(fresh):
    def build(path):
        path.write_bytes(b"half")
        raise RuntimeError("compiler died")
    with pytest.raises(RuntimeError, match="compiler died"):
        cache.build_file("sim", "k", ".so", build)
    assert cache.read("sim", "k", ".so") is None
    assert [p.name for p in (fresh / "sim").iterdir()] == ["k.so.lock"]


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


def test_no_cached_file_is_written_in_place(fresh):
    """Every file written under the cache is a temporary that is renamed (only lock files stay open)."""
    fresh.mkdir()
    code = _AUDIT + f"""
from fusec.cli import main
assert main(["compile", {EXAMPLE!r}, "-o", os.devnull]) == 0
print("\\n".join(written))
"""
    proc = python(code, fresh)
    assert proc.returncode == 0, proc.stderr
    written = [Path(p) for p in proc.stdout.split()]
    assert {p.relative_to(fresh).parts[0] for p in written} == {"grammar", "templates"}
    in_place = [p for p in written if p.exists() and not p.name.endswith(".lock")]
    assert in_place == [], "written in place (a reader could see half of it)"


# Each keeps a file's first bytes, as a half-written file would (Lark's and Jinja2's headers).
HEADER_KEPT = {
    "truncated": lambda data: data[: len(data) // 2],
    "garbage_after_header": lambda data: data[:16] + b"\x80garbage" * 8,
    "one_bit_flipped": _flip,
}


@pytest.mark.parametrize("damage", sorted(HEADER_KEPT))
def test_a_damaged_grammar_or_template_cache_is_rebuilt(fresh, damage):
    """Every file of a warm cache damaged: the same output, no error."""
    first = fusec("compile", EXAMPLE, cache_dir=fresh)
    assert first.returncode == 0, first.stderr
    entries = [p for p in fresh.rglob("*") if p.is_file() and p.suffix not in (".lock", ".sha256")]
    assert {p.parent.name for p in entries} == {"grammar", "templates"}
    for path in entries:
        path.write_bytes(HEADER_KEPT[damage](path.read_bytes()))
    again = fusec("compile", EXAMPLE, cache_dir=fresh)
    assert (again.returncode, again.stdout, again.stderr) == (0, first.stdout, "")


def test_concurrent_builders_build_once(fresh):
    """Six processes want one entry at once: one builds, all read the whole of it."""
    fresh.mkdir()
    code = f"""
import time
from fusec import cache
def build():
    with open({str(fresh / "builds")!r}, "a") as log:
        log.write("built\\n")
    time.sleep(0.5)
    return b"x" * 1_000_000
assert cache.load_or_build("cuda", "shared", ".cubin", build) == b"x" * 1_000_000
"""
    procs = [subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors
    assert (fresh / "builds").read_text() == "built\n"


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
    proc = python(code, folder)
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


# ---- the host compiler (g++)

def _add(library: Path) -> int:
    lib = ctypes.CDLL(str(library))
    lib.add.argtypes, lib.add.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return lib.add(2, 3)


@pytest.mark.sim
def test_compile_shared_library_builds_once_and_loads(fresh):
    library = compile_shared_library(ADD, flags=["-O1"])
    assert _add(library) == 1005
    assert compile_shared_library(ADD, flags=["-O1"]) == library
    assert compile_shared_library(ADD, flags=["-O2"]) != library  # flags are part of the key
    assert compile_shared_library(ADD, key_parts=["shim v2"], flags=["-O1"]) != library


_BUILD_AND_CALL = f"""
import ctypes, sys
from fusec.runtime.host_compiler import compile_shared_library
lib = ctypes.CDLL(str(compile_shared_library({ADD!r}, flags=["-O1"])))
sys.exit(0 if lib.add(2, 3) == 1005 else 1)
"""


@pytest.mark.sim
def test_six_processes_build_one_module_at_once(fresh):
    fresh.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD_AND_CALL], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors
    assert len(list((fresh / "sim").glob("*.so"))) == 1


@pytest.mark.sim
@pytest.mark.parametrize("damage", ["truncated", "empty", "one_bit_flipped"])
def test_a_damaged_library_is_rebuilt_not_loaded(fresh, damage):
    """A truncated .so is never dlopened (that kills the process with SIGBUS)."""
    library = compile_shared_library(ADD, flags=["-O1"])
    DAMAGE[damage](library)
    proc = python(_BUILD_AND_CALL, fresh)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert cache.read("sim", library.name.removesuffix(".so"), ".so") is not None


@pytest.mark.sim
def test_cxx_is_honoured(fresh, tmp_path, monkeypatch):
    wrapper = tmp_path / "my-cxx"
    log = tmp_path / "cxx.log"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec g++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    assert _add(compile_shared_library(ADD)) == 1005
    assert "add.cpp" in log.read_text() and "-shared" in log.read_text()


@pytest.mark.parametrize("cxx", ["/nonexistent/g++", "no-such-compiler-xyz --flag"])
def test_a_missing_compiler_is_a_clear_error(fresh, monkeypatch, cxx):
    monkeypatch.setenv("CXX", cxx)
    with pytest.raises(HostCompilerNotFound, match=r"the sim backend needs a C\+\+ compiler: install g\+\+ or set CXX"):
        compile_shared_library(ADD)


def test_no_gxx_on_path_is_a_clear_error(fresh, tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HostCompilerNotFound, match=r"install g\+\+ or set CXX \(g\+\+ was not found on PATH\)"):
        compile_shared_library(ADD)
    assert issubclass(HostCompilerNotFound, RuntimeError)


@pytest.mark.sim
def test_a_rejected_module_is_reported_as_a_fusec_bug_with_the_log(fresh):
    with pytest.raises(HostCompilerError, match="this is a fusec bug") as info:
        compile_shared_library({"bad.cpp": "int f() { return undeclared_name; }\n"})
    assert "undeclared_name" in str(info.value)
    assert not list((fresh / "sim").glob("*.so"))


def test_sources_are_checked(fresh):
    with pytest.raises(ValueError, match="sources: no translation unit"):
        compile_shared_library({"module.cu": "int x;"})
    with pytest.raises(ValueError, match="is not a plain file name"):
        compile_shared_library({"../x.cpp": "int x;"})
