"""The wheels on offer: index.json (docs/contracts.md section 5) from a directory or an http(s)/file URL,
or, for a directory without index.json, the manifests inside the wheels themselves (section 3).

Also fetches one wheel and checks its sha256 against the index before anyone uses it.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from buildtool.core.cpus import linux_cpu
from buildtool.core.fetch import sha256_file
from buildtool.core.schema import MANIFEST, WheelDirError, wheel_entry

INDEX_FILE = "index.json"
_TIMEOUT_S = 60


class WheelIndexError(Exception):
    """The wheels cannot be read or trusted; the message says where and what to do."""


@dataclass(frozen=True)
class WheelEntry:
    file: str  # the wheel's file name as in index.json
    sha256: str
    size: int | None
    version: str
    variant: str  # "" for the universal wheel
    platform: str | None  # the CPU, "x86_64" | "aarch64"; None for the universal wheel
    cuda_major: int | None  # None: universal (no kernels)
    torch: str | None  # torch minor the binding is built for
    cxx11abi: bool | None
    min_driver: str | None
    ptx_min_driver: str | None
    sass: tuple[str, ...]
    ptx: str | None
    requires_python: str | None
    raw: Mapping[str, Any]  # the entry as written; what kernel_choice.choose reads (sass, ptx, coverage)

    @property
    def universal(self) -> bool:
        return self.cuda_major is None


@dataclass(frozen=True)
class WheelIndex:
    location: str  # the directory or URL the index was read from
    entries: tuple[WheelEntry, ...]


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


def _parse_index(text: str, where: str) -> tuple[WheelEntry, ...]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WheelIndexError(f"{where}: not JSON ({exc}); re-run fa build to rewrite it") from exc
    if not isinstance(data, dict) or data.get("schema") != 1 or not isinstance(data.get("wheels"), list):
        raise WheelIndexError(f'{where}: expected {{"schema": 1, "wheels": [...]}}; re-run fa build')
    return tuple(entry_from_dict(raw, f"{where}: wheels[{i}]") for i, raw in enumerate(data["wheels"]))


def entry_from_dict(raw: Any, where: str) -> WheelEntry:
    if not isinstance(raw, dict):
        raise WheelIndexError(f"{where}: expected an object; re-run fa build")

    def need(key: str, kind: type, nullable: bool = False) -> Any:
        value = raw.get(key)
        # bool is an int in Python; a true/false where a number belongs is still wrong
        if (value is None and nullable) or (
            isinstance(value, kind) and (kind is bool) == isinstance(value, bool)
        ):
            return value
        raise WheelIndexError(f"{where}.{key}: got {value!r}; re-run fa build to rewrite the index")

    sass = need("sass", list)
    file = need("file", str)
    # A bare file name: it is joined to the index's directory or URL and to a scratch directory.
    if "/" in file or "\\" in file or not file.endswith(".whl") or file.startswith("."):
        raise WheelIndexError(f"{where}.file: got {file!r}; expected a wheel file name next to index.json")
    platform = need("platform", str, True)
    if platform is None:  # an index written before entries named the CPU: read it from the file name
        try:
            platform = linux_cpu(next(iter(parse_wheel_filename(file)[3])).platform)
        except InvalidWheelFilename as exc:
            raise WheelIndexError(f"{where}.file: {file!r} is not a wheel file name ({exc})") from exc
    return WheelEntry(
        file=file,
        sha256=need("sha256", str),
        size=need("size", int, True),
        version=need("version", str),
        variant=need("variant", str),
        platform=platform,
        cuda_major=need("cuda_major", int, True),
        torch=need("torch", str, True),
        cxx11abi=need("cxx11abi", bool, True),
        min_driver=need("min_driver", str, True),
        ptx_min_driver=need("ptx_min_driver", str, True),
        sass=tuple(str(a) for a in sass),
        ptx=need("ptx", str, True),
        requires_python=need("requires_python", str, True),
        raw=raw,
    )


def entry_from_wheel(path: Path) -> WheelEntry:
    """An index entry computed from a wheel file and the manifest inside it, as `fa index` writes it."""
    try:
        raw = wheel_entry(path)
    except WheelDirError as exc:
        raise WheelIndexError(str(exc)) from exc
    return entry_from_dict(raw, f"{path}: {MANIFEST}")


def wheel_location(index: WheelIndex, entry: WheelEntry) -> str:
    """Where the wheel file is: a path for a directory index, a URL for an http one."""
    if index.location.startswith(("http://", "https://")):
        return urllib.parse.urljoin(index.location, urllib.parse.quote(entry.file))
    return str(Path(index.location) / entry.file)


def fetch_wheel(index: WheelIndex, entry: WheelEntry, dest_dir: Path) -> Path:
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
