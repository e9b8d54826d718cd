"""The transaction folder's own rules, in-process: a journal fa did not write is not followed, undoing
is idempotent, and the lock is exclusive (the end-to-end runs are in test_install_signals.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from buildtool.compat import install_txn
from buildtool.compat.install_txn import Journal, Move, TxnError


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages" / install_txn.TXN_DIR
    (root / install_txn.WORK_DIR / "old").mkdir(parents=True)
    return root


def _journal(moves: tuple[Move, ...], phase: str = "swap") -> Journal:
    return Journal(pid=1, phase=phase, wheel="w.whl", version="0.2.0", previous="0.1.0", moves=moves)


def test_a_journal_moving_anything_but_fa_attn_is_not_followed(tmp_path: Path):
    root = _root(tmp_path)
    victim = tmp_path / "important"
    victim.mkdir()
    install_txn.write_journal(
        root, _journal((Move(victim, root / install_txn.WORK_DIR / "old" / "important"),))
    )
    with pytest.raises(TxnError, match="which fa never does"):
        install_txn.finish_or_roll_back(root)
    assert victim.is_dir()


def test_a_damaged_journal_names_itself_and_the_fix(tmp_path: Path):
    root = _root(tmp_path)
    (root / install_txn.JOURNAL_FILE).write_text("{not json")
    with pytest.raises(TxnError, match=r"journal\.json: unreadable") as caught:
        install_txn.finish_or_roll_back(root)
    assert "fix: check that `import fa_attn` works" in str(caught.value)


def test_undo_puts_back_what_was_moved_and_twice_is_harmless(tmp_path: Path):
    root = _root(tmp_path)
    site = root.parent
    (site / "fa_attn").mkdir()
    (site / "fa_attn" / "__init__.py").write_text("old = True\n")
    stage = root / install_txn.WORK_DIR / "stage"
    (stage / "fa_attn").mkdir(parents=True)
    moves = (
        Move(site / "fa_attn", root / install_txn.WORK_DIR / "old" / "fa_attn"),
        Move(stage / "fa_attn", site / "fa_attn"),
    )
    install_txn.write_journal(root, _journal(moves))
    install_txn.swap(moves[:1], "out")  # killed after the first rename
    said = install_txn.finish_or_roll_back(root)
    assert said is not None
    assert said.startswith("rolled back")
    assert (site / "fa_attn" / "__init__.py").read_text() == "old = True\n"
    assert list(root.iterdir()) == []
    install_txn.undo(moves)  # nothing left to undo
    assert (site / "fa_attn" / "__init__.py").read_text() == "old = True\n"


def test_the_lock_is_exclusive_and_says_who_holds_it(tmp_path: Path):
    site = tmp_path / "site-packages"
    site.mkdir()
    said: list[str] = []
    with install_txn.locked(site, 0, said.append):
        busy = pytest.raises(TxnError, match=r"another fa install \(pid \d+\) is installing into")
        with busy, install_txn.locked(site, 0, said.append):
            pass
        with (
            pytest.raises(TxnError, match=r"gave up after 0\.3 s"),
            install_txn.locked(site, 0.3, said.append),
        ):
            pass
    assert said == [
        f"another fa install (pid {os.getpid()}) is installing into {site}; waiting up to 0.3 s for it (Ctrl-C stops)"
    ]
    with install_txn.locked(site, 0, said.append):  # free again
        pass
