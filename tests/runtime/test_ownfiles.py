"""fa_attn/ownfiles.py, the one rule for fa's own files, against each hazard a careless or hostile
environment puts in a file's place: a symlink, a FIFO, /dev/zero, deep JSON, another user's file or
folder, a lock someone holds, a folder. Each is refused with the path and a reason, and left as it was;
nothing hangs, and nothing raises MemoryError or RecursionError. The per-file-kind tests (journal,
install lock, .fa-written.json, pins, manifests) are beside their callers."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import fa_attn.ownfiles as shipped
import pytest

from buildtool.core.runtime import ownfiles

Refused = ownfiles.Refused
OTHER_UID = 12345  # a user that is neither this one nor root


def test_buildtool_and_the_runtime_share_one_module():
    assert Path(ownfiles.__file__).resolve() == Path(shipped.__file__).resolve()


def test_a_regular_file_reads_writes_and_locks(tmp_path: Path):
    path = tmp_path / "own.json"
    ownfiles.write_atomic(path, b'\xef\xbb\xbf{"a": [1, {"b": "[[[["}]}')
    assert ownfiles.read_json(path, limit=100, max_depth=3) == {"a": [1, {"b": "[[[["}]}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    with ownfiles.locked(tmp_path / "own.lock", timeout=0):
        assert (tmp_path / "own.lock").read_text().startswith(f"{os.getpid()} ")
    assert [p.name for p in tmp_path.iterdir() if ".fa-tmp-" in p.name] == []


def test_a_symlink_is_never_followed(tmp_path: Path):
    target = tmp_path / "users-file"
    target.write_text('{"mine": true}')
    link = tmp_path / "own.json"
    link.symlink_to(target)
    for call in (
        lambda: ownfiles.read_json(link, limit=100),
        lambda: ownfiles.write_atomic(link, b"{}"),
        lambda: ownfiles.locked(link, timeout=0).__enter__(),
    ):
        with pytest.raises(Refused, match="symbolic link") as caught:
            call()
        assert caught.value.path == link
    assert target.read_text() == '{"mine": true}'
    assert link.is_symlink()


def test_a_symlinked_folder_of_fas_is_never_entered(tmp_path: Path):
    users = tmp_path / "users-folder"
    users.mkdir()
    (users / "journal.json").write_text("{}")
    own = tmp_path / ".fa-attn-install"
    own.symlink_to(users)
    with pytest.raises(Refused, match="symbolic link") as caught:
        ownfiles.read_json(own / "journal.json", limit=100)
    assert caught.value.path == own
    with pytest.raises(Refused, match="symbolic link"):
        ownfiles.write_atomic(own / "journal.json", b"[]")
    with pytest.raises(Refused, match="symbolic link"):
        ownfiles.locked(own / "lock", timeout=0).__enter__()
    assert sorted(p.name for p in users.iterdir()) == ["journal.json"]


def test_a_fifo_is_refused_without_hanging(tmp_path: Path):
    fifo = tmp_path / "own.json"
    os.mkfifo(fifo)
    with pytest.raises(Refused, match="FIFO"):
        ownfiles.read_json(fifo, limit=100)
    with pytest.raises(Refused, match="FIFO"):
        ownfiles.write_atomic(fifo, b"{}")
    with pytest.raises(Refused, match="FIFO"):
        ownfiles.locked(fifo, timeout=0).__enter__()
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_dev_zero_is_refused_not_read():
    with pytest.raises(Refused, match="device"):
        ownfiles.read_bytes("/dev/zero", limit=1 << 20)


def test_size_is_capped_before_reading(tmp_path: Path):
    big = tmp_path / "own.json"
    big.write_bytes(b" " * 4097)
    with pytest.raises(Refused, match="more than the 4096"):
        ownfiles.read_bytes(big, limit=4096)


def test_deep_json_is_refused_before_parsing(tmp_path: Path):
    deep = tmp_path / "own.json"
    deep.write_bytes(b"[" * 100_000)
    with pytest.raises(Refused, match="100000 levels deep"):
        ownfiles.read_json(deep, limit=1 << 20)
    deep.write_bytes(b'{"a": ' * 65 + b"1" + b"}" * 65)
    with pytest.raises(Refused, match="65 levels deep, more than the 64"):
        ownfiles.read_json(deep, limit=1 << 20)


def test_not_json_is_refused(tmp_path: Path):
    path = tmp_path / "own.json"
    for data in (b"{not json", b"\xff\xfe{}"):
        path.write_bytes(data)
        with pytest.raises(Refused, match=r"not JSON|not UTF-8"):
            ownfiles.read_json(path, limit=100)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_file_is_refused_where_it_matters(tmp_path: Path):
    path = tmp_path / "own.json"
    path.write_text("{}")
    os.chown(path, OTHER_UID, OTHER_UID)
    assert ownfiles.read_json(path, limit=100) == {}  # a manifest: whoever installed it
    with pytest.raises(Refused, match=f"uid {OTHER_UID}"):
        ownfiles.read_json(path, limit=100, private=True)  # a record, a journal: not another's word
    os.chown(path, 0, 0)
    path.chmod(0o666)
    with pytest.raises(Refused, match="writable by other users"):
        ownfiles.read_json(path, limit=100, private=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_another_users_folder_is_never_used(tmp_path: Path):
    folder = tmp_path / "theirs"
    folder.mkdir()
    (folder / "own.json").write_text("{}")
    os.chown(folder, OTHER_UID, OTHER_UID)
    for call in (
        lambda: ownfiles.read_json(folder / "own.json", limit=100),
        lambda: ownfiles.write_atomic(folder / "own.json", b"[]"),
        lambda: ownfiles.locked(folder / "lock", timeout=0).__enter__(),
    ):
        with pytest.raises(Refused, match=f"belongs to .*uid {OTHER_UID}") as caught:
            call()
        assert caught.value.path == folder
    assert (folder / "own.json").read_text() == "{}"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_a_root_owned_folder_is_trusted_by_another_user():
    """As a real other user (setpriv): root's folders (site-packages) are fine, its own file too."""
    folder = Path(tempfile.mkdtemp(prefix="fa-ownfiles-"))  # pytest's tmp_path is 0700, root's only
    folder.chmod(0o755)
    (folder / "manifest.json").write_text('{"ok": 1}')
    # The module as the other user can read it: the checkout may lie under a folder only root enters
    # (a clone in `mktemp -d`, 0700), which would fail this test on the import, not on what it checks.
    code = folder / "code"
    code.mkdir(mode=0o755)
    shutil.copy(ownfiles.__file__, code / "ownfiles.py")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(code)!r})
        import ownfiles
        print(ownfiles.read_json({str(folder / "manifest.json")!r}, limit=100)["ok"])
        """
    )
    try:
        got = subprocess.run(
            ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
             sys.executable, "-I", "-c", script],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(folder)
    assert (got.returncode, got.stdout.strip()) == (0, "1"), got.stderr


def test_a_folder_in_place_of_a_file_is_refused_and_kept(tmp_path: Path):
    folder = tmp_path / "own.lock"
    (folder / "inside").mkdir(parents=True)
    with pytest.raises(Refused, match="is a folder") as caught:
        ownfiles.locked(folder, timeout=0).__enter__()
    assert caught.value.path == folder
    with pytest.raises(Refused, match="is a folder"):
        ownfiles.read_bytes(folder, limit=100)
    with pytest.raises(Refused, match="is a folder"):
        ownfiles.write_atomic(folder, b"{}")
    assert (folder / "inside").is_dir()


def test_a_held_lock_names_its_holder_and_gives_up(tmp_path: Path):
    lock = tmp_path / "own.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(Path(ownfiles.__file__).parent)!r})
            import ownfiles
            with ownfiles.locked({str(lock)!r}, timeout=0):
                print("held", flush=True)
                time.sleep(60)
            """
        ), "holder-argument"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        told: list[str] = []
        with (
            pytest.raises(Refused, match=f"held by pid {holder.pid} .*still after 0.3 s") as caught,
            ownfiles.locked(lock, timeout=0.3, waiting=told.append),
        ):
            pass
        assert caught.value.path == lock
        assert "holder-argument" in caught.value.reason
        assert [t.pid for t in told] == [holder.pid]
        assert ownfiles.held_by(lock) == caught.value.holder
    finally:
        holder.kill()
        holder.wait()
    assert ownfiles.held_by(lock) is None  # the kernel dropped the dead holder's lock
    with ownfiles.locked(lock, timeout=1):
        pass
