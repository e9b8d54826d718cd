"""Atomic writes: every file fa writes into the cache or into wheels/ goes through here.

Written to a temporary file in the same directory, fsynced, then renamed over the target. A reader
therefore sees either nothing or a whole file, and two builds sharing one cache never corrupt it: the
last rename wins with identical bytes.

A killed writer leaves at most its temporary, named `<target>.fa-tmp-<pid>-<random>`. Only names of
exactly that shape whose writer is gone are ever removed (`sweep_stale`), only in a directory fa is
writing into, never recursively and never through a symlink: a user's `draft.tmp-v2` beside them, or a
temporary of a build still running, is left alone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from buildtool.errors import FaError

TMP_MARK = ".fa-tmp-"
# <target>.fa-tmp-<pid>-<8 characters from mkstemp/mkdtemp's alphabet>
_TMP_NAME = re.compile(r"(?P<target>.+)\.fa-tmp-(?P<pid>[0-9]{1,10})-[a-z0-9_]{8}", re.ASCII)
# A temporary whose writer is still alive is kept, unless it is older than any write of fa takes (the
# pid was reused by another program long after the writer died).
STALE_AFTER_S = 24 * 3600
# mkstemp makes 0600 files; wheels, indexes and cache entries are meant to be read by others (a web
# server, another user sharing FA_CACHE), so they get the usual file mode.
PUBLIC_MODE = 0o644


class WriteError(FaError):
    """A file or folder fa could not write (exit 1): the message names the path, the operating
    system's reason and a fix, where a bare OSError says "[Errno 28] No space left on device"."""

    def __init__(self, path: Path, cause: OSError, what: str = "cannot write") -> None:
        super().__init__(write_problem(path, cause, what))
        self.path = path
        self.errno = cause.errno


def write_problem(path: Path, cause: OSError, what: str = "cannot write") -> str:
    return f"{what} {path}: {cause.strerror or cause}\n  fix: {_fix(cause, path)}"


def _fix(cause: OSError, path: Path) -> str:
    if cause.errno == errno.ENOSPC or cause.errno == errno.EDQUOT:
        return (
            f"free some space on the file system holding {path.parent} (or point FA_CACHE / --out elsewhere)"
        )
    if cause.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"make {path.parent} writable for this user, or point FA_CACHE / --out elsewhere"
    if cause.errno in (errno.EEXIST, errno.ENOTDIR):
        return (
            f"a file is in the way of the folder {path.parent}: move it, or point FA_CACHE / --out elsewhere"
        )
    if cause.errno == errno.EISDIR:
        return f"{path} is a folder: move it, or point FA_CACHE / --out elsewhere"
    return "check the path and its file system, then re-run"


def tmp_prefix(name: str) -> str:
    """The prefix of a temporary beside `name` (for mkstemp/mkdtemp): carries this process's id, so
    `sweep_stale` can tell a dead writer's leftovers from a live one's work."""
    return f"{name}{TMP_MARK}{os.getpid()}-"


def _writer_gone(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False  # alive, another user's (or a number no process can have: leave it to the age rule)
    return False


def sweep_stale(directory: Path, target: str | None = None) -> list[Path]:
    """Remove the temporaries fa's killed writers left in `directory` (not below it), optionally only
    those of one `target` name; returns what was removed. Regular files only, symlinks never followed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        match = _TMP_NAME.fullmatch(entry.name)
        if match is None or (target is not None and match["target"] != target):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_AFTER_S
            if old or _writer_gone(int(match["pid"])):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue  # gone already, or not ours to remove
    return removed


def is_temporary(name: str) -> bool:
    """True for the name of one of fa's temporaries."""
    return _TMP_NAME.fullmatch(name) is not None


def ensure_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError(directory, e, "cannot create the folder") from e


def write_bytes(path: Path, data: bytes) -> Path:
    with writing(path) as tmp:
        try:
            with tmp.open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise WriteError(path, e) from e
    return path


def write_text(path: Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: Path, obj: object) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def writing(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` for a tool that writes a file itself (a compiler, a zip
    writer); on success it is renamed onto `path`, on failure removed. Leftovers of this name from a
    killed writer are swept first."""
    ensure_dir(path.parent)
    sweep_stale(path.parent, path.name)
    try:
        fd, tmp = tempfile.mkstemp(prefix=tmp_prefix(path.name), dir=path.parent)
        os.fchmod(fd, PUBLIC_MODE)
        os.close(fd)
    except OSError as e:
        raise WriteError(path, e) from e
    try:
        yield Path(tmp)
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise WriteError(path, e) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def make_temp_dir(final: Path) -> Path:
    """A temporary folder beside `final`, to fill and then rename onto it (a toolkit, a header tree)."""
    ensure_dir(final.parent)
    try:
        return Path(tempfile.mkdtemp(prefix=tmp_prefix(final.name), dir=final.parent))
    except OSError as e:
        raise WriteError(final, e) from e
