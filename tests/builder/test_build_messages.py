"""What fa build used to do silently or say unclearly: a mirror in FA_PYPI_SIMPLE ignored by the torch
catalog (so a mirror-only network could not plan), a damaged cached catalog reported as missing, and
`--jobs 1000` starting a worker per program on 2 cores."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildtool.builder.compile import usable_workers
from buildtool.builder.pypi import SIMPLE_URL, CatalogError, fetch_torch_catalog
from buildtool.cli import app
from buildtool.core import fetch
from tests.hostile import small_filesystem

DATA = Path(__file__).parent / "data"


@pytest.fixture
def simple_json() -> dict:
    return json.loads((DATA / "torch_simple.json").read_text())


def test_the_catalog_reads_the_mirror_in_fa_pypi_simple(tmp_path, simple_json, monkeypatch):
    asked: list[str] = []

    def read(url: str, _headers: dict[str, str]) -> bytes:
        asked.append(url)
        return json.dumps(simple_json).encode()

    cache = tmp_path / "torch.json"
    cache.write_text(json.dumps(simple_json))  # PyPI's answer, cached a moment ago
    monkeypatch.setenv("FA_PYPI_SIMPLE", "https://mirror.example/pypi/simple/")
    assert "2.4" in fetch_torch_catalog(read=read, cache_file=cache).minors
    assert asked == ["https://mirror.example/pypi/simple/torch/"]  # not PyPI's cached answer
    fetch_torch_catalog(read=read, cache_file=cache)
    assert len(asked) == 1  # the mirror's answer is cached in turn
    monkeypatch.delenv("FA_PYPI_SIMPLE")
    fetch_torch_catalog(read=read, cache_file=cache)
    assert asked[-1] == SIMPLE_URL


def test_a_damaged_cached_catalog_is_called_damaged(tmp_path):
    def offline(url: str, _headers: dict[str, str]) -> bytes:
        raise fetch.FetchError(f"cannot fetch {url}: [Errno -3] Temporary failure in name resolution")

    cache = tmp_path / "torch.json"
    cache.write_text('{"files": [')
    with pytest.raises(CatalogError) as info:
        fetch_torch_catalog(read=offline, cache_file=cache)
    assert "is damaged (not JSON; delete it)" in info.value.problem
    assert str(cache) in info.value.problem
    cache.write_text(json.dumps({"files": []}))
    old = time.time() - 30 * 24 * 3600
    os.utime(cache, (old, old))
    assert fetch_torch_catalog(read=offline, cache_file=cache).minors == {}  # stale but whole: used


def test_jobs_are_capped_at_the_cpus(tmp_path, monkeypatch, simple_json):
    assert usable_workers(1000) <= (os.cpu_count() or 1)
    assert usable_workers(1) == 1
    monkeypatch.setenv("FA_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "pypi").mkdir(parents=True)
    (tmp_path / "cache" / "pypi" / "torch.json").write_text(json.dumps(simple_json))
    matrix = tmp_path / "m.yaml"
    matrix.write_text('torch: ["2.6"]\ncuda: [12]\npython: ["3.12"]\n')
    result = CliRunner().invoke(app, ["build", "--dry-run", "--jobs", "1000", "-m", str(matrix)])
    assert result.exit_code == 0, result.output
    assert f"--jobs 1000: {usable_workers(1000)} CPUs here" in result.stderr


@pytest.mark.parametrize("text", ["9" * 5000 + "/1", "١/٢", "1/0", "-1/2", "1/2/3", "\x1b[2J1/2"])
def test_a_shard_that_is_not_k_of_n_is_named(text):
    from buildtool.builder.plan import parse_shard
    from buildtool.errors import UsageError

    with pytest.raises(UsageError) as err:
        parse_shard(text)
    assert "--shard" in str(err.value)
    assert len(str(err.value)) < 300
    assert "\x1b" not in str(err.value)


def test_a_full_cache_does_not_fail_the_catalog_it_could_not_keep(tmp_path, simple_json, caplog):
    """Round three: with FA_CACHE on a full disk, `fa build --dry-run` failed (exit 1) after reading the
    torch catalog, because caching it failed; the cache is an optimisation. A real full file system."""
    with small_filesystem(tmp_path / "full", "64k") as mount:
        with contextlib.suppress(OSError):  # full, whatever tmpfs rounds the size to
            (mount / "filler").write_bytes(b"\0" * (64 << 10))
        cache = mount / "pypi" / "torch.json"

        def read(_url: str, _headers: dict[str, str]) -> bytes:
            return json.dumps(simple_json).encode()

        catalog = fetch_torch_catalog(read=read, cache_file=cache)
        assert "2.4" in catalog.minors
        assert not cache.exists()
        assert "the torch catalog is not cached" in caplog.text
        assert "No space left on device" in caplog.text
