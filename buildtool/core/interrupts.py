"""SIGINT and SIGTERM as an exception that fa can clean up after, and sections they cannot cut.

Python's default SIGTERM ends the process on the spot (no `finally` runs), and its SIGINT can strike
between two renames that belong together. Inside `handling_signals()` both raise `Interrupted` in
the main thread, so cleanup code runs; inside `deferred()` they are only recorded, and the code says
where it may stop (`raise_if_interrupted()`). A second signal while the first is being handled is
recorded and ignored: the cleanup it would cut short takes milliseconds, and SIGKILL, which nothing
can catch, is what the journal (compat/install_txn.py) is for.

Exit status of an interrupted command: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM),
as shells report a process killed by that signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM arrived; `state` is what the interrupted work left (set by who cleaned up).
    A KeyboardInterrupt, so `except Exception` blocks never swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.state = ""

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    deferring = 0
    pending: int | None = None
    raised = False


def _handler(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001 (signal's signature)
    if _State.pending is None:
        _State.pending = signum
    if _State.deferring or _State.raised:
        return
    _State.raised = True
    raise Interrupted(signum)


@contextlib.contextmanager
def handling_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted for the duration (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, _handler) for s in HANDLED}
    _State.pending, _State.raised, _State.deferring = None, False, 0
    try:
        yield
    finally:
        for s, old in before.items():
            signal.signal(s, old)


@contextlib.contextmanager
def deferred(raise_at_end: bool = True) -> Iterator[None]:
    """A section SIGINT and SIGTERM do not cut: they are recorded, and raised at its end (or earlier,
    at a `raise_if_interrupted()`); with raise_at_end=False left for the caller to raise, with the
    state it knows."""
    _State.deferring += 1
    try:
        yield
    finally:
        _State.deferring -= 1
    if raise_at_end:
        raise_if_interrupted()


def raise_if_interrupted(state: str = "") -> None:
    """Raise Interrupted here, its `state` set, if a signal arrived during a deferred section and
    nothing raised it yet."""
    if _State.pending is not None and not _State.raised:
        _State.raised = True
        error = Interrupted(_State.pending)
        error.state = state
        raise error


def pending() -> int | None:
    """The signal received, if any (whether or not it was raised yet)."""
    return _State.pending
