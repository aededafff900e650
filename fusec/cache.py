"""Where fusec keeps what it builds, and how every cached file is written and read.

The root is `$FUSEC_CACHE_DIR`, else `$XDG_CACHE_HOME/fusec`, else
`~/.cache/fusec`. One folder per kind of artefact (`KINDS`): grammar (Lark's
parse tables), templates (compiled Jinja2), sim (host builds of modules), cuda
(cubins and PTX).

Every entry is published the same way, so that no reader ever sees half a
file and no damaged file is ever used:

- it is written to a temporary file in its own folder, then renamed over the
  entry (`os.replace` is atomic), and only then is its SHA-256 written beside
  it (`ENTRY.sha256`, also by rename); a reader that finds the digest missing
  or different rebuilds the entry (a truncated `.so` would kill the process
  that loads it);
- builders of one entry take a lock on `ENTRY.lock` (`fcntl.flock`), so that
  several processes asking for the same entry build it once;
- a cache folder that cannot be created or written falls back to a private
  temporary folder for the rest of the process, with one `RuntimeWarning`.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import jinja2

KINDS = ("grammar", "templates", "sim", "cuda", "guard", "tune")
_KEY = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def root() -> Path:
    """The cache's root as configured (it may not exist or be writable: see `directory`)."""
    configured = os.environ.get("FUSEC_CACHE_DIR")
    if configured:
        return Path(os.path.abspath(configured))  # the same folder after a chdir
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore a relative path
        return Path(xdg) / "fusec"
    return Path.home() / ".cache" / "fusec"


def key(*parts: str | bytes) -> str:
    """A cache key: the SHA-256 of the parts, each one delimited (so ("ab", "c") != ("a", "bc"))."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else bytes(part)
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


# ---- folders, and the fallback when the configured one cannot be written

_usable: dict[Path, Path] = {}  # configured folder -> the folder really used
_private_root: Path | None = None


def directory(kind: str) -> Path:
    """The folder of one kind of entry, created; the private fallback if it cannot be written."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    configured = root() / kind
    if configured not in _usable:
        reason = _unwritable(configured)
        _usable[configured] = configured if reason is None else _fall_back(configured, reason) / kind
        _usable[configured].mkdir(parents=True, exist_ok=True)
    return _usable[configured]


def _unwritable(folder: Path) -> str | None:
    """Why a file cannot be created in `folder` (after creating it), or None if it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _fall_back(configured: Path, reason: str) -> Path:
    global _private_root
    if _private_root is None:
        _private_root = Path(tempfile.mkdtemp(prefix="fusec-cache-"))
        atexit.register(shutil.rmtree, _private_root, ignore_errors=True)
        warnings.warn(f"fusec cannot write its cache directory {configured} ({reason}); using a private "
                      f"temporary one, {_private_root}, removed at exit. Set FUSEC_CACHE_DIR to a writable "
                      "folder to keep builds between runs.", RuntimeWarning, stacklevel=3)
    return _private_root


# ---- entries

def entry(kind: str, key: str, suffix: str = "") -> Path:
    """Where the entry `key` of `kind` lives (whether or not it has been built)."""
    if not _KEY.fullmatch(key + suffix) or key + suffix in (".", ".."):
        raise ValueError(f"key, suffix: expected letters, digits, '_', '.' or '-', got {key + suffix!r}")
    return directory(kind) / f"{key}{suffix}"


def write_atomic(path: Path, data: bytes) -> None:
    """Writes `data` to a temporary file beside `path`, then renames it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)  # `fusec cache clear` may have run since
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def read(kind: str, key: str, suffix: str = "") -> bytes | None:
    """The entry's content if it is intact (its digest matches), else None."""
    return _read_intact(entry(kind, key, suffix))


def write(kind: str, key: str, suffix: str, data: bytes) -> Path:
    """Publishes `data` as the entry (atomic, then its digest)."""
    path = entry(kind, key, suffix)
    write_atomic(path, data)
    _seal(path, data)
    return path


def load_or_build(kind: str, key: str, suffix: str, build: Callable[[], bytes],
                  validate: Callable[[bytes], bool] | None = None) -> bytes:
    """The entry's content; built by `build()` and published if it is missing,
    damaged or refused by `validate`. Concurrent callers build it once."""
    def usable(data: bytes | None) -> bool:
        return data is not None and (validate is None or validate(data))

    data = read(kind, key, suffix)
    if usable(data):
        return data
    with lock(kind, key, suffix):
        data = read(kind, key, suffix)  # another process may have built it while we waited
        if not usable(data):
            data = build()
            with contextlib.suppress(OSError):  # a full disk: the result is right, only not kept
                write(kind, key, suffix, data)
    return data


def build_file(kind: str, key: str, suffix: str, build: Callable[[Path], object]) -> Path:
    """The path of an intact entry (for a file another program opens: a shared
    library, a parse table); `build(path)` writes it to a fresh temporary path
    beside the entry if it is missing or damaged. Concurrent callers build it once."""
    path = entry(kind, key, suffix)
    if _read_intact(path) is not None:
        return path
    with lock(kind, key, suffix):
        if _read_intact(path) is not None:
            return path
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as scratch:
            built = Path(scratch) / path.name
            build(built)
            data = built.read_bytes()
            os.replace(built, path)
        _seal(path, data)
    return path


@contextlib.contextmanager
def lock(kind: str, key: str, suffix: str = "") -> Iterator[None]:
    """Holds the entry's lock (across processes) while the block runs."""
    path = entry(kind, key, suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _seal(path: Path, data: bytes) -> None:
    # Written after the entry is in place: a digest never vouches for a file not yet renamed.
    write_atomic(_digest_path(path), hashlib.sha256(data).hexdigest().encode())


def _read_intact(path: Path) -> bytes | None:
    try:
        expected = _digest_path(path).read_bytes().decode("ascii", "replace").strip()
        data = path.read_bytes()
    except OSError:  # missing, unreadable, a folder: rebuilt
        return None
    return data if hashlib.sha256(data).hexdigest() == expected else None


# ---- Jinja2's compiled templates through the same entries

class TemplateBytecodeCache(jinja2.BytecodeCache):
    """Jinja2's compiled templates as cache entries (Jinja2's own file cache
    unpickles without a check: a damaged file raises, or loads wrong code)."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        data = read("templates", bucket.key, ".jinja")
        if data is not None:
            bucket.bytecode_from_string(data)  # a stale checksum or Python version leaves it empty

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):  # a full disk: the template is compiled, only not kept
            write("templates", bucket.key, ".jinja", bucket.bytecode_to_string())


# ---- the `fusec cache` command

def usage() -> tuple[int, int]:
    """(files, bytes) in the cache's folders."""
    files = [p for kind in KINDS for p in (root() / kind).rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def clear() -> tuple[int, int]:
    """Removes every kind's folder (nothing else under the root: it may be a
    folder the user shares); returns the (files, bytes) freed."""
    freed = usage()
    for kind in KINDS:
        if (root() / kind).is_dir():
            shutil.rmtree(root() / kind)
    return freed
