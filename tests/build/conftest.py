"""Shared setup for the build tests.

One FA_CACHE per test session (`build_cache`), so the CUDA 12 NVRTC wheel is downloaded once per CI run
(set FA_TOOLKIT_WHEELS to a folder holding the pinned wheels to skip even that). `fixture_tree` is a
kernels/ tree with one trivial unit per arch (tests/build/fixture_kernels) plus the real runtime
package, so the machinery is tested without compiling real attention kernels.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from range_server import serve

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixture_kernels"


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("fa-cache")
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
