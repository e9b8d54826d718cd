"""The wheels on offer: index.json (docs/contracts.md section 5) from a directory or an http(s)/file URL,
or, for a directory without index.json, the manifests inside the wheels themselves (section 3).

Also fetches one wheel and checks its sha256 against the index before anyone uses it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from buildtool.core.cpus import linux_cpu
from buildtool.core.fetch import sha256_file
from buildtool.core.runtime import schema
from buildtool.core.wheel_file import WheelDirError, wheel_entry
from buildtool.errors import UsageError

INDEX_FILE = "index.json"
_TIMEOUT_S = 60


class WheelIndexError(UsageError):
    """The wheels cannot be read or trusted; the message says where and what to do."""


@dataclass(frozen=True)
class WheelIndex:
    location: str  # the directory or URL the index was read from
    entries: tuple[schema.IndexEntry, ...]


def is_url(location: str) -> bool:
    return urllib.parse.urlsplit(location).scheme in ("http", "https", "file")


def load_index(location: str) -> WheelIndex:
    """Read the index at a directory path or an http(s)/file URL of a directory holding index.json."""
    if is_url(location):
        url = location.rstrip("/") + "/"
        if urllib.parse.urlsplit(url).scheme == "file":
            return _load_dir(Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)), location)
        text = _read_url(url + INDEX_FILE)
        return WheelIndex(location=url, entries=_parse_index(text, url + INDEX_FILE))
    return _load_dir(Path(location), location)


def _load_dir(directory: Path, location: str) -> WheelIndex:
    if not directory.is_dir():
        raise WheelIndexError(
            f"{location}: no such directory (run fa build, or pass --wheels DIR / --index URL)"
        )
    index = directory / INDEX_FILE
    if index.is_file():
        return WheelIndex(location=str(directory), entries=_parse_index(index.read_text(), str(index)))
    wheels = sorted(directory.glob("*.whl"))
    if not wheels:
        raise WheelIndexError(f"{location}: neither {INDEX_FILE} nor any .whl file here (run fa build)")
    return WheelIndex(location=str(directory), entries=tuple(entry_from_wheel(w) for w in wheels))


def _read_url(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        raise WheelIndexError(f"{url}: cannot read it ({exc}); check the --index URL") from exc


def _parse_index(text: str, where: str) -> tuple[schema.IndexEntry, ...]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WheelIndexError(f"{where}: not JSON ({exc}); re-run fa build to rewrite it") from exc
    try:
        entries = schema.read_index(data)
    except schema.SchemaError as exc:
        raise WheelIndexError(f"{where}: {exc}; re-run fa build (or fa index) to rewrite the index") from exc
    return tuple(_with_platform(e, f"{where}: wheels[{i}]") for i, e in enumerate(entries))


def entry_from_dict(raw: Any, where: str) -> schema.IndexEntry:
    """One index.json entry, read and checked (WheelIndexError names the field)."""
    try:
        entry = schema.IndexEntry.from_json(raw, "")
    except schema.SchemaError as exc:
        raise WheelIndexError(f"{where}: {exc}; re-run fa build to rewrite the index") from exc
    return _with_platform(entry, where)


def _with_platform(entry: schema.IndexEntry, where: str) -> schema.IndexEntry:
    """An entry written before entries named the CPU takes it from the wheel's file name."""
    if entry.info.platform is not None:
        return entry
    try:
        platform = linux_cpu(next(iter(parse_wheel_filename(entry.file)[3])).platform)
    except InvalidWheelFilename as exc:
        raise WheelIndexError(f"{where}.file: {entry.file!r} is not a wheel file name ({exc})") from exc
    return dataclasses.replace(entry, info=dataclasses.replace(entry.info, platform=platform))


def entry_from_wheel(path: Path) -> schema.IndexEntry:
    """An index entry computed from a wheel file and the manifest inside it, as `fa index` writes it."""
    try:
        return wheel_entry(path)
    except WheelDirError as exc:
        raise WheelIndexError(str(exc)) from exc


def wheel_location(index: WheelIndex, entry: schema.IndexEntry) -> str:
    """Where the wheel file is: a path for a directory index, a URL for an http one."""
    if index.location.startswith(("http://", "https://")):
        return urllib.parse.urljoin(index.location, urllib.parse.quote(entry.file))
    return str(Path(index.location) / entry.file)


def fetch_wheel(index: WheelIndex, entry: schema.IndexEntry, dest_dir: Path) -> Path:
    """Copy or download the wheel into dest_dir and verify its sha256; a mismatch raises and leaves nothing."""
    source = wheel_location(index, entry)
    dest = dest_dir / entry.file
    try:
        if source.startswith(("http://", "https://")):
            with urllib.request.urlopen(source, timeout=_TIMEOUT_S) as response, dest.open("wb") as out:
                shutil.copyfileobj(response, out)
        else:
            shutil.copyfile(source, dest)
    except (urllib.error.URLError, OSError) as exc:
        dest.unlink(missing_ok=True)
        raise WheelIndexError(f"{source}: cannot fetch it ({exc})") from exc
    actual = sha256_file(dest)
    if actual != entry.sha256:
        dest.unlink()
        raise WheelIndexError(
            f"{entry.file}: sha256 is {actual} but the index says {entry.sha256}; refusing to install it "
            "(the file was changed or corrupted: rebuild it with fa build, or fetch it again)"
        )
    return dest
