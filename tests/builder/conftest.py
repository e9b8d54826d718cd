"""Shared setup for the build tests.

One FA_CACHE per test session (`build_cache`) whose download folders are the user's own (FA_CACHE or
~/.cache/fa), so NVRTC wheels and torch headers are fetched once per machine, not per run. `fixture_tree` is a
kernels/ tree with one trivial unit per arch (tests/builder/fixture_kernels) plus the real runtime
package, so the machinery is tested without compiling real attention kernels.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from range_server import serve

from buildtool.core import cache

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixture_kernels"


# Downloads only (NVRTC wheels, torch headers, the aarch64 torch libraries of test_aarch64): shared with
# the user's cache, so a machine fetches them once, not once per test run. Compiled images, bindings and
# the PyPI catalog stay per session, so the tests see cold compiles.
SHARED_DOWNLOADS = ("toolkits", "torch-headers", "test-torch")


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("fa-cache")
    for name in SHARED_DOWNLOADS:
        (cache.cache_dir() / name).mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(cache.cache_dir() / name)
    old = os.environ.get("FA_CACHE")
    os.environ["FA_CACHE"] = str(root)
    yield root
    if old is None:
        os.environ.pop("FA_CACHE", None)
    else:
        os.environ["FA_CACHE"] = old


@pytest.fixture(scope="session")
def fixture_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kernels")
    shutil.copytree(FIXTURE, root, dirs_exist_ok=True)
    shutil.copy(REPO / "kernels" / "csrc" / "params.h", root / "csrc" / "params.h")  # the real struct
    shutil.copytree(
        REPO / "kernels" / "fa_attn", root / "fa_attn", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


@pytest.fixture
def broken_tree(tmp_path: Path, fixture_tree: Path) -> Path:
    """The fixture tree with a kernel that calls a function no header declares (an NVRTC error)."""
    broken = tmp_path / "kernels"
    shutil.copytree(fixture_tree, broken)
    tiny = broken / "csrc" / "tiny.cu"
    tiny.write_text(tiny.read_text().replace("fa_scale(", "no_such_function("))
    return broken


def fa_command(*args: str) -> list[str]:
    """`fa ARGS` as a child process of this checkout's buildtool."""
    return [sys.executable, "-m", "buildtool.cli", *args]


def pip_download(dest: Path, *args: str) -> list[str]:
    """The files the real pip downloads into `dest` for ARGS (an index or folder and a requirement),
    without dependencies; the user's pip configuration and cache are left out, so only the index under
    test answers."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"},
    )
    assert done.returncode == 0, done.stderr
    return sorted(p.name for p in dest.iterdir())


@pytest.fixture
def fresh_cache(tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache for one test that shares the session's unpacked toolkits (no re-download)."""
    root = tmp_path / "cache"
    root.mkdir()
    (build_cache / "toolkits").mkdir(exist_ok=True)
    (root / "toolkits").symlink_to(build_cache / "toolkits")
    monkeypatch.setenv("FA_CACHE", str(root))
    return root


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A served folder honouring Range: (folder, base URL)."""
    root = tmp_path / "www"
    root.mkdir()
    url, server = serve(root)
    yield root, url
    server.shutdown()
