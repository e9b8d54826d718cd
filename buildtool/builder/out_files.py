"""What fa wrote in an output folder (`fa build --out`, `fa index DIR`), so that it only ever replaces
its own files there.

`--out` is a user's folder: it may hold their own index.json, a simple/ page, build logs, wheels of
other platforms copied in, or links to elsewhere. fa keeps a record, `.fa-written.json` beside the
wheels, of every file it wrote there and the sha256 of what it wrote. Before replacing a file it checks
the file is in the record with the same sha256: a file fa did not write, or one changed since (a
tampered wheel), is refused by name, never overwritten or re-indexed silently. Nothing is written
through a symbolic link below the folder: a `simple/` or `logs/` that links elsewhere is refused.

The record is updated under a lock (two builds into one folder) and before each rename as well as
after it, so a build killed between the two still finds the file it wrote to be its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from buildtool.core import atomic
from buildtool.core.fetch import sha256_file
from buildtool.core.runtime import ownfiles
from buildtool.errors import FaError, UsageError

RECORD = ".fa-written.json"
MAX_RECORD_BYTES = 4 << 20  # a path and a hash per file: a release folder's record is a few KB
# Another fa build or index holding the folder's lock writes a few files; a minute is far past that.
LOCK_WAIT_S = 60.0
# In every page fa writes in a wheel folder (the pages' <meta name="generator">).
GENERATOR = "fa index"
GENERATOR_MARK = f'<meta name="generator" content="{GENERATOR}">'.encode()
# A file fa wrote that changed since, set aside before fa writes it again (set_aside_if_changed).
CHANGED_MARK = ".fa-changed-"


class OutFileError(UsageError):
    """A file or link in the output folder that fa must not replace or follow (exit 2)."""


def _own_path(root: Path, name: str) -> Path:
    """root/name for ownfiles: the folder the person named is resolved once (`--out wheels` may be a
    link to where the wheels live); fa's own names in it are never followed."""
    inside(root, name)
    return ownfiles.named(root, name)


def _record_path(root: Path) -> Path:
    return _own_path(root, RECORD)


# Each record read in this process: its path -> (its state then, what it held). A build asks for the
# record once per wheel and index file; read again only when its state moved (every write renames a new
# file into place). A link, FIFO or folder there has no regular file's state: read (and refused) anew.
_READ: dict[str, tuple[tuple[int, ...], dict[str, list[str]]]] = {}


def _record_state(path: Path) -> tuple[int, ...] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)


def written(root: Path) -> dict[str, list[str]]:
    """The record: relative path -> the sha256s fa wrote there (two while a rename is under way). Read
    as fa's own file (ownfiles): a link, FIFO, device, folder, deep or oversized JSON, or another
    user's record is refused by name (exit 2) and left where it is."""
    path = _record_path(root)
    state = _record_state(path)  # before the read: a write meanwhile gives a state read again next time
    seen = _READ.get(str(path))
    if state is not None and seen is not None and seen[0] == state:
        return {rel: list(hashes) for rel, hashes in seen[1].items()}
    files = _read_record(path, root)
    if state is not None:
        _READ[str(path)] = (state, {rel: list(hashes) for rel, hashes in files.items()})
    return files


def _read_record(path: Path, root: Path) -> dict[str, list[str]]:
    try:
        raw = ownfiles.read_json(path, limit=MAX_RECORD_BYTES, private=True)
    except FileNotFoundError:
        return {}
    except ownfiles.Refused as exc:
        raise OutFileError(
            f"{_refused(exc, root)} (without it, fa treats every file in the folder as not its own)"
        ) from None
    except OSError as exc:
        raise OutFileError(f"{path}: cannot read it ({exc.strerror})\n  fix: check its permissions") from None
    files = raw.get("files") if isinstance(raw, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(h, str) for h in v)
        for k, v in files.items()
    ):
        raise OutFileError(
            f"{path}: not the record of files fa wrote here\n  fix: restore it, or move it away (fa then "
            "treats every file in the folder as not its own)"
        )
    return files


def _refused(exc: ownfiles.Refused, root: Path) -> str:
    return f"{exc.path}: {exc.problem}; nothing written in {root}\n  fix: {exc.fix}"


def _waiting(lock: Path, root: Path) -> Callable[[ownfiles.Holder], None]:
    def say(holder: ownfiles.Holder) -> None:
        print(
            f"{lock}: held by {holder} (another fa build or fa index writing into {root}); waiting up "
            f"to {LOCK_WAIT_S:g} s for it",
            file=sys.stderr,
            flush=True,
        )

    return say


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[dict[str, list[str]]]:
    """The record, read and then saved under the folder's lock (two builds into one --out). A lock
    held by another process: said on stderr at once, waited for LOCK_WAIT_S, then FaError naming it."""
    lock = _own_path(root, f"{RECORD}.lock")
    try:
        with ownfiles.locked(lock, timeout=LOCK_WAIT_S, waiting=_waiting(lock, root)):
            files = written(root)
            yield files
            ownfiles.write_atomic(
                _record_path(root), (json.dumps({"files": files}, indent=2, sort_keys=True) + "\n").encode()
            )
    except ownfiles.Held as exc:
        raise FaError(_refused(exc, root)) from None
    except ownfiles.Refused as exc:
        raise OutFileError(_refused(exc, root)) from None
    except OSError as exc:
        raise atomic.WriteError(_record_path(root), exc) from None


def inside(root: Path, rel: str) -> Path:
    """root/rel, refused if any part of it below `root` is a symbolic link: fa writes only inside the
    folder it was given, and does not follow a `simple/` or `logs/` that points elsewhere."""
    path = root
    for part in Path(rel).parts:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break
        except NotADirectoryError:
            raise OutFileError(
                f"{path.parent}: not a folder, where fa writes {rel}\n  fix: move it out of {root}, then "
                "re-run (or pass another --out)"
            ) from None
        except OSError as exc:
            raise OutFileError(f"{path}: cannot look at it ({exc.strerror})") from None
        if stat.S_ISLNK(mode):
            raise OutFileError(
                f"{path}: a symbolic link (to {os.readlink(path)}); fa writes only inside {root} and does "
                "not follow links there; fix: replace the link with a folder or file, or pass another --out"
            )
    return root / rel


def own(root: Path, rel: str) -> bool:
    """True when root/rel is absent, or holds exactly what fa last wrote there (its sha256 recorded)."""
    path = inside(root, rel)
    if not path.exists():
        return True
    recorded = written(root).get(rel)
    return recorded is not None and path.is_file() and sha256_file(path) in recorded


def made_by_fa(path: Path) -> bool:
    """Whether the file at `path`, though not in this folder's record, is one fa makes in a wheel folder
    (a shard's index.json or pages, copied in with its wheels): an index.json of fa's schema, or a page
    carrying GENERATOR_MARK. A user's own simple/index.html (their other projects' index) is not."""
    try:
        data = ownfiles.read_bytes(path, limit=MAX_RECORD_BYTES)
    except (OSError, ownfiles.Refused):
        return False
    if path.suffix == ".html":
        return GENERATOR_MARK in data
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    return isinstance(doc, dict) and "schema" in doc and isinstance(doc.get("wheels"), list)


def claim(root: Path, rel: str, *, take_over: bool = False) -> Path:
    """root/rel, which fa may now replace; OutFileError when fa did not write what is there. With
    `take_over` (`fa index DIR`, asked to rewrite the index), also a file fa made elsewhere
    (made_by_fa: a shard's, copied in)."""
    path = inside(root, rel)
    if own(root, rel) or (take_over and path.is_file() and made_by_fa(path)):
        return path
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file (a FIFO, a device?)"
        raise OutFileError(
            f"{path}: {kind}, where fa writes a file of its own; left as it is\n  fix: move it out of "
            f"{root}, then re-run (or pass another --out)"
        )
    if rel not in written(root):
        problem = "fa did not write it (it is not in the record of what fa wrote here"
        problem += ", nor a file fa makes)" if take_over else ")"
    else:
        problem = "it changed since fa wrote it (its sha256 is not the one fa recorded)"
    raise OutFileError(
        f"{path}: {problem}, so fa will not overwrite it; fix: move it out of {root}, or pass another --out"
    )


def set_aside_if_changed(root: Path, rel: str) -> Path | None:
    """A file fa wrote at root/rel that changed since (a tampered wheel) renamed, in the same folder,
    to `<rel>.fa-changed-<its sha256's first 12>`: kept for inspection, out of the way of the file fa is
    about to write again (a name fa index does not list). Returns where it went (None: nothing to do).
    A file fa did not write is never moved (claim refuses it)."""
    path = inside(root, rel)
    recorded = written(root).get(rel)
    if recorded is None or not path.is_file() or path.is_symlink():
        return None
    digest = sha256_file(path)
    if digest in recorded:
        return None
    aside = inside(root, f"{rel}{CHANGED_MARK}{digest[:12]}")
    if os.path.lexists(aside):
        raise OutFileError(
            f"{path}: changed since fa wrote it, and {aside.name} is already in the way of setting it "
            f"aside\n  fix: move both out of {root}, then re-run"
        )
    os.rename(path, aside)
    print(
        f"{path}: changed since fa wrote it (sha256 {digest}, fa wrote {recorded[-1]}); set aside as "
        f"{aside.name}, and written again",
        file=sys.stderr,
        flush=True,
    )
    return aside


def note(root: Path, rel: str, sha256: str, *, pending: bool = False) -> None:
    """Records that fa wrote `sha256` at rel; `pending` keeps the previous hash too, for a rename
    that a kill may yet stop."""
    with _locked(root) as files:
        files[rel] = [*files.get(rel, [])[-1:], sha256] if pending else [sha256]


@contextlib.contextmanager
def writing(root: Path, rel: str, *, take_over: bool = False) -> Iterator[Path]:
    """atomic.writing for root/rel, recorded: refused unless fa wrote what is there (or, with
    `take_over`, for `fa index DIR`, which is asked to rewrite the index, fa made it elsewhere)."""
    path = claim(root, rel, take_over=take_over)
    atomic.ensure_dir(path.parent)
    inside(root, rel)  # the folders just made are ours; anything else in the way was checked above
    with atomic.writing(path) as tmp:
        yield tmp
        digest = sha256_file(tmp)
        note(root, rel, digest, pending=True)
    note(root, rel, digest)


def _holds(root: Path, rel: str, data: bytes) -> bool:
    """Whether root/rel is a file fa wrote (in the record) holding exactly `data`."""
    path = inside(root, rel)
    digest = hashlib.sha256(data).hexdigest()
    return path.is_file() and digest in written(root).get(rel, []) and sha256_file(path) == digest


def write_text(root: Path, rel: str, text: str, *, take_over: bool = False) -> Path:
    """root/rel holding `text`, recorded; left untouched (file and record) when fa wrote that text there
    already: a build with nothing changed rewrites no log or page (issue 37)."""
    if _holds(root, rel, text.encode("utf-8")):
        return root / rel
    with writing(root, rel, take_over=take_over) as tmp:
        try:
            with tmp.open("w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise atomic.WriteError(root / rel, exc) from exc
    return root / rel


def write_json(root: Path, rel: str, obj: object, *, take_over: bool = False) -> Path:
    return write_text(root, rel, json.dumps(obj, indent=2, sort_keys=True) + "\n", take_over=take_over)


def check_kept(root: Path, rel: str, sha256: str) -> None:
    """A file fa indexes without writing it (a wheel of an earlier build, or one copied in): if fa
    wrote it, it must still be what fa wrote; a link is not followed."""
    path = inside(root, rel)
    recorded = written(root).get(rel)
    if recorded is not None and sha256 not in recorded:
        raise OutFileError(
            f"{path}: changed since fa wrote it (sha256 {sha256}, fa wrote {recorded[-1]}); refusing to "
            f"index it; fix: move it out of {root} and re-run (fa build writes it again)"
        )
