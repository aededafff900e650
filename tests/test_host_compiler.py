"""The host compiler's errors where it cannot build (no g++ needed). Unit tier."""
import pytest
from helpers import ADD

from fusec.runtime.host_compiler import HostCompilerNotFound, compile_shared_library


@pytest.mark.parametrize("cxx", ["/nonexistent/g++", "no-such-compiler-xyz --flag"])
def test_a_missing_compiler_is_a_clear_error(fresh_cache, monkeypatch, cxx):
    monkeypatch.setenv("CXX", cxx)
    with pytest.raises(HostCompilerNotFound, match=r"the sim backend needs a C\+\+ compiler: install g\+\+ or set CXX"):
        compile_shared_library(ADD)


def test_no_gxx_on_path_is_a_clear_error(fresh_cache, tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HostCompilerNotFound, match=r"install g\+\+ or set CXX \(g\+\+ was not found on PATH\)"):
        compile_shared_library(ADD)
    assert issubclass(HostCompilerNotFound, RuntimeError)


def test_sources_are_checked(fresh_cache):
    with pytest.raises(ValueError, match="sources: no translation unit"):
        compile_shared_library({"module.cu": "int x;"})
    with pytest.raises(ValueError, match="is not a plain file name"):
        compile_shared_library({"../x.cpp": "int x;"})
