"""Shared libraries built by the host's C++ compiler, through fusec's cache.

The sim backend compiles each emitted module with `$CXX` (default g++) into a
shared library that it loads with ctypes. A build is keyed on the sources,
the flags, the compiler's identity (`$CXX --version`) and fusec's version;
it runs in a private scratch folder and is published atomically with its
digest, so that several processes building one module at once build it once
and never load half a file (see `fusec.cache.build_file`).

With `FUSEC_SIM_PCH=1` in the environment (the test suite sets it), the
header a build's flags name with `-include` (the sim's `fusec_sim.h`, which
pulls in CUDA's fp16 and bf16 headers) is parsed once into a precompiled
header, a cache entry keyed like a library, and each build reads that instead
of parsing the header again: a quarter of a small module's compile. The
libraries are the same bytes, and keyed the same way, with it or without it;
where the precompiled header cannot be built or used, the build runs as it
would without it.
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from fusec import __version__, cache

# Files compiled as translation units; the others (.cu, .h) are only #included by them.
TRANSLATION_UNITS = (".cpp", ".cc", ".cxx", ".c")
# Always added: what makes the output a loadable shared library.
SHARED_FLAGS = ("-shared", "-fPIC")
LOG_TAIL = 4000  # characters of a failed compiler's output shown
PCH_VARIABLE = "FUSEC_SIM_PCH"  # set to 1: precompile the -include'd header (module docstring)


class HostCompilerError(RuntimeError):
    """The host C++ compiler is missing or rejected a module fusec generated."""


class HostCompilerNotFound(HostCompilerError):
    """No C++ compiler: `$CXX` (or g++) is not on PATH."""


def compiler_command() -> list[str]:
    """`$CXX` split as a shell would (e.g. "ccache g++"), else g++; a clear error if it is not installed."""
    cxx = os.environ.get("CXX", "").strip() or "g++"
    command = shlex.split(cxx)
    if shutil.which(command[0]) is None:
        where = f"CXX={cxx!r} was not found" if os.environ.get("CXX", "").strip() else "g++ was not found on PATH"
        raise HostCompilerNotFound(f"the sim backend needs a C++ compiler: install g++ or set CXX ({where})")
    return command


def compile_shared_library(sources: Mapping[str, str], key_parts: Iterable[str | bytes] = (),
                           flags: Iterable[str] = ()) -> Path:
    """The cached shared library built from `sources` (file name -> text):
    the .cpp/.cc/.cxx/.c files are compiled with `flags`, the others are there
    for them to #include. `key_parts` is whatever else the build depends on
    that is not in the sources or flags (the text of a header named by an
    absolute path in the flags)."""
    sources = dict(sources)
    units = [name for name in sources if name.endswith(TRANSLATION_UNITS)]
    if not units:
        raise ValueError(f"sources: no translation unit ({', '.join(TRANSLATION_UNITS)}) among {list(sources)}")
    for name in sources:
        if Path(name).name != name or name in (".", ".."):
            raise ValueError(f"sources: {name!r} is not a plain file name")
    cxx = compiler_command()
    command = [*cxx, *flags, *SHARED_FLAGS]
    key = cache.key(__version__, *_identity(tuple(cxx)), *command, *key_parts,
                    *(part for name in sorted(sources) for part in (name, sources[name])))

    def build(library: Path) -> None:
        folder = library.parent  # a fresh scratch folder of its own: no other build writes there
        for name, text in sources.items():
            (folder / name).write_text(text)
        proc = None
        if os.environ.get(PCH_VARIABLE, "") not in ("", "0") and (faster := _with_precompiled_header(command)):
            proc = subprocess.run([*faster, *units, "-o", library.name], cwd=folder, capture_output=True, text=True)
        if proc is None or proc.returncode != 0 or not library.exists():  # the plain build decides, and reports
            proc = subprocess.run([*command, *units, "-o", library.name], cwd=folder, capture_output=True, text=True)
        if proc.returncode != 0 or not library.exists():
            log = (proc.stderr + proc.stdout)[-LOG_TAIL:]
            raise HostCompilerError(f"the host compiler ({shlex.join(command[:1])}) rejected a module fusec "
                                    f"generated; this is a fusec bug, please report it. The end of its log:\n{log}")
    return cache.build_file("sim", key, ".so", build)


def _with_precompiled_header(command: list[str]) -> list[str] | None:
    """`command` with its first `-include HEADER` (an absolute path) naming a copy of HEADER in the
    cache that has its precompiled form beside it (g++ reads HEADER.gch for HEADER where that is
    valid, HEADER itself otherwise); None where there is no such header or it cannot be built."""
    if "-include" not in command[:-1]:
        return None
    at = command.index("-include")
    header = Path(command[at + 1])
    if not header.is_absolute():
        return None
    flags = [flag for flag in command[:at] + command[at + 2:] if flag != "-shared"]  # a unit's options, as g++ wants
    try:
        text = header.read_bytes()
        key = cache.key(__version__, *_identity(tuple(compiler_command())), *flags, header.name, text)
        copy = cache.entry("sim", key, ".h")
        if cache.load_or_build("sim", key, ".h", lambda: text) != text:
            return None

        def precompile(output: Path) -> None:
            proc = subprocess.run([*flags, "-x", "c++-header", str(copy), "-o", str(output)],
                                  capture_output=True, text=True)
            if proc.returncode != 0 or not output.exists():
                raise HostCompilerError(f"{header.name} did not precompile")
        _intact_once(cache.entry("sim", key, ".h.gch"), lambda: cache.build_file("sim", key, ".h.gch", precompile))
    except (OSError, HostCompilerError):
        return None
    return [*command[:at], "-include", str(copy), *command[at + 2:]]


_intact: dict[Path, tuple[int, int, int]] = {}  # precompiled headers this process found intact: their stat


def _intact_once(path: Path, build) -> None:
    """`build()` (which checks the entry's digest, or builds it) unless this process already did
    for the file now at `path`: a precompiled header is tens of megabytes to hash."""
    def stat(p: Path) -> tuple[int, int, int] | None:
        try:
            s = p.stat()
        except OSError:
            return None
        return s.st_ino, s.st_size, s.st_mtime_ns
    seen = stat(path)
    if seen is None or _intact.get(path) != seen:
        path = build()
        _intact[path] = stat(path)


@functools.cache
def _identity(cxx: tuple[str, ...]) -> tuple[str, str]:
    """The compiler's path and `--version` banner, so that a new compiler rebuilds everything."""
    proc = subprocess.run([*cxx, "--version"], capture_output=True, text=True)
    return shutil.which(cxx[0]) or cxx[0], proc.stdout
