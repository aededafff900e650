"""NVRTC writes its log, PTX and cubin into the buffers the cuda backend hands it
(`cuda.nvrtc_compile`): each must be a mutable buffer of fusec's own. A PTX compile's log
is empty (one NUL), and `b" " * 1` is CPython's one-byte b" " that the whole process
shares: NVRTC's NUL written there made every b" " read b"\\0" for the rest of the process
(on the H200 under Python 3.12, importing torch afterwards failed in its own schemas,
"annotate(strtag)", and one-space writes to a text stream printed NULs). The NVRTC here is
a stand-in that writes as NVRTC does, through the buffer protocol; the nvcc tier runs the
real one (tests/test_nvrtc_nvcc.py)."""
import sys
import types

import pytest

from fusec.runtime.backends import cuda


def fake_nvrtc(log: bytes, code: bytes, written: list):
    """NVRTC's calls that nvrtc_compile makes, writing `log` and `code` (each with its NUL)
    into the caller's buffers as the C library does: a read-only buffer is refused."""
    def write(data):
        def get(program, buffer):
            written.append(type(buffer))
            memoryview(buffer)[:len(data)] = data  # a bytes object: TypeError (read-only)
            return (0,)
        return get
    return types.SimpleNamespace(
        nvrtcCreateProgram=lambda *a: (0, "program"), nvrtcCompileProgram=lambda *a: (0,),
        nvrtcGetProgramLogSize=lambda program: (0, len(log)), nvrtcGetProgramLog=write(log),
        nvrtcGetPTXSize=lambda program: (0, len(code)), nvrtcGetPTX=write(code),
        nvrtcGetCUBINSize=lambda program: (0, len(code)), nvrtcGetCUBIN=write(code),
        nvrtcDestroyProgram=lambda program: (0,), nvrtcGetErrorString=lambda error: (0, b"stand-in"))


@pytest.mark.parametrize("native", [False, True])
def test_nvrtc_writes_into_buffers_of_fusecs_own(monkeypatch, native):
    written = []
    log = b"ptxas info    : Used 8 registers\n\0" if native else b"\0"  # a PTX compile's log: empty
    code = b"\x7fELF cubin\0" if native else b"//\n.version 9.0\n\0"
    nvrtc = fake_nvrtc(log, code, written)
    monkeypatch.setitem(sys.modules, "cuda", types.SimpleNamespace(bindings=types.SimpleNamespace(nvrtc=nvrtc)))
    monkeypatch.setitem(sys.modules, "cuda.bindings", sys.modules["cuda"].bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.nvrtc", nvrtc)
    monkeypatch.setattr(cuda, "include_dirs", lambda: ())
    result, text = cuda.nvrtc_compile("__global__ void k() {}", cuda._options("sm_90" if native else "sm_80", native,
                                                                            False), native)
    assert result == code and type(result) is bytes  # the cache and the driver get bytes, NUL kept as before
    assert text == log.decode().rstrip("\x00 ")
    assert all(kind is not bytes for kind in written) and len(written) == 2
    assert list(b" ") == [32] and list(bytes([32])) == [32]
