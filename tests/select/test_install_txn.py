"""The transaction folder's own rules, in-process: a journal fa did not write is not followed, undoing
is idempotent, and the lock is exclusive (the end-to-end runs are in test_install_signals.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from buildtool.compat import install_txn
from buildtool.compat.install_txn import Journal, Move, TxnError
from tests.hostile import OTHER_UID, OWN_FILE_HAZARDS, plant


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
        install_txn.finish_or_roll_back(root, (root.parent,))
    assert victim.is_dir()


def test_a_damaged_journal_names_itself_and_the_fix(tmp_path: Path):
    root = _root(tmp_path)
    (root / install_txn.JOURNAL_FILE).write_text("{not json")
    with pytest.raises(TxnError, match=r"journal\.json: is not JSON") as caught:
        install_txn.finish_or_roll_back(root, (root.parent,))
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
    said = install_txn.finish_or_roll_back(root, (root.parent,))
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


def test_a_journal_move_with_one_end_outside_the_environment_is_not_followed(tmp_path: Path):
    """Round three: a move out of the transaction folder to a user's folder of fa's name was accepted
    (one end inside), and rolling back renamed that folder into work/, which was then deleted."""
    root = _root(tmp_path)
    site = root.parent
    users = tmp_path / "home" / "fa_attn"
    users.mkdir(parents=True)
    (users / "notes.txt").write_text("mine\n")
    for moves in (
        (Move(root / install_txn.WORK_DIR / "old" / "fa_attn", users),),
        (Move(users, root / install_txn.WORK_DIR / "old" / "fa_attn"),),
        (Move(site / "fa_attn", root / "elsewhere" / "fa_attn"),),  # not a folder fa moves through
        (Move(site / "fa_attn", site / "fa_attn"),),  # both in the environment: not a move fa makes
        (Move(site / "x" / "fa_attn", root / install_txn.WORK_DIR / "old" / "fa_attn"),),
        (Move(site / "fa_attn-1/../x.dist-info", root / install_txn.WORK_DIR / "stage" / "x.dist-info"),),
    ):
        install_txn.write_journal(root, _journal(moves))
        with pytest.raises(TxnError, match="which fa never does") as caught:
            install_txn.finish_or_roll_back(root, (site,))
        assert "fix: " in str(caught.value)
        assert (users / "notes.txt").read_text() == "mine\n"
        assert (root / install_txn.JOURNAL_FILE).is_file()  # kept for inspection


def test_a_journal_of_the_real_moves_is_followed(tmp_path: Path):
    root = _root(tmp_path)
    site, purelib = root.parent, tmp_path / "purelib"
    purelib.mkdir()
    (root / install_txn.WORK_DIR / "stage" / "fa_attn-0.2.0+cu12.dist-info").mkdir(parents=True)
    moves = (
        Move(site / "fa_attn", root / install_txn.WORK_DIR / "old" / "fa_attn"),
        Move(
            root / install_txn.WORK_DIR / "stage" / "fa_attn-0.2.0+cu12.dist-info",
            purelib / "fa_attn-0.2.0+cu12.dist-info",
        ),
    )
    install_txn.write_journal(root, _journal(moves))
    install_txn.swap(moves[1:], "in")
    assert install_txn.finish_or_roll_back(root, (site, purelib)) is not None
    assert not (purelib / "fa_attn-0.2.0+cu12.dist-info").exists()


@pytest.mark.parametrize("hazard", OWN_FILE_HAZARDS)
def test_the_journal_is_read_only_as_fas_own_file(tmp_path: Path, hazard: str):
    root = _root(tmp_path)
    intact = plant(root / install_txn.JOURNAL_FILE, hazard)
    with pytest.raises(TxnError, match=r"journal\.json") as caught:
        install_txn.finish_or_roll_back(root, (root.parent,))
    assert "fix: " in str(caught.value)
    intact()
    assert (root / install_txn.WORK_DIR / "old").is_dir()


def test_a_symlinked_transaction_folder_is_never_entered(tmp_path: Path):
    """Round three: `.fa-attn-install` linking to a user's folder had that folder's work/ deleted as
    "the leftovers of an interrupted fa install"."""
    site = tmp_path / "site-packages"
    site.mkdir()
    users = tmp_path / "users-folder"
    (users / install_txn.WORK_DIR).mkdir(parents=True)
    (users / install_txn.WORK_DIR / "thesis.tex").write_text("chapter 1\n")
    (site / install_txn.TXN_DIR).symlink_to(users)
    with pytest.raises(TxnError, match=r"symbolic link") as caught, install_txn.locked(site, 0, print):
        pass
    assert "fix: " in str(caught.value)
    assert (users / install_txn.WORK_DIR / "thesis.tex").read_text() == "chapter 1\n"
    assert sorted(p.name for p in users.iterdir()) == [install_txn.WORK_DIR]
    assert "symbolic link" in (install_txn.unfinished(site) or "")


@pytest.mark.parametrize("hazard", ["fifo", "dev_zero", "foreign-folder", "file"])
def test_something_else_in_place_of_the_transaction_folder_is_refused(tmp_path: Path, hazard: str):
    site = tmp_path / "site-packages"
    txn = site / install_txn.TXN_DIR
    site.mkdir()
    if hazard == "foreign-folder":
        txn.mkdir()
        os.chown(txn, OTHER_UID, OTHER_UID)
    elif hazard == "file":
        txn.write_text("a user's file\n")
    else:
        plant(txn, hazard)
    before = txn.lstat()
    with pytest.raises(TxnError, match=str(txn)) as caught, install_txn.locked(site, 0, print):
        pass
    assert "fix: " in str(caught.value)
    assert (txn.lstat().st_mode, txn.lstat().st_uid) == (before.st_mode, before.st_uid)


@pytest.mark.parametrize("hazard", OWN_FILE_HAZARDS)
def test_the_install_lock_is_only_ever_fas_own_file(tmp_path: Path, hazard: str):
    """Round three: a symlinked lock was opened through the link and truncated, so the user's file then
    held fa's pid."""
    site = tmp_path / "site-packages"
    lock = site / install_txn.TXN_DIR / install_txn.LOCK_FILE
    intact = plant(lock, hazard)
    if hazard == "deep":  # any bytes are a lock's: it is a regular file of this user's
        with install_txn.locked(site, 0, print):
            pass
        return
    with pytest.raises(TxnError, match=str(lock)) as caught, install_txn.locked(site, 0, print):
        pass
    assert "fix: " in str(caught.value)
    intact()


@pytest.mark.parametrize("installed", ["not-a-version", "0.3.0.dev-x_y"])
def test_an_installed_version_fa_cannot_compare_is_not_replaced_silently(installed: str):
    """Round three: an installed version PEP 440 cannot read was replaced without a word, whatever the
    new one was (a silent downgrade path); now it needs --allow-downgrade."""
    from buildtool.compat import install
    from buildtool.compat.wheel_index import entry_from_dict
    from tests.select.fixture_index import kernel_entry

    entry = entry_from_dict(kernel_entry(12, "2.8", True), "entry")
    with pytest.raises(install.InstallError, match="cannot be compared") as caught:
        install._refuse_older(installed, entry)
    assert "fix: pass --allow-downgrade" in str(caught.value)
    install._refuse_older(entry.info.version, entry)  # the same version: not a downgrade
