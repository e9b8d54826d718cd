"""The content-addressed cache (FA_CACHE) and atomic writes.

Every file that fa writes into the cache or into wheels/ goes through `atomic_write_*`: written to a
temporary file in the same directory, fsynced, then renamed over the target. A reader therefore sees
either nothing or a whole file, a killed build leaves at most a stray `*.tmp-*` file (ignored and
swept), and two builds sharing one cache never corrupt it: the last rename wins with identical bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock
from platformdirs import user_cache_dir

TMP_MARK = ".tmp-"
# mkstemp makes 0600 files; wheels, indexes and cache entries are meant to be read by others (a web
# server, another user sharing FA_CACHE), so they get the usual file mode.
PUBLIC_MODE = 0o644


def cache_dir() -> Path:
    """FA_CACHE if set, else the platform's cache dir (~/.cache/fa on Linux)."""
    root = Path(os.environ.get("FA_CACHE") or user_cache_dir("fa", appauthor=False))
    root.mkdir(parents=True, exist_ok=True)
    return root


def content_key(*parts: bytes | str) -> str:
    """sha256 over length-prefixed parts, so ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + TMP_MARK, dir=path.parent)
    try:
        os.fchmod(fd, PUBLIC_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: object) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` for a tool that writes a file itself (a compiler, a zip
    writer); on success it is renamed onto `path`, on failure removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + TMP_MARK, dir=path.parent)
    os.fchmod(fd, PUBLIC_MODE)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def locked(path: Path, timeout: float = -1) -> Iterator[None]:
    """An inter-process lock named after `path` (for work that must happen once, like unpacking a
    toolkit, while other builds wait for it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=timeout):
        yield


def sweep_tmp(directory: Path) -> int:
    """Remove temporaries left by a killed writer; returns how many."""
    n = 0
    if directory.is_dir():
        for p in directory.rglob(f"*{TMP_MARK}*"):
            with contextlib.suppress(OSError):
                p.unlink() if p.is_file() else None
                n += 1
    return n
