"""Atomic writes: every file fa writes into the cache or into wheels/ goes through here.

Written to a temporary file in the same directory, fsynced, then renamed over the target. A reader
therefore sees either nothing or a whole file, a killed build leaves at most a stray `*.tmp-*` file
(ignored and swept), and two builds sharing one cache never corrupt it: the last rename wins with
identical bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

TMP_MARK = ".tmp-"
# mkstemp makes 0600 files; wheels, indexes and cache entries are meant to be read by others (a web
# server, another user sharing FA_CACHE), so they get the usual file mode.
PUBLIC_MODE = 0o644


def write_bytes(path: Path, data: bytes) -> Path:
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


def write_text(path: Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: Path, obj: object) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def writing(path: Path) -> Iterator[Path]:
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
