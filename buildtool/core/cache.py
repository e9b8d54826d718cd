"""The content-addressed cache (FA_CACHE): where it is, content keys, inter-process locks, and
stamps: what a step made from inputs named by a content key, so a run with nothing changed skips it.

Files land in it through core/atomic.py, so two builds sharing one cache never corrupt it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import math
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from platformdirs import user_cache_dir

from buildtool.core import atomic
from buildtool.core.atomic import WriteError, write_problem
from buildtool.core.runtime import ownfiles
from buildtool.errors import FaError, UsageError


def cache_dir() -> Path:
    """FA_CACHE if set, else the platform's cache dir (~/.cache/fa on Linux)."""
    return _made(os.environ.get("FA_CACHE") or "")


@functools.lru_cache(maxsize=8)
def _made(fa_cache: str) -> Path:
    """The cache folder for this FA_CACHE value, made once per process: a build asks for it a few
    thousand times (every image path, stamp and lock); a mkdir each time was the most-called step of a
    profiled no-op rebuild. A folder removed meanwhile is made again by the write that needs it
    (atomic.writing makes its parents)."""
    root = Path(fa_cache or user_cache_dir("fa", appauthor=False))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where the folder belongs, no permission: the user's to fix (exit 2)
        where = "FA_CACHE" if fa_cache else "the default cache folder"
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


def _say_waiting(lock: Path) -> Callable[[ownfiles.Holder], None]:
    def say(holder: ownfiles.Holder) -> None:
        since = ""
        if holder.since is not None:
            ago = max(0, round(time.time() - holder.since))
            since = f" since {time.strftime('%H:%M:%S', time.localtime(holder.since))} ({ago} s ago)"
        print(
            f"{lock}: held by {holder}{since} (another fa build using this FA_CACHE); waiting for it, "
            "then reusing what it made",
            file=sys.stderr,
            flush=True,
        )

    return say


@contextlib.contextmanager
def locked(path: Path, timeout: float = math.inf) -> Iterator[None]:
    """An inter-process lock named after `path` (for work that must happen once, like unpacking a
    toolkit or compiling one kernel, while other builds wait for it and then reuse the result): `path`
    + ".lock", an ownfiles lock (one mechanism for all of fa's locks). A lock another process holds is
    said on stderr at once (its pid, command and since when), then waited for up to `timeout` seconds."""
    lock = Path(str(path) + ".lock")
    with contextlib.ExitStack() as held:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            # The cache folder may be a link the person made (FA_CACHE=/scratch/link): resolved once;
            # the lock file itself, fa's own, is never followed.
            own = ownfiles.named(lock.parent, lock.name)
            held.enter_context(ownfiles.locked(own, timeout=timeout, waiting=_say_waiting(own)))
        except ownfiles.Held as exc:
            raise FaError(f"{exc.path}: {exc.reason}") from None
        except ownfiles.Refused as exc:
            raise UsageError(f"{exc.path}: {exc.reason}") from None
        except OSError as e:
            raise WriteError(lock, e, "cannot lock") from e
        yield  # the work, outside the try: its own errors are its own


def file_state(path: Path | str) -> list[int] | None:
    """What tells that a file is unchanged without reading it (as git's index does): its device, inode,
    size, and modification and status-change times in ns. Every write or rename moves the last, which
    no user can set back. None when it is not a regular file. One stat: a no-op rebuild asks it of every
    image of every wheel."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


# Within inputs_held(): each input's state, looked at once.
_HELD: contextvars.ContextVar[dict[str, list[int] | None] | None] = contextvars.ContextVar(
    "fa_inputs_held", default=None
)


@contextlib.contextmanager
def inputs_held() -> Iterator[None]:
    """Within it, input_state looks at each path once: a build does not change the images and bindings
    it packs while it packs them, and a release's wheels name ~6,000 of them (each image in several)."""
    token = _HELD.set({})
    try:
        yield
    finally:
        _HELD.reset(token)


def input_state(path: Path) -> list[int] | None:
    """file_state of an input, once per path within inputs_held() (at every call outside it)."""
    held = _HELD.get()
    if held is None:
        return file_state(path)
    key = os.fspath(path)
    if key not in held:
        held[key] = file_state(key)
    return held[key]


def _stamp_path(kind: str, key: str) -> Path:
    return Path(os.path.join(cache_dir(), "stamps", kind, key[:2], f"{key}.json"))  # one Path, not four


def read_stamp(kind: str, key: str) -> dict[str, Any] | None:
    """The stamp `write_stamp` left for (kind, key), or None (none, unreadable: redo the step)."""
    try:
        data = json.loads(_stamp_path(kind, key).read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_stamp(kind: str, key: str, data: dict[str, Any]) -> None:
    """Records what a step made (renamed into place whole; not synced to disk: a stamp lost in a crash
    costs only the next run's time, as does one that cannot be written)."""
    path = _stamp_path(kind, key)
    with contextlib.suppress(WriteError, OSError), atomic.writing(path) as tmp:
        tmp.write_text(json.dumps(data, sort_keys=True))


@functools.cache
def own_code_hash() -> str:
    """sha256 over fa's own code (buildtool/, with its templates, and the runtime package whose
    modules it reads): part of every stamp's key, so a changed fa redoes what its code makes."""
    root = Path(__file__).resolve().parents[1]  # buildtool/
    runtime = next(
        (d for d in (root / "_kernels" / "fa_attn", root.parent / "kernels" / "fa_attn") if d.is_dir()), None
    )
    kinds = (".py", ".j2", ".json", ".html", ".css", ".js")
    files = [p for p in root.rglob("*") if p.suffix in kinds and "_kernels" not in p.relative_to(root).parts]
    files += [p for p in runtime.rglob("*.py")] if runtime else []
    files = sorted(p for p in files if "__pycache__" not in p.parts)
    return content_key(*(part for p in files for part in (p.as_posix(), p.read_bytes())))
