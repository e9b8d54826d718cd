"""What an fa-attn wheel may contain, checked before an installer sees it.

A correct sha256 says the wheel is the one the index names, not that the index is honest: a wheel can
carry files for `torch/` or another distribution's folders, scripts for the environment's `bin/`
(`.data/scripts`), a `.pth` that runs at every interpreter start, links, `../` paths, or a member
that unpacks to gigabytes. fa's own wheels hold `fa_attn/` and their `.dist-info` and nothing else,
so that is all a wheel may hold:

- every member under `fa_attn/` or `fa_attn-<version>.dist-info/` (the version of the file name), as
  a relative path of plain parts: no `/` or drive at the start, no `\\`, no `..`, no empty part, no
  control character, no name twice; no `.pth`; regular files and folders only (no links, no devices);
- RECORD lists every member (but itself and its signatures) with its sha256 and size, and nothing
  else, and each member's bytes match it;
- the file name's tags are the index entry's;
- at most MAX_MEMBERS members, MAX_MEMBER_BYTES each and MAX_TOTAL_BYTES together unpacked, and no
  member above RATIO_FLOOR_BYTES that unpacks to more than MAX_RATIO times its packed size.

Name, version and tags of METADATA and WHEEL against the file name and the index entry are checked
where the wheel is fetched (core/wheel_file.py, compat/wheel_index.py).
"""

from __future__ import annotations

import base64
import csv
import email.parser
import hashlib
import io
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from buildtool.core.runtime import schema
from buildtool.core.textfile import shown
from buildtool.errors import FaError

PACKAGE_DIR = "fa_attn"
# fa's wheels: a few hundred members, 3.3 MiB packed (cu12/cu13), the largest member (a binding or a
# kernel image) a few MiB. The caps leave room for growth and none for a zip bomb.
MAX_MEMBERS = 20_000
MAX_MEMBER_BYTES = 256 << 20
MAX_TOTAL_BYTES = 2 << 30
MAX_RATIO = 200  # machine code and JSON deflate far less; a zip bomb, 1000 to 1 and more
RATIO_FLOOR_BYTES = 1 << 20  # small members may compress far better (a file of spaces) and harm nothing
_SIGNATURES = ("RECORD.jws", "RECORD.p7s")
_CHUNK = 1 << 20


class HostileWheel(FaError):
    """A wheel holding something fa's wheels never hold; exit 1. The message names the member, and
    what the refusal left undone (`outcome`: nothing installed, nothing indexed)."""

    def __init__(self, head: str, outcome: str = "nothing installed") -> None:
        super().__init__(
            f"{head}; {outcome}\n  fix: install from an index you trust, or rebuild the wheel with fa build"
        )
        self.head = head

    def with_outcome(self, outcome: str) -> HostileWheel:
        return HostileWheel(self.head, outcome)


@dataclass(frozen=True)
class Contents:
    unpacked_bytes: int  # what installing it writes
    purelib: bool  # WHEEL's Root-Is-Purelib: where its files go


def check(wheel: Path, entry: schema.IndexEntry) -> Contents:
    """Raise HostileWheel unless `wheel` (already hash-checked against `entry`) holds only what an
    fa-attn wheel may hold."""
    try:
        _, version, _, tags = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise _refuse(wheel, None, f"not a wheel file name ({exc})") from None
    said = {f"{entry.python_tag}-{entry.abi_tag}-{entry.platform_tag}"}
    if {str(t) for t in tags} != said:
        raise _refuse(wheel, None, f"tagged {', '.join(sorted(map(str, tags)))}, the index says {said.pop()}")
    dist_info = f"{schema.DIST}-{version}.dist-info"
    try:
        with zipfile.ZipFile(wheel) as zf:
            infos = zf.infolist()
            _check_names(wheel, infos, dist_info)
            total = _check_sizes(wheel, infos)
            _check_record(wheel, zf, infos, dist_info)
            purelib = _root_is_purelib(zf, dist_info)
    except (OSError, zipfile.BadZipFile, EOFError, KeyError, ValueError, zlib.error) as exc:
        raise _refuse(wheel, None, f"unreadable as a zip archive ({exc})") from None
    return Contents(unpacked_bytes=total, purelib=purelib)


def _refuse(wheel: Path, member: str | None, problem: str) -> HostileWheel:
    where = f"{wheel.name}: {shown(member)}" if member is not None else wheel.name
    return HostileWheel(
        f"{where}: {problem}; refusing it (fa-attn wheels hold only {PACKAGE_DIR}/ and their .dist-info, "
        "each file listed in RECORD)"
    )


def _check_names(wheel: Path, infos: list[zipfile.ZipInfo], dist_info: str) -> None:
    if len(infos) > MAX_MEMBERS:
        raise _refuse(wheel, None, f"{len(infos)} members (at most {MAX_MEMBERS})")
    seen: set[str] = set()
    for info in infos:
        name = info.filename
        problem = _name_problem(name, dist_info) or _type_problem(info)
        if problem:
            raise _refuse(wheel, name, problem)
        key = name.rstrip("/")
        if key in seen:
            raise _refuse(wheel, name, "in the archive twice (an installer may write either copy)")
        seen.add(key)


def _name_problem(name: str, dist_info: str) -> str | None:
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if "\\" in name:
        return "a backslash in a member's path"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "a control character in a member's path"
    parts = name.rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "a path with an empty, '.' or '..' part"
    top = parts[0]
    if top.endswith(".data"):
        return (
            f"a .data folder (it installs into the environment's {_data_kind(parts)}, outside site-packages)"
        )
    if top not in (PACKAGE_DIR, dist_info):
        return f"outside {PACKAGE_DIR}/ and {dist_info}/ (it would write {shown(top)} into site-packages)"
    if parts[-1].endswith(".pth"):
        return "a .pth file (site-packages runs them at every interpreter start)"
    return None


def _data_kind(parts: list[str]) -> str:
    return f"{shown(parts[1])} folder" if len(parts) > 1 else "folders"


def _type_problem(info: zipfile.ZipInfo) -> str | None:
    mode = info.external_attr >> 16
    # No type bits (zip writers that set none, or only permissions): a plain file, as installers read it.
    if stat.S_IFMT(mode) == 0 or stat.S_ISREG(mode) or (stat.S_ISDIR(mode) and info.is_dir()):
        return None
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return f"not a regular file (mode {oct(mode)})"


def _check_sizes(wheel: Path, infos: list[zipfile.ZipInfo]) -> int:
    total = 0
    for info in infos:
        if info.file_size > MAX_MEMBER_BYTES:
            raise _refuse(
                wheel, info.filename, f"{info.file_size} bytes unpacked (at most {MAX_MEMBER_BYTES} a member)"
            )
        if info.file_size > RATIO_FLOOR_BYTES and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise _refuse(
                wheel,
                info.filename,
                f"{info.compress_size} bytes that unpack to {info.file_size} (more than {MAX_RATIO} times)",
            )
        total += info.file_size
    if total > MAX_TOTAL_BYTES:
        raise _refuse(wheel, None, f"{total} bytes unpacked (at most {MAX_TOTAL_BYTES})")
    return total


def _check_record(wheel: Path, zf: zipfile.ZipFile, infos: list[zipfile.ZipInfo], dist_info: str) -> None:
    record_name = f"{dist_info}/RECORD"
    if record_name not in zf.namelist():
        raise _refuse(wheel, record_name, "missing")
    listed = _read_record(wheel, zf, record_name)
    files = {i.filename: i for i in infos if not i.is_dir()}
    unsigned = {record_name} | {f"{dist_info}/{s}" for s in _SIGNATURES}
    for name in sorted(set(listed) - set(files) - {record_name}):
        raise _refuse(wheel, name, "listed in RECORD but not in the wheel")
    for name, info in sorted(files.items()):
        if name in unsigned:
            continue
        if name not in listed:
            raise _refuse(wheel, name, "not listed in RECORD")
        digest, size = listed[name]
        if size != info.file_size:
            raise _refuse(wheel, name, f"{info.file_size} bytes, but RECORD says {size}")
        if _sha256(zf, info) != digest:
            raise _refuse(wheel, name, "its bytes do not match RECORD's sha256")


def _read_record(wheel: Path, zf: zipfile.ZipFile, name: str) -> dict[str, tuple[str, int | None]]:
    info = zf.getinfo(name)
    if info.file_size > 16 << 20:
        raise _refuse(wheel, name, f"{info.file_size} bytes (a RECORD of fa's is a few KiB)")
    text = zf.read(info).decode("utf-8", "replace")
    listed: dict[str, tuple[str, int | None]] = {}
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if len(row) != 3:
            raise _refuse(wheel, name, f"a row of {len(row)} fields: {shown(','.join(row))}")
        path, hash_, size = row
        if path in listed:
            raise _refuse(wheel, name, f"lists {shown(path)} twice")
        if path == name:
            listed[path] = ("", None)
            continue
        algorithm, _, digest = hash_.partition("=")
        if algorithm != "sha256" or not digest or not (size.isascii() and size.isdigit()) or len(size) > 15:
            raise _refuse(
                wheel,
                name,
                f"{shown(path)}: hash {shown(hash_)}, size {shown(size)} (expected sha256=, a size)",
            )
        listed[path] = (digest, int(size))
    return listed


def _sha256(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    """The member's sha256 as RECORD writes it, reading at most its declared size (plus one byte, to
    tell a member that unpacks to more than it declares)."""
    digest = hashlib.sha256()
    left = info.file_size + 1
    with zf.open(info) as f:
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    if left <= 0:
        raise ValueError(f"{info.filename} unpacks to more than the {info.file_size} bytes it declares")
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


def _root_is_purelib(zf: zipfile.ZipFile, dist_info: str) -> bool:
    info = zf.getinfo(f"{dist_info}/WHEEL")
    text = zf.read(info).decode("utf-8", "replace") if info.file_size < 1 << 16 else ""
    value = email.parser.HeaderParser().parsestr(text).get("Root-Is-Purelib", "false")
    return value.strip().lower() == "true"
