"""The host compiler (g++) building through fusec's cache: once, from several
processes at once, never loading a damaged library; and the sim backend's
modules the same way. Sim tier (g++)."""
import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ADD, DAMAGE, ROOT, python_process

from fusec import cache
from fusec.runtime.host_compiler import HostCompilerError, compile_shared_library

pytestmark = pytest.mark.sim



def _add(library: Path) -> int:
    lib = ctypes.CDLL(str(library))
    lib.add.argtypes, lib.add.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return lib.add(2, 3)


def test_compile_shared_library_builds_once_and_loads(fresh_cache):
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


def test_six_processes_build_one_module_at_once(fresh_cache):
    fresh_cache.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD_AND_CALL], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors
    assert len(list((fresh_cache / "sim").glob("*.so"))) == 1


@pytest.mark.parametrize("damage", ["truncated", "empty", "one_bit_flipped"])
def test_a_damaged_library_is_rebuilt_not_loaded(fresh_cache, damage):
    """A truncated .so is never dlopened (that kills the process with SIGBUS)."""
    library = compile_shared_library(ADD, flags=["-O1"])
    DAMAGE[damage](library)
    proc = python_process(_BUILD_AND_CALL, fresh_cache)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert cache.read("sim", library.name.removesuffix(".so"), ".so") is not None


def test_cxx_is_honoured(fresh_cache, tmp_path, monkeypatch):
    wrapper = tmp_path / "my-cxx"
    log = tmp_path / "cxx.log"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec g++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    assert _add(compile_shared_library(ADD)) == 1005
    assert "add.cpp" in log.read_text() and "-shared" in log.read_text()


def test_a_rejected_module_is_reported_as_a_fusec_bug_with_the_log(fresh_cache):
    with pytest.raises(HostCompilerError, match="this is a fusec bug") as info:
        compile_shared_library({"bad.cpp": "int f() { return undeclared_name; }\n"})
    assert "undeclared_name" in str(info.value)
    assert not list((fresh_cache / "sim").glob("*.so"))


# ---- a precompiled header for the header a build's flags -include (FUSEC_SIM_PCH=1, set by conftest.py)

def _with_a_header(folder: Path, log: Path) -> tuple[dict, list]:
    """ADD with its OFFSET in a header named by -include, as the sim's shim is; built through a
    compiler that logs g++'s -H report: "! HEADER.gch" where it read a precompiled header."""
    (folder / "offset.h").write_text("#define OFFSET 1000\n")
    wrapper = folder / "logging-cxx"
    wrapper.write_text(f'#!/bin/sh\nexec g++ "$@" -H 2>>{log}\n')
    wrapper.chmod(0o755)
    return {"add.cpp": ADD["add.cpp"].replace('#include "add.h"\n', "")}, ["-O1", "-include", str(folder / "offset.h")]


def test_a_precompiled_header_is_read_and_gives_the_same_library(fresh_cache, tmp_path, monkeypatch):
    log = tmp_path / "h.log"
    sources, flags = _with_a_header(tmp_path, log)
    monkeypatch.setenv("CXX", str(tmp_path / "logging-cxx"))
    monkeypatch.setenv("FUSEC_SIM_PCH", "0")  # a user's default
    plain = compile_shared_library(sources, flags=flags)
    assert _add(plain) == 1005 and not list((fresh_cache / "sim").glob("*.gch")) and ".gch" not in log.read_text()
    built = plain.read_bytes()
    plain.unlink()
    monkeypatch.setenv("FUSEC_SIM_PCH", "1")
    again = compile_shared_library(sources, flags=flags)
    assert again == plain and again.read_bytes() == built  # the same entry, the same bytes
    (precompiled,) = (fresh_cache / "sim").glob("*.h.gch")
    assert f"! {precompiled}" in log.read_text().splitlines()


@pytest.mark.parametrize("damage", ["truncated", "one_bit_flipped", "digest_missing", "a_folder"])
def test_a_damaged_precompiled_header_is_rebuilt_or_left_out(fresh_cache, tmp_path, monkeypatch, damage):
    """Never read damaged: rebuilt, or (a folder in its place) the build goes on without it."""
    from fusec.runtime import host_compiler
    log = tmp_path / "h.log"
    sources, flags = _with_a_header(tmp_path, log)
    monkeypatch.setenv("CXX", str(tmp_path / "logging-cxx"))
    assert _add(compile_shared_library(sources, flags=flags)) == 1005
    (precompiled,) = (fresh_cache / "sim").glob("*.h.gch")
    DAMAGE[damage](precompiled)
    monkeypatch.setattr(host_compiler, "_intact", {})  # as in a new process
    log.write_text("")
    other = {"add.cpp": sources["add.cpp"] + "// another library, the same header\n"}
    assert _add(compile_shared_library(other, flags=flags)) == 1005
    read = [line for line in log.read_text().splitlines() if line.endswith(".gch")]
    if damage == "a_folder":
        assert precompiled.is_dir() and read == []
    else:
        assert cache.read("sim", precompiled.name.removesuffix(".h.gch"), ".h.gch") is not None
        assert read == [f"! {precompiled}"]


# ---- the sim backend's modules

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


def test_six_processes_build_one_sim_module_at_once(tmp_path):
    codes, errors = _run(tmp_path, 6)
    assert codes == [0] * 6, errors
    assert len(list((tmp_path / "sim").glob("*.so"))) == 1


def test_a_truncated_sim_module_is_rebuilt_not_loaded(tmp_path):
    assert _run(tmp_path, 1)[0] == [0]
    for library in (tmp_path / "sim").rglob("*.so"):
        library.write_bytes(library.read_bytes()[:4096])
    codes, errors = _run(tmp_path, 1)
    assert codes == [0], (codes, errors[0][-2000:])  # -7 is SIGBUS: the truncated file was loaded
