"""The compile cache's locks (buildtool/core/cache.py) are ownfiles' locks: a build that finds one held by
another process says at once who holds it (pid, command, since when) instead of waiting silently, then
goes on when the holder lets go. Two real processes share one FA_CACHE here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from buildtool.core import cache
from buildtool.core.runtime import ownfiles
from buildtool.errors import UsageError

REPO = Path(__file__).resolve().parents[2]

# One process of a build: takes cache.locked(KEY) under FA_CACHE, says "held", and keeps the lock until
# its standard input closes.
TAKE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from buildtool.core import cache
    with cache.locked(cache.cache_dir() / "locks" / "kernels" / sys.argv[1]):
        print("held", flush=True)
        sys.stdin.read()
    print("released", flush=True)
    """
)


def _take(fa_cache: Path, key: str, *extra: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "FA_CACHE": str(fa_cache),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels")]),
    }
    return subprocess.Popen(
        [sys.executable, "-c", TAKE, key, *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_a_waiting_build_names_who_holds_the_cache_lock(tmp_path: Path):
    holder = _take(tmp_path, "k1", "the-first-build")
    waiter = None
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        lock = tmp_path / "locks" / "kernels" / "k1.lock"
        since = time.strftime("%H:%M:%S", time.localtime(lock.stat().st_mtime))
        waiter = _take(tmp_path, "k1")
        assert waiter.stderr is not None
        said = waiter.stderr.readline()  # said while the holder still holds it
        assert holder.poll() is None
        assert str(lock) in said
        assert f"held by pid {holder.pid} (" in said
        assert "the-first-build" in said
        assert f"since {since}" in said
        assert re.search(r"\(\d+ s ago\)", said)
        assert "waiting" in said
        now = ownfiles.held_by(lock)
        assert now is not None
        assert now.pid == holder.pid
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
        out, err = waiter.communicate("", timeout=60)
        assert out == "held\nreleased\n"
        assert waiter.returncode == 0, err
    finally:
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_a_free_cache_lock_is_taken_without_a_word(tmp_path: Path):
    taker = _take(tmp_path, "k2")
    out, err = taker.communicate("", timeout=60)
    assert (out, err, taker.returncode) == ("held\nreleased\n", "", 0)
    # The lock file stays (fa's own, in FA_CACHE) and is free again.
    assert ownfiles.held_by(tmp_path / "locks" / "kernels" / "k2.lock") is None


def test_a_link_in_place_of_the_lock_is_refused_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FA_CACHE", str(tmp_path))
    target = tmp_path / "elsewhere"
    target.write_text("not fa's\n")
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "k3.lock").symlink_to(target)
    with pytest.raises(UsageError, match=r"k3\.lock: is a symbolic link") as refused:
        cache.locked(tmp_path / "locks" / "k3").__enter__()
    assert refused.value.exit_code == 2
    assert target.read_text() == "not fa's\n"
    assert (tmp_path / "locks" / "k3.lock").is_symlink()
