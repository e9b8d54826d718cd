"""The content-addressed cache (FA_CACHE): where it is, content keys, inter-process locks.

Files land in it through core/atomic.py, so two builds sharing one cache never corrupt it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock
from platformdirs import user_cache_dir

from buildtool.core.atomic import TMP_MARK


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
