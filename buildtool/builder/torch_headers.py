"""torch's C++ headers for building the binding, without downloading torch.

A torch wheel is a zip of up to ~2.5 GB of which `torch/include/` is a few tens of MB. We read the
zip's central directory from the end of the remote file with HTTP Range requests, then fetch only the
byte ranges of the include members (adjacent members coalesced into a few requests), inflate them
and check each member's CRC-32. The wheel's own sha256 cannot be checked without the whole file, so
the per-member CRC-32 (and TLS to PyPI) is what we verify; we say so rather than pretend otherwise.
A server that ignores Range gets a full download (with progress) and the same extraction.

The extracted tree is cached per torch version and appears atomically (temp dir + rename, under a
lock). `local_torch()` finds the installed torch's own headers without importing torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from buildtool.core import atomic, cache, fetch
from buildtool.core.cpus import linux_cpu
from buildtool.core.installed import find_torch
from buildtool.errors import FaError

if TYPE_CHECKING:
    from buildtool.builder.pypi import TorchFile

PREFIX = "torch/include/"
TAIL_BYTES = 1 << 16  # EOCD (22 bytes + comment <= 64 KiB) and, usually, the zip64 locator
MAX_GAP = 1 << 20  # fetch across gaps up to this size rather than open another request


class HeaderError(FaError):
    """torch headers that could not be fetched or failed their checks."""


@dataclass(frozen=True)
class Headers:
    """An include tree for one torch version: `include` is the directory holding `torch/`, `ATen/`."""

    torch_version: str
    include: Path
    origin: str  # where the headers came from (wheel file name, or "installed")

    @property
    def include_dirs(self) -> tuple[Path, Path]:
        return self.include, self.include / "torch" / "csrc" / "api" / "include"


@dataclass(frozen=True)
class _Member:
    name: str
    method: int  # 0 stored, 8 deflate
    crc: int
    csize: int
    usize: int
    offset: int  # of the local header
    end: int  # where the next member (or the central directory) starts


def local_torch() -> tuple[str, Headers]:
    """The installed torch's version and include tree, found without importing torch."""
    root = find_torch()
    if root is None:
        raise HeaderError("torch is not installed here (`fa build --local` builds for the installed torch)")
    include = root / "include"
    if not (include / "torch").is_dir():
        raise HeaderError(f"{include} has no torch headers (a torch build without C++ headers?)")
    version = importlib.metadata.version("torch")
    return version, Headers(version, include, "installed")


def headers_for(torch_version: str, source: TorchFile, progress: fetch.ProgressHook | None = None) -> Headers:
    """The include tree of `torch_version`, from `source` (a wheel on PyPI), cached per CPU: the
    headers of one version are nearly the same on every CPU, but the binding is built against the
    ones of the wheels its users install."""
    cpu = linux_cpu(source.platform_tag) or source.platform_tag
    final = cache.cache_dir() / "torch-headers" / cpu / torch_version
    if (final / "torch").is_dir():
        return Headers(torch_version, final, source.filename)
    with cache.locked(final):
        if not (final / "torch").is_dir():
            for p in final.parent.glob(final.name + atomic.TMP_MARK + "*"):
                shutil.rmtree(p, ignore_errors=True)
            tmp = atomic.make_temp_dir(final)
            try:
                extract_include(source.url, source.size, tmp, progress)
                os.replace(tmp / "torch" / "include", final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return Headers(torch_version, final, source.filename)


def extract_include(
    url: str, size: int | None, dest: Path, progress: fetch.ProgressHook | None = None
) -> int:
    """Write every `torch/include/` member of the remote wheel under `dest`; returns how many."""
    n = extract_members(url, size, dest, lambda name: name.startswith(PREFIX), progress)
    if n == 0:
        raise HeaderError(f"{url} has no {PREFIX} members")
    return n


def extract_members(
    url: str,
    size: int | None,
    dest: Path,
    wanted: Callable[[str], bool],
    progress: fetch.ProgressHook | None = None,
) -> int:
    """Write the members of the remote wheel whose names `wanted` accepts under `dest` (their paths
    kept), reading only their byte ranges; returns how many."""
    size = size or fetch.content_length(url)
    tail_start = max(0, size - TAIL_BYTES)
    tail, ranged = fetch.read_range(url, tail_start, size)
    if not ranged:
        return _extract_full(url, size, dest, wanted, progress)
    members = _central_directory(url, tail, tail_start)
    chosen = [m for m in members if wanted(m.name) and not m.name.endswith("/")]
    total = sum(m.end - m.offset for m in chosen)
    done = 0
    for group in _coalesce(chosen):
        start, end = group[0].offset, group[-1].end
        blob, ok = fetch.read_range(url, start, end)
        if not ok:
            raise HeaderError(f"{url}: the server stopped honouring Range requests")
        for m in group:
            _write_member(m, blob, m.offset - start, dest)
        done += sum(m.end - m.offset for m in group)
        if progress:
            progress(done, total)
    return len(chosen)


def _central_directory(url: str, tail: bytes, tail_start: int) -> list[_Member]:
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise HeaderError(f"{url}: no end-of-central-directory record (not a zip?)")
    (count, cd_size, cd_offset) = struct.unpack_from("<10xHII", tail, eocd)
    if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        loc = eocd - 20
        if loc < 0 or tail[loc : loc + 4] != b"PK\x06\x07":
            raise HeaderError(f"{url}: zip64 locator missing")
        (z64_off,) = struct.unpack_from("<8xQ", tail, loc)
        rec = _slice(url, tail, tail_start, z64_off, 56)
        if rec[:4] != b"PK\x06\x06":
            raise HeaderError(f"{url}: bad zip64 end record")
        count, cd_size, cd_offset = struct.unpack_from("<32xQQQ", rec)
    cd = _slice(url, tail, tail_start, cd_offset, cd_size)
    raw: list[tuple[str, int, int, int, int, int]] = []
    pos = 0
    for _ in range(count):
        if cd[pos : pos + 4] != b"PK\x01\x02":
            raise HeaderError(f"{url}: corrupt central directory at entry {len(raw)}")
        (method, crc, csize, usize, nlen, xlen, clen, offset) = struct.unpack_from(
            "<10xH4xIIIHHH8xI", cd, pos
        )
        name = cd[pos + 46 : pos + 46 + nlen].decode()
        extra = cd[pos + 46 + nlen : pos + 46 + nlen + xlen]
        usize, csize, offset = _zip64_sizes(extra, usize, csize, offset)
        raw.append((name, method, crc, csize, usize, offset))
        pos += 46 + nlen + xlen + clen
    raw.sort(key=lambda r: r[5])
    ends = [r[5] for r in raw[1:]] + [cd_offset]
    return [_Member(*r, end=e) for r, e in zip(raw, ends, strict=True)]


def _zip64_sizes(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, ln = struct.unpack_from("<HH", extra, pos)
        if tag == 0x0001:
            vals = list(struct.unpack_from(f"<{ln // 8}Q", extra, pos + 4))
            if usize == 0xFFFFFFFF:
                usize = vals.pop(0)
            if csize == 0xFFFFFFFF:
                csize = vals.pop(0)
            if offset == 0xFFFFFFFF:
                offset = vals.pop(0)
        pos += 4 + ln
    return usize, csize, offset


def _slice(url: str, tail: bytes, tail_start: int, start: int, length: int) -> bytes:
    """Bytes [start, start+length) of the remote file, from the tail we hold or a new request."""
    if start >= tail_start:
        return tail[start - tail_start : start - tail_start + length]
    data, ok = fetch.read_range(url, start, start + length)
    if not ok:
        raise HeaderError(f"{url}: the server stopped honouring Range requests")
    return data


def _coalesce(members: list[_Member]) -> list[list[_Member]]:
    groups: list[list[_Member]] = []
    for m in sorted(members, key=lambda m: m.offset):
        if groups and m.offset - groups[-1][-1].end <= MAX_GAP:
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def _write_member(m: _Member, blob: bytes, at: int, dest: Path) -> None:
    if blob[at : at + 4] != b"PK\x03\x04":
        raise HeaderError(f"{m.name}: no local header where the central directory says")
    nlen, xlen = struct.unpack_from("<HH", blob, at + 26)
    data = blob[at + 30 + nlen + xlen : at + 30 + nlen + xlen + m.csize]
    if m.method == 8:
        data = zlib.decompress(data, -15)
    elif m.method != 0:
        raise HeaderError(f"{m.name}: unsupported zip compression method {m.method}")
    if len(data) != m.usize or zlib.crc32(data) != m.crc:
        raise HeaderError(f"{m.name}: CRC-32 or size mismatch (corrupt download); retry the build")
    out = _safe_path(dest, m.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)


def _safe_path(dest: Path, name: str) -> Path:
    out = (dest / name).resolve()
    if not out.is_relative_to(dest.resolve()):
        raise HeaderError(f"refusing zip member outside the tree: {name}")
    return out


def _extract_full(
    url: str, size: int, dest: Path, wanted: Callable[[str], bool], progress: fetch.ProgressHook | None
) -> int:
    """The server ignored Range: download the whole wheel (once, temporarily) and extract."""
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        whl = fetch.download(url, Path(tmp) / "torch.whl", None, progress, size=size)
        n = 0
        with zipfile.ZipFile(whl) as zf:
            for info in zf.infolist():
                if wanted(info.filename) and not info.is_dir():
                    out = _safe_path(dest, info.filename)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(zf.read(info))  # zipfile checks the CRC-32
                    n += 1
    return n
