"""One `fa install` into one environment: a lock, a journal, and renames that can be undone.

Everything lives in `<site-packages>/.fa-attn-install/` (on the file system it installs into, so every
step is a rename, and nothing in TMPDIR):

    lock           flock'd for the whole install: one fa install per environment at a time (the kernel
                   drops the lock when its holder dies, kill -9 included); holds the holder's pid
    journal.json   written (atomically) before the environment changes: the phase and every rename
    work/          this install's downloaded wheel, pip's scratch install (stage/), the previous
                   fa-attn moved aside (old/), and the installer's TMPDIR (tmp/)
    trash-*        a work/ being deleted (renamed first, so a half-deleted work/ is never read)

The environment changes only by renaming whole top-level folders (`fa_attn/`, `fa_attn-<v>.dist-info/`):
first the previous install's out to work/old/, then the new one's in from work/stage/. Between two
renames a kill leaves a state the journal describes, and the next `fa install` (under the lock) undoes
the renames that happened, in reverse, before anything else: an install that did not reach
`committed` is rolled back, one that did is finished (its saved copy deleted). Each undo is a rename
that checks where the folder is now, so recovering twice, or being killed while recovering, is safe.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from buildtool.core import interrupts
from buildtool.core.runtime import ownfiles
from buildtool.errors import FaError

TXN_DIR = ".fa-attn-install"
LOCK_FILE = "lock"
JOURNAL_FILE = "journal.json"
WORK_DIR = "work"
_TRASH = "trash-"
PHASES = ("swap", "committed")  # swap: renames may have begun; committed: checked, keep it
# The signal tests stop fa at a named step (SIGSTOP) and deliver a real signal there; nothing else
# reads this variable (tests/select/test_install_signals.py).
STOP_AT_ENV = "FA_INSTALL_STOP_AT"
# A journal lists a few renames of a few paths: 1 MiB is far past any fa writes.
JOURNAL_MAX_BYTES = 1 << 20
# The folders fa moves: the package and its .dist-info (a PEP 440 version, as a wheel name spells it).
_OWN_TOP = re.compile(r"fa_attn|fa_attn-[A-Za-z0-9.+!_]+\.dist-info", re.ASCII)
# Where a move's work/ end is: the previous install set aside, or the trial install.
_WORK_ENDS = ("old", "stage")


class TxnError(FaError):
    """The transaction folder cannot be used (unwritable, damaged journal, another install); exit 1."""


@dataclass(frozen=True)
class Move:
    src: Path
    dst: Path


@dataclass(frozen=True)
class Journal:
    pid: int
    phase: str
    wheel: str  # the file being installed
    version: str  # the fa-attn version being installed
    previous: str | None  # the fa-attn version it replaces
    moves: tuple[Move, ...]  # in the order they are made

    def to_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "phase": self.phase,
            "wheel": self.wheel,
            "version": self.version,
            "previous": self.previous,
            "moves": [[str(m.src), str(m.dst)] for m in self.moves],
        }

    @staticmethod
    def from_json(data: object) -> Journal:
        if not isinstance(data, dict) or data.get("phase") not in PHASES:
            raise ValueError("not a journal fa wrote")
        moves = data["moves"]
        if not isinstance(moves, list) or not all(
            isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m) for m in moves
        ):
            raise ValueError("moves: not a list of [from, to] paths")
        previous = data["previous"]
        return Journal(
            pid=int(data["pid"]),
            phase=str(data["phase"]),
            wheel=str(data["wheel"]),
            version=str(data["version"]),
            previous=None if previous is None else str(previous),
            moves=tuple(Move(Path(a), Path(b)) for a, b in moves),
        )


def txn_root(packages: Path) -> Path:
    return packages / TXN_DIR


def checkpoint(step: str) -> None:
    """A named step of the install, where the signal tests stop fa to deliver their signal."""
    if os.environ.get(STOP_AT_ENV) == step:
        os.kill(os.getpid(), signal.SIGSTOP)


def _unwritable(path: Path, exc: OSError) -> TxnError:
    return TxnError(
        f"cannot write {path}: {exc.strerror or exc}; nothing installed\n"
        f"  fix: install as a user who can write {path.parent} (its owner), or into a virtual "
        "environment you own (python -m venv --system-site-packages DIR, then DIR/bin/fa install)"
    )


def _refused(exc: ownfiles.Refused, what: str) -> TxnError:
    return TxnError(f"{exc.path}: {exc.problem}; {what}\n  fix: {exc.fix}")


@contextlib.contextmanager
def locked(packages: Path, wait_s: float, say: Callable[[str], None]) -> Iterator[Path]:
    """Hold the environment's install lock; yields the transaction folder. Another holder: say so and
    wait up to `wait_s` seconds, then raise TxnError (nothing changed). The folder and the lock are
    fa's own files (ownfiles): a link, another user's folder or a non-file there is refused, untouched."""
    root = txn_root(packages)
    try:
        root.mkdir(exist_ok=True)
    except FileExistsError:
        pass  # a file, a link or a FIFO in its place: the lock below names it
    except OSError as exc:
        raise _unwritable(root, exc) from None

    def waiting(holder: ownfiles.Holder) -> None:
        say(
            f"another fa install ({_pid(holder)}) is installing into {packages}; "
            f"waiting up to {wait_s:g} s for it (Ctrl-C stops)"
        )

    try:
        with ownfiles.locked(root / LOCK_FILE, timeout=max(wait_s, 0), waiting=waiting):
            yield root
    except ownfiles.Held as exc:
        if wait_s <= 0:
            raise TxnError(
                f"another fa install ({_pid(exc.holder)}) is installing into {packages}; nothing changed\n"
                "  fix: wait for it to finish, or pass --wait SECONDS to wait for it"
            ) from None
        raise TxnError(
            f"gave up after {wait_s:g} s: another fa install ({_pid(exc.holder)}) still holds "
            f"{root / LOCK_FILE}; nothing changed\n  fix: wait for it to finish, or re-run "
            "with a larger --wait"
        ) from None
    except ownfiles.Refused as exc:
        raise _refused(exc, "nothing changed") from None
    except OSError as exc:
        raise _unwritable(root, exc) from None


def _pid(holder: ownfiles.Holder) -> str:
    return "pid unknown" if holder.pid is None else f"pid {holder.pid}"


def unfinished(packages: Path) -> str | None:
    """What a reader (fa doctor) should know of the environment's install state, changing nothing:
    an install running now, or one interrupted that the next fa install will put right."""
    root = txn_root(packages)
    try:
        holder = ownfiles.held_by(root / LOCK_FILE)
    except ownfiles.Refused as exc:
        return f"fa install will refuse to install here: {exc.path}: {exc.reason}"
    except OSError:
        return None  # no fa install ever ran here (or the folder cannot be read)
    if holder is not None:
        return f"an fa install ({_pid(holder)}) is changing fa-attn in {packages} right now"
    left = os.path.lexists(root / JOURNAL_FILE) or os.path.lexists(root / WORK_DIR)
    if not left:
        return None
    return (
        f"an fa install into {packages} was interrupted; the next fa install rolls it back (or finishes "
        "it) before anything else"
    )


def write_journal(root: Path, journal: Journal) -> None:
    path = root / JOURNAL_FILE
    try:
        ownfiles.write_atomic(path, (json.dumps(journal.to_json(), indent=2) + "\n").encode())
    except ownfiles.Refused as exc:
        raise _refused(exc, "nothing installed") from None
    except OSError as exc:
        raise TxnError(f"cannot write {path}: {exc.strerror or exc}; nothing installed") from None


def _journal_fix(path: Path) -> str:
    return f"  fix: check that `import fa_attn` works (or pip uninstall fa-attn), then move {path} away"


def read_journal(root: Path) -> Journal | None:
    """The journal, read as fa's own file (ownfiles: a regular file of this user's, at most 1 MiB);
    anything else raises TxnError naming it, and it is left where it is for inspection."""
    path = root / JOURNAL_FILE
    try:
        return Journal.from_json(ownfiles.read_json(path, limit=JOURNAL_MAX_BYTES, private=True))
    except FileNotFoundError:
        return None
    except ownfiles.Refused as exc:
        raise TxnError(
            f"{exc.path}: {exc.problem}, so fa cannot tell what an interrupted install changed; "
            f"nothing changed\n{_journal_fix(path)}"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TxnError(
            f"{path}: unreadable ({exc}), so fa cannot tell what an interrupted install changed\n"
            f"{_journal_fix(path)}"
        ) from None


def swap(moves: tuple[Move, ...], step: str) -> None:
    """Make the renames in order; a SIGINT/SIGTERM during them is raised between two renames (the
    caller then undoes what was done). A folder already in a move's place is never overwritten."""
    for i, move in enumerate(moves, 1):
        with interrupts.deferred():
            if os.path.lexists(move.dst):
                raise FileExistsError(errno.EEXIST, "in the way", str(move.dst))
            os.rename(move.src, move.dst)
        checkpoint(f"{step}-{i}")
        interrupts.raise_if_interrupted()


def undo(moves: tuple[Move, ...]) -> None:
    """Undo the renames that were made, last first; a move not made (its source still there) is skipped."""
    for move in reversed(moves):
        # A source folder that is gone (work/ deleted) means this undo already happened: the folder at
        # dst is then the one put back, not one to move away.
        if os.path.lexists(move.dst) and not os.path.lexists(move.src) and move.src.parent.is_dir():
            os.rename(move.dst, move.src)


def discard(root: Path, name: str = WORK_DIR) -> None:
    """Delete a work folder: renamed to trash-* first (one step), so it is never half there."""
    work = root / name
    if os.path.lexists(work):
        trash = root / f"{_TRASH}{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(work, trash)
        shutil.rmtree(trash, ignore_errors=True)


def stray_move(root: Path, sites: tuple[Path, ...], moves: tuple[Move, ...]) -> Move | None:
    """The first move fa never makes (None: all are fa's). fa's moves: the package or its .dist-info
    (same name at both ends) between a site folder (`sites`: where the environment keeps packages) and
    work/old or work/stage of the transaction folder `root`, one end in each, named as written (no
    "..")."""
    homes = {p.resolve() for p in sites}
    work = {(root / WORK_DIR / end).resolve() for end in _WORK_ENDS}
    for move in moves:
        ends = (move.src, move.dst)
        names_ok = move.src.name == move.dst.name and _OWN_TOP.fullmatch(move.src.name) is not None
        # The folder each end sits in, resolved; the end itself is never resolved (it may be a link
        # to be moved as it is).
        parents = [p.parent.resolve() for p in ends]
        plain = all(".." not in p.parts and p.is_absolute() for p in ends)
        in_site = [parent in homes for parent in parents]
        in_work = [parent in work for parent in parents]
        one_each = sorted(in_site) == [False, True] and in_work == [not s for s in in_site]
        if not (names_ok and plain and one_each):
            return move
    return None


def finish_or_roll_back(root: Path, sites: tuple[Path, ...]) -> str | None:
    """What an interrupted install left, put right: undone unless it had committed, then its work
    folder removed. `sites` are the environment's package folders, the only places outside `root` a
    journal may move folders to or from. Returns what was done, for the person to read (None: nothing
    was left)."""
    journal = read_journal(root)
    stray = None if journal is None else stray_move(root, sites, journal.moves)
    if stray is not None:  # not written by fa: neither followed nor deleted
        raise TxnError(
            f"{root / JOURNAL_FILE}: moves {stray.src} to {stray.dst}, which fa never does; not followed, "
            f"nothing changed, the journal kept for inspection\n{_journal_fix(root / JOURNAL_FILE)}"
        )
    leftovers = [p for p in root.iterdir() if p.name == WORK_DIR or p.name.startswith(_TRASH)]
    if journal is None:
        if not leftovers:
            return None
        for path in leftovers:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
        return "removed the leftovers of an interrupted fa install (it had not changed the environment)"
    who = f"an interrupted fa install (pid {journal.pid}) of fa-attn {journal.version}"
    before = f"fa-attn {journal.previous}" if journal.previous else "no fa-attn"
    if journal.phase == "committed":
        said = f"finished {who}: it had completed its checks, so it stays installed"
    else:
        undo(journal.moves)
        said = f"rolled back {who}: {before} is installed again, as before it"
        (root / JOURNAL_FILE).unlink()  # first: work/ without a journal is only leftovers
    discard(root)
    (root / JOURNAL_FILE).unlink(missing_ok=True)
    for path in root.iterdir():
        if path.name.startswith(_TRASH) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
    return said
