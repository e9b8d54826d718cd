"""Toolkit fetching: pinned hashes enforced (a tampered download is refused), one unpack under a lock
even with concurrent builds, and the real CUDA 12 NVRTC wheel from PyPI."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from range_server import serve

from buildtool.builder import toolkits
from buildtool.builder.nvrtc import open_nvrtc
from buildtool.core import cpus, cuda_facts

FAKE_MAJOR = 99
FAKE_FILE = "fake_nvrtc-1.0-py3-none-manylinux_2_17_x86_64.whl"


def _fake_wheel(lib_subdir: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{lib_subdir}/libnvrtc.so.99", b"not really a library")
        zf.writestr("fake_nvrtc-1.0.dist-info/METADATA", "Name: fake-nvrtc\n")
    return buf.getvalue()


@pytest.fixture
def fake_toolkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[cuda_facts.Toolkit, bytes, Path]:
    """A pinned toolkit entry for a tiny wheel served from a local PEP 503 index."""
    data = _fake_wheel("nvidia/fake/lib")
    tk = replace(
        cuda_facts.TOOLKITS[12],
        major=FAKE_MAJOR,
        package="fake-nvrtc",
        version="1.0",
        wheels={cpus.host(): cuda_facts.PinnedWheel(FAKE_FILE, hashlib.sha256(data).hexdigest())},
        lib_subdir="nvidia/fake/lib",
    )
    monkeypatch.setitem(cuda_facts.TOOLKITS, FAKE_MAJOR, tk)
    monkeypatch.setenv("FA_CACHE", str(tmp_path / "cache"))
    www = tmp_path / "www"
    (www / "simple" / tk.package).mkdir(parents=True)
    return tk, data, www


def _publish(www: Path, tk: cuda_facts.Toolkit, data: bytes) -> None:
    (www / "files").mkdir(exist_ok=True)
    (www / "files" / FAKE_FILE).write_bytes(data)
    page = f'<a href="../../files/{FAKE_FILE}#sha256={hashlib.sha256(data).hexdigest()}">{FAKE_FILE}</a>'
    (www / "simple" / tk.package / "index.html").write_text(page)


def test_pinned_wheel_is_fetched_checked_and_unpacked(fake_toolkit, monkeypatch):
    tk, data, www = fake_toolkit
    _publish(www, tk, data)
    url, server = serve(www)
    monkeypatch.setenv("FA_PYPI_SIMPLE", f"{url}/simple")
    try:
        lib = toolkits.nvrtc_lib_dir(FAKE_MAJOR)
    finally:
        server.shutdown()
    assert lib.name == "lib"
    assert (lib / "libnvrtc.so.99").read_bytes() == b"not really a library"
    assert toolkits.is_unpacked(FAKE_MAJOR)
    # served from the cache now: a dead index must not matter
    monkeypatch.setenv("FA_PYPI_SIMPLE", "http://127.0.0.1:9/simple")
    assert toolkits.nvrtc_lib_dir(FAKE_MAJOR) == lib


def test_tampered_download_is_refused(fake_toolkit, monkeypatch):
    tk, data, www = fake_toolkit
    _publish(www, tk, data[:-1] + b"X")  # same name, one byte changed
    url, server = serve(www)
    monkeypatch.setenv("FA_PYPI_SIMPLE", f"{url}/simple")
    try:
        with pytest.raises(toolkits.ToolkitError, match="does not match the pinned"):
            toolkits.nvrtc_lib_dir(FAKE_MAJOR)
    finally:
        server.shutdown()
    root = Path(toolkits.cache.cache_dir()) / "toolkits"
    assert not (root / "downloads" / FAKE_FILE).exists()  # nothing kept under the final name
    assert not toolkits.is_unpacked(FAKE_MAJOR)


def test_tampered_local_wheelhouse_is_refused(fake_toolkit, tmp_path, monkeypatch):
    _tk, data, _ = fake_toolkit
    house = tmp_path / "house"
    house.mkdir()
    (house / FAKE_FILE).write_bytes(b"PK" + data[2:-4] + b"oops")
    monkeypatch.setenv("FA_TOOLKIT_WHEELS", str(house))
    with pytest.raises(toolkits.ToolkitError, match="sha256"):
        toolkits.nvrtc_lib_dir(FAKE_MAJOR)


def test_unknown_major_names_the_known_ones():
    with pytest.raises(toolkits.ToolkitError, match="known: 11, 12, 13"):
        toolkits.toolkit(7)


def _unpack_in_child(house: str, q: multiprocessing.Queue) -> None:
    import os

    os.environ["FA_TOOLKIT_WHEELS"] = house
    q.put(str(toolkits.nvrtc_lib_dir(FAKE_MAJOR)))


def test_concurrent_builds_unpack_once_without_corruption(fake_toolkit, tmp_path):
    _tk, data, _ = fake_toolkit
    house = tmp_path / "house"
    house.mkdir()
    (house / FAKE_FILE).write_bytes(data)
    ctx = multiprocessing.get_context("fork")  # children inherit the patched pin table
    q: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_unpack_in_child, args=(str(house), q)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    dirs = {q.get(timeout=5) for _ in procs}
    assert len(dirs) == 1
    lib = Path(dirs.pop())
    assert sorted(x.name for x in lib.iterdir()) == ["libnvrtc.so.99"]
    leftovers = list((lib.parents[3]).glob("*.fa-tmp-*"))
    assert leftovers == []


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.usefixtures("build_cache")
def test_real_cuda12_nvrtc_from_pypi():
    lib = toolkits.nvrtc_lib_dir(12)
    nv = open_nvrtc(str(lib))
    assert nv.version == (12, 9)
    assert 80 in nv.supported_archs()


def test_an_arm_host_gets_the_arm_nvrtc(monkeypatch):
    monkeypatch.setattr(cpus.platform, "machine", lambda: "arm64")
    pin = toolkits.pinned_wheel(cuda_facts.TOOLKITS[12])
    assert pin.file.endswith("_aarch64.whl")
    assert len(pin.sha256) == 64


def test_a_host_without_an_nvrtc_wheel_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(cpus.platform, "machine", lambda: "riscv64")
    with pytest.raises(toolkits.ToolkitError, match=r"no nvidia-cuda-nvrtc-cu12==12.9.86 wheel for riscv64"):
        toolkits.pinned_wheel(cuda_facts.TOOLKITS[12])
