"""Atomic writes and the sweep of a killed writer's leftovers: only fa's own temporaries, only dead
writers', only in the folder being written, never through a symlink; and write errors that name the
file and the fix instead of a bare "[Errno 28]"."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from buildtool.core import atomic, cache
from buildtool.errors import UsageError


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _tmp_name(target: str, pid: int) -> str:
    return f"{target}{atomic.TMP_MARK}{pid}-abcd_123"


def test_sweep_removes_only_a_dead_writers_temporaries(tmp_path: Path):
    dead = _dead_pid()
    stale = tmp_path / _tmp_name("fa_attn-0.1.0-py3-none-any.whl", dead)
    live = tmp_path / _tmp_name("index.json", os.getppid())  # a build still running
    mine = tmp_path / _tmp_name("index.json", os.getpid())
    users = [
        tmp_path / "draft.tmp-v2",  # the user's, with a look-alike name
        tmp_path / "notes.whl.tmp-abc",  # the old, looser naming: not provably ours
        tmp_path / f"x.fa-tmp-{dead}-short",  # not mkstemp's shape
    ]
    for p in [stale, live, mine, *users]:
        p.write_text("x")
    assert atomic.sweep_stale(tmp_path) == [stale]
    assert all(p.exists() for p in [live, mine, *users])


def test_sweep_is_not_recursive_and_follows_no_symlink(tmp_path: Path):
    dead = _dead_pid()
    sub = tmp_path / "docs"
    sub.mkdir()
    nested = sub / _tmp_name("a.whl", dead)
    nested.write_text("a user's folder below --out")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    precious = elsewhere / "precious"
    precious.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "link").symlink_to(sub, target_is_directory=True)
    (out / _tmp_name("b.whl", dead)).symlink_to(precious)  # a symlink shaped like a temporary
    assert atomic.sweep_stale(out) == []
    assert nested.exists()
    assert precious.read_text() == "keep"


def test_sweep_removes_an_old_temporary_whose_pid_was_reused(tmp_path: Path):
    old = tmp_path / _tmp_name("index.json", os.getppid())
    old.write_text("x")
    long_ago = time.time() - atomic.STALE_AFTER_S - 60
    os.utime(old, (long_ago, long_ago))
    assert atomic.sweep_stale(tmp_path) == [old]


def test_a_write_sweeps_the_leftovers_of_its_own_name_only(tmp_path: Path):
    dead = _dead_pid()
    same = tmp_path / _tmp_name("index.json", dead)
    other = tmp_path / _tmp_name("other.json", dead)
    same.write_text("x")
    other.write_text("x")
    atomic.write_text(tmp_path / "index.json", "{}")
    assert not same.exists()
    assert other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["index.json", other.name])


def test_a_full_disk_names_the_file_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    target = tmp_path / "wheels" / "index.json"
    with pytest.raises(atomic.WriteError) as err:
        atomic.write_text(target, "{}")
    assert str(target) in str(err.value)
    assert "No space left on device" in str(err.value)
    assert "free some space" in str(err.value)
    assert list(target.parent.iterdir()) == []  # no temporary left behind


def test_a_file_where_a_folder_belongs_names_the_path(tmp_path: Path):
    blocker = tmp_path / "wheels"
    blocker.write_text("not a folder")
    with pytest.raises(atomic.WriteError) as err:
        atomic.write_text(blocker / "simple" / "index.html", "")
    assert str(blocker) in str(err.value)
    assert "fix:" in str(err.value)


def test_fa_cache_that_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FA_CACHE", str(blocker))
    with pytest.raises(UsageError) as err:  # exit 2: the user's to fix
        cache.cache_dir()
    assert "FA_CACHE" in str(err.value)
    assert str(blocker) in str(err.value)
    assert "File exists" in str(err.value)
    assert "fix:" in str(err.value)
