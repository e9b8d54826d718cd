"""fa's own files: the install journal and lock, `.fa-attn-install`, `.fa-written.json` and its lock, the
verification records, the pins file and the manifests. One rule for reading, writing and locking them,
since each sits where a careless or hostile environment can put something else in its place:

- never through a symbolic link: the file is opened with O_NOFOLLOW, relative to its folder, which is
  opened the same way and must be a real folder owned by this user or root (so a link or another user's
  folder in place of `.fa-attn-install/` is never entered);
- a regular file or nothing: opened with O_NONBLOCK and fstat'ed before a byte is read, so a FIFO cannot
  hang the reader and a folder or a device (/dev/zero) is refused, not read;
- at most `limit` bytes, checked on the open file before reading (no MemoryError);
- JSON nested at most `max_depth` deep, checked before json.loads (no RecursionError);
- with `private=True` (a file whose content fa acts on: a record, the journal), owned by this user or
  root and writable by no one else; with `any_owner=True` (a file that comes with installed code: a
  wheel's manifest, as trusted as the code beside it), in a folder of anyone's (a shared environment);
- written atomically (a temporary beside it, fsynced, renamed over it), never over a link, a folder or
  anything but a regular file;
- locked with flock, waiting at most `timeout` seconds, then refused naming the holder and the lock.

Whatever does not match raises `Refused`, with the path and a reason a person can act on; the caller
says what it does instead (sets the file aside, falls back, exits 2). Nothing here deletes or follows
what it refuses.

Stdlib only: it ships in every wheel, and buildtool loads this same file by path
(buildtool/core/runtime.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Held",
    "Holder",
    "Refused",
    "held_by",
    "locked",
    "named",
    "read_bytes",
    "read_json",
    "write_atomic",
]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# The temporary of an atomic write: the shape buildtool/core/atomic.py sweeps when its writer is dead.
_TMP_MARK = ".fa-tmp-"
_FILE_MODE = 0o644
_LOCK_POLL_S = 0.1
# JSON text between quotes (escapes included): skipped when counting how deep brackets nest.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


_MOVE_AWAY = "move it away (fa makes its own), then re-run"


class Refused(Exception):
    """One of fa's own files that fa will not read, write or lock: `path` is the file, `problem` what is
    wrong with it, `fix` what to do; `reason` says both in one sentence."""

    def __init__(self, path: Path | str, problem: str, fix: str = _MOVE_AWAY) -> None:
        self.path = Path(path)
        self.problem = problem
        self.fix = fix
        self.reason = f"{problem}: {fix}"
        super().__init__(f"{path}: {self.reason}")


def named(folder: Path | str, name: str) -> Path:
    """fa's own file `name` in a folder a person named (`--out wheels`, `--pins dir/pins.json`'s
    folder): the folder is resolved once (it may be a link to where the files live, the person's
    choice); `name`, fa's own, is then never followed."""
    return Path(os.path.realpath(folder)) / name


def _trusted_uid(uid: int) -> bool:
    return uid == 0 or uid == os.geteuid()


def _who(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def _link_refusal(path: Path) -> Refused:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return Refused(
        path,
        f"is a symbolic link{target}, and fa never follows a link in place of one of its own files or "
        "folders",
        "move the link away, then re-run",
    )


def _open_folder(folder: Path, *, any_owner: bool = False) -> int:
    """The folder opened without following a link; refused unless it is a real folder owned by this
    user or root (or, with `any_owner`, by anyone)."""
    try:
        fd = os.open(folder, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(folder):
            raise _link_refusal(folder) from None
        if exc.errno == errno.ENOTDIR:
            raise Refused(folder, "is not a folder, where fa keeps its files") from None
        raise
    owner = os.fstat(fd).st_uid
    if not any_owner and not _trusted_uid(owner):
        os.close(fd)
        raise Refused(
            folder,
            f"belongs to {_who(owner)}, not to this user or root, so another user could replace fa's "
            "files in it",
            "run fa as its owner, or use a folder you own",
        )
    return fd


def _check_owner(path: Path, st: os.stat_result) -> None:
    if not _trusted_uid(st.st_uid):
        raise Refused(
            path,
            f"belongs to {_who(st.st_uid)}, not to this user or root, so fa does not trust it",
            "move it away if you did not write it, or make it again as this user",
        )


def _check_private(path: Path, st: os.stat_result) -> None:
    _check_owner(path, st)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Refused(
            path,
            f"is writable by other users (mode {stat.filemode(st.st_mode)}), so fa does not trust what "
            "it says",
            f"chmod go-w {path} if its content is yours, else move it away",
        )


def _open_regular(
    path: Path, flags: int, *, private: bool, any_owner: bool = False, mode: int = _FILE_MODE
) -> int:
    """The file opened without following a link or blocking, checked to be a regular file."""
    path = Path(path)
    folder_fd = _open_folder(path.parent, any_owner=any_owner)
    try:
        try:
            fd = os.open(path.name, flags | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, mode, dir_fd=folder_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _link_refusal(path) from None
            if exc.errno == errno.EISDIR:
                raise Refused(path, "is a folder, where fa keeps a file of its own") from None
            if exc.errno == errno.ENXIO:  # a FIFO without a reader, opened for writing
                raise Refused(path, "is a FIFO (named pipe), where fa keeps a file of its own") from None
            raise
    finally:
        os.close(folder_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(path, f"is {_kind(st.st_mode)}, where fa keeps a file of its own")
        if private:
            _check_private(path, st)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path | str, *, limit: int, private: bool = False, any_owner: bool = False) -> bytes:
    """The file's bytes. Raises FileNotFoundError when it is absent (or its folder is), Refused
    when it is not a regular file of at most `limit` bytes in a real folder of this user's or root's
    (and, with `private`, owned by this user or root and not writable by others), and OSError for a
    file the system will not give (permissions). `any_owner`: a file that comes with installed code (a
    wheel's manifest), which is as trusted as the code beside it, whoever installed it; its folder
    may then be anyone's (a shared environment's)."""
    path = Path(path)
    fd = _open_regular(path, os.O_RDONLY, private=private, any_owner=any_owner)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise Refused(path, _too_big(size, limit))
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)  # the file may have grown since fstat
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Refused(path, _too_big(len(data), limit))
    return data


def _too_big(size: int, limit: int) -> str:
    return f"holds {size} bytes or more, more than the {limit} a file of this kind may hold"


def json_depth(data: bytes) -> int:
    """How deep the arrays and objects of JSON text nest (brackets inside strings do not count)."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_JSON_STRING.sub(b'""', data)):
        if match.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def read_json(
    path: Path | str, *, limit: int, max_depth: int = 64, private: bool = False, any_owner: bool = False
) -> Any:
    """The file's JSON value (read_bytes's rules, UTF-8 with or without a byte order mark). Refused
    also when it is not JSON or nests deeper than `max_depth`."""
    path = Path(path)
    data = read_bytes(path, limit=limit, private=private, any_owner=any_owner)
    if (depth := json_depth(data)) > max_depth:
        raise Refused(path, f"nests {depth} levels deep, more than the {max_depth} a file of this kind has")
    try:
        return json.loads(data.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError as exc:
        raise Refused(path, f"is not UTF-8 text (byte {exc.start})") from None
    except ValueError as exc:
        raise Refused(path, f"is not JSON ({exc})") from None


def write_atomic(path: Path | str, data: bytes, *, mode: int = _FILE_MODE) -> None:
    """Write `data` as the whole file: a temporary beside it, fsynced, renamed over it. Refused when the
    folder is not a real folder of this user's or root's, or something other than a regular file (a
    link, a folder, a FIFO) is at `path`: that is left as it is. The folder must exist."""
    path = Path(path)
    folder_fd = _open_folder(path.parent)
    try:
        try:
            st = os.stat(path.name, dir_fd=folder_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISLNK(st.st_mode):
                raise _link_refusal(path)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(path, f"is {_kind(st.st_mode)}, where fa writes a file of its own")
        tmp = f"{path.name}{_TMP_MARK}{os.getpid()}-{os.urandom(4).hex()}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, mode, dir_fd=folder_fd
        )
        try:
            try:
                os.fchmod(fd, mode)  # whatever the umask: readable as the caller says
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder_fd)
            raise
        with contextlib.suppress(OSError):
            os.fsync(folder_fd)  # the rename itself survives a power cut
    finally:
        os.close(folder_fd)


@dataclass(frozen=True)
class Holder:
    """The process holding a lock, as it wrote itself into the lock file."""

    pid: int | None  # None: the file does not say (not written by fa)
    command: str
    # When it took the lock (the lock file's modification time: the holder writes itself into it then),
    # in seconds since the epoch; None where the file does not say who holds it.
    since: float | None = field(default=None, compare=False)

    def __str__(self) -> str:
        if self.pid is None:
            return "a process that did not say who it is"
        return f"pid {self.pid}" + (f" ({self.command})" if self.command else "")


class Held(Refused):
    """A lock another process held past the timeout."""

    def __init__(self, path: Path | str, holder: Holder, timeout: float) -> None:
        super().__init__(
            path,
            f"is held by {holder}, still after {timeout:g} s",
            "wait for that process to finish (or stop it), then re-run",
        )
        self.holder = holder


def _holder(fd: int) -> Holder:
    text = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    pid, _, command = text.partition(" ")
    if not (pid.isdigit() and len(pid) < 10):
        return Holder(None, "")
    return Holder(int(pid), command, os.fstat(fd).st_mtime)


def _try_flock(fd: int) -> bool:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def locked(
    path: Path | str, *, timeout: float, waiting: Callable[[Holder], None] | None = None
) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created if absent; only ever a regular file in a real
    folder, owned by this user or root, never through a link). Another holder: `waiting` is told
    once who it is (when `timeout` > 0), and the lock is tried until `timeout` seconds have passed,
    then Held names the holder and the lock. The kernel drops the lock when its holder dies."""
    path = Path(path)
    fd = _open_regular(path, os.O_RDWR | os.O_CREAT, private=False)
    try:
        _check_owner(path, os.fstat(fd))  # fa writes its pid into it: never into another user's file
        if not _try_flock(fd):
            deadline = time.monotonic() + timeout
            if waiting is not None and timeout > 0:
                waiting(_holder(fd))
            while not _try_flock(fd):
                if time.monotonic() >= deadline:
                    raise Held(path, _holder(fd), timeout)
                time.sleep(_LOCK_POLL_S)
        command = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))[:200]
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(errors="replace"), 0)
        yield
    finally:
        os.close(fd)


def held_by(path: Path | str) -> Holder | None:
    """Who holds the lock `path` now (None: no one, or there is no such file), changing nothing; Refused
    as locked() refuses."""
    try:
        fd = _open_regular(Path(path), os.O_RDONLY, private=False)
    except FileNotFoundError:
        return None
    try:
        if _try_flock(fd):
            return None  # closing the file drops the lock just taken
        return _holder(fd)
    finally:
        os.close(fd)
