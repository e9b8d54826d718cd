"""torch headers by HTTP Range: only the include members are fetched (few requests), each CRC-checked;
a server ignoring Range gets a full download; a corrupted member is refused; the cache is per version."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from range_server import serve

from buildtool.builder import torch_headers
from buildtool.builder.pypi import TorchFile
from buildtool.core import fetch

MEMBERS = {
    "torch/__init__.py": b"# python side\n" * 500,
    "torch/include/torch/library.h": b"// library\n" * 300,
    "torch/include/ATen/ATen.h": b"#pragma once\n",
    "torch/include/c10/util/Exception.h": b"// stored, not deflated\n",
    "torch/lib/libtorch_cpu.so": bytes(range(256)) * 400,
    "torch-2.5.0.dist-info/RECORD": b"...\n",
}


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in MEMBERS.items():
            method = zipfile.ZIP_STORED if "Exception" in name else zipfile.ZIP_DEFLATED
            zf.writestr(zipfile.ZipInfo(name), data, compress_type=method)
    return path


def _count_ranges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    real = fetch.read_range

    def spy(url: str, start: int, end: int) -> tuple[bytes, bool]:
        calls.append((start, end))
        return real(url, start, end)

    monkeypatch.setattr(fetch, "read_range", spy)
    return calls


def _include_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_range_reads_fetch_only_include_members(http_dir, tmp_path, monkeypatch):
    www, url = http_dir
    whl = _wheel(www / "torch-2.5.0-cp310-cp310-manylinux1_x86_64.whl")
    calls = _count_ranges(monkeypatch)
    dest = tmp_path / "out"
    dest.mkdir()
    n = torch_headers.extract_include(f"{url}/{whl.name}", whl.stat().st_size, dest)
    assert n == 3
    want = {k: v for k, v in MEMBERS.items() if k.startswith("torch/include/")}
    assert _include_files(dest) == want
    assert len(calls) == 2  # the tail (directory), then one coalesced range for the includes
    fetched = sum(e - s for s, e in calls[1:])
    assert fetched < whl.stat().st_size // 4  # the big library member was not downloaded


def test_server_ignoring_range_falls_back_to_full_download(tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    whl = _wheel(www / "torch.whl")
    url, server = serve(www, ignore_range=True)
    seen: list[int] = []
    try:
        dest = tmp_path / "out"
        dest.mkdir()
        n = torch_headers.extract_include(f"{url}/torch.whl", None, dest, lambda d, _t: seen.append(d))
    finally:
        server.shutdown()
    assert n == 3
    assert seen
    assert seen[-1] == whl.stat().st_size
    assert set(_include_files(dest)) == {k for k in MEMBERS if k.startswith("torch/include/")}


def test_corrupted_member_is_refused(http_dir, tmp_path):
    www, url = http_dir
    whl = _wheel(www / "torch.whl")
    data = bytearray(whl.read_bytes())
    at = data.index(b"// stored, not deflated")  # a stored member: flip a byte of its data
    data[at] ^= 0x20
    whl.write_bytes(bytes(data))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(torch_headers.HeaderError, match="CRC-32"):
        torch_headers.extract_include(f"{url}/torch.whl", len(data), dest)


@pytest.mark.usefixtures("fresh_cache")
def test_headers_are_cached_per_version(http_dir, monkeypatch):
    www, url = http_dir
    whl = _wheel(www / "torch.whl")
    src = TorchFile(whl.name, f"{url}/{whl.name}", "0" * 64, whl.stat().st_size, "cp310", "manylinux1_x86_64")
    h = torch_headers.headers_for("2.5.0", src)
    assert (h.include / "torch" / "library.h").is_file()
    assert h.include_dirs[1] == h.include / "torch" / "csrc" / "api" / "include"
    calls = _count_ranges(monkeypatch)
    assert torch_headers.headers_for("2.5.0", src) == h
    assert calls == []


def test_local_torch_headers_found_without_import():
    version, h = torch_headers.local_torch()
    assert version.startswith("2.")
    assert (h.include / "torch" / "library.h").is_file()
