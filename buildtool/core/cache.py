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

from buildtool.core.atomic import WriteError, write_problem
from buildtool.errors import UsageError


def cache_dir() -> Path:
    """FA_CACHE if set, else the platform's cache dir (~/.cache/fa on Linux)."""
    root = Path(os.environ.get("FA_CACHE") or user_cache_dir("fa", appauthor=False))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where the folder belongs, no permission: the user's to fix (exit 2)
        where = "FA_CACHE" if os.environ.get("FA_CACHE") else "the default cache folder"
        raise UsageError(write_problem(root, e, f"cannot use {where}")) from None
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
    toolkit or compiling one kernel, while other builds wait for it and then reuse the result)."""
    lock = Path(str(path) + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError(lock, e) from e
    flock = FileLock(str(lock), timeout=timeout)
    try:
        flock.acquire()
    except OSError as e:
        raise WriteError(lock, e, "cannot lock") from e
    try:
        yield
    finally:
        flock.release()
