"""The wheels on offer: index.json (docs/contracts.md section 5) from a directory or an http(s)/file URL,
or, for a directory without index.json, the manifests inside the wheels themselves (section 3).

Also fetches one wheel and checks its sha256 against the index before anyone uses it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import parse_wheel_filename

from buildtool.compat.env import COMPUTE_CAPABILITY, DRIVER_VERSION
from buildtool.core import fetch, textfile
from buildtool.core.cpus import linux_cpu
from buildtool.core.fetch import sha256_file
from buildtool.core.schema import MANIFEST, Disagreement, WheelDirError, check_agreement, wheel_entry
from buildtool.errors import UsageError

INDEX_FILE = "index.json"


class WheelIndexError(UsageError):
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


URL_SCHEMES = ("http", "https", "file")
MAX_INDEX_BYTES = 16 << 20  # index.json is a few KB per wheel; a release's is well under 1 MB
INDEX_DEADLINE_S = 60.0  # to read index.json whole, however slowly the server sends it


def is_url(location: str) -> bool:
    return "://" in location and bool(urllib.parse.urlsplit(location).scheme)


def load_index(location: str) -> WheelIndex:
    """Read the index at a directory path or an http(s)/file URL of a directory holding index.json."""
    if is_url(location):
        url = location.rstrip("/") + "/"
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in URL_SCHEMES:
            raise WheelIndexError(
                f"--index {location}: fa reads http://, https:// and file:// URLs, not {scheme}://; "
                "serve the folder over http(s), or pass --wheels DIR for a local copy"
            )
        if scheme == "file":
            return _load_dir(Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)), location)
        data = _read_url(url + INDEX_FILE)
        return WheelIndex(location=url, entries=_parse_index(data, url + INDEX_FILE))
    return _load_dir(Path(location), location)


def _load_dir(directory: Path, location: str) -> WheelIndex:
    if not directory.is_dir():
        raise WheelIndexError(
            f"{location}: no such directory (run fa build, or pass --wheels DIR / --index URL)"
        )
    index = directory / INDEX_FILE
    if index.exists():
        try:
            text = textfile.read_text(index, MAX_INDEX_BYTES)
        except textfile.TextFileError as exc:
            raise WheelIndexError(f"{exc}; re-run fa index {directory} to rewrite it") from None
        return WheelIndex(location=str(directory), entries=_parse_index(text, str(index)))
    wheels = sorted(directory.glob("*.whl"))
    if not wheels:
        raise WheelIndexError(f"{location}: neither {INDEX_FILE} nor any .whl file here (run fa build)")
    return WheelIndex(location=str(directory), entries=tuple(entry_from_wheel(w) for w in wheels))


def _read_url(url: str) -> str:
    try:
        data = fetch.read_url(url, max_bytes=MAX_INDEX_BYTES, deadline_s=INDEX_DEADLINE_S)
    except fetch.FetchError as exc:
        raise WheelIndexError(f"{exc}; check the --index URL") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise WheelIndexError(
            f"{url}: not UTF-8 text, so not an index.json fa wrote; check the --index URL"
        ) from None


def _parse_index(text: str, where: str) -> tuple[WheelEntry, ...]:
    rewrite = "re-run fa index on the wheels to rewrite it"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WheelIndexError(
            f"{where}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {rewrite}"
        ) from None
    except (ValueError, RecursionError) as exc:  # a number past int()'s digit limit, nesting past the stack
        problem = "nested too deeply" if isinstance(exc, RecursionError) else "a number too long to read"
        raise WheelIndexError(f"{where}: not an index.json fa wrote ({problem}); {rewrite}") from None
    if not isinstance(data, dict) or data.get("schema") != 1 or not isinstance(data.get("wheels"), list):
        raise WheelIndexError(f'{where}: expected {{"schema": 1, "wheels": [...]}}; {rewrite}')
    if len(data["wheels"]) > MAX_WHEELS:
        raise WheelIndexError(
            f"{where}: wheels: {len(data['wheels'])} entries, more than fa builds; {rewrite}"
        )
    return tuple(entry_from_dict(raw, f"{where}: wheels[{i}]") for i, raw in enumerate(data["wheels"]))


# What a field of an entry may hold (docs/contracts.md section 5). ASCII-only patterns with lengths far
# above any real value: a value outside them is not one fa wrote, and would break a comparison later.
_TORCH_MINOR = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}", re.ASCII)
_SHA256 = re.compile(r"[0-9a-fA-F]{64}", re.ASCII)
_TEXT = re.compile(r"[!-~]{1,200}", re.ASCII)  # printable ASCII without spaces
_COVERAGE_CHOICES = {"image": ("sass", "ptx"), "dtype": ("fp16", "bf16"), "direction": ("fwd", "bwd")}
MAX_WHEELS = 10_000
MAX_ITEMS = 4_096  # archs, coverage items, head dims of one entry
MAX_HEAD_DIM = 1_024


class _EntryReader:
    """One entry of index.json, field by field; each error names the entry, the field and the fix."""

    def __init__(self, raw: Mapping[str, Any], where: str) -> None:
        self.raw = raw
        self.where = where

    def error(self, key: str, value: Any, expected: str) -> WheelIndexError:
        return WheelIndexError(
            f"{self.where}.{key}: got {textfile.shown(value)}; expected {expected}\n"
            "  fix: re-run fa index on the wheels to rewrite index.json"
        )

    def text(
        self, key: str, pattern: re.Pattern[str] = _TEXT, nullable: bool = False, expected: str = ""
    ) -> Any:
        value = self.raw.get(key)
        if value is None and nullable:
            return None
        if isinstance(value, str) and pattern.fullmatch(value):
            return value
        raise self.error(key, value, (expected or "a string") + (" or null" if nullable else ""))

    def integer(self, key: str, low: int, high: int, nullable: bool = False) -> Any:
        value = self.raw.get(key)
        if value is None and nullable:
            return None
        # bool is an int in Python; a true/false where a number belongs is still wrong
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return value
        raise self.error(
            key, value, f"a whole number from {low} to {high}" + (" or null" if nullable else "")
        )

    def boolean(self, key: str) -> Any:
        value = self.raw.get(key)
        if value is None or isinstance(value, bool):
            return value
        raise self.error(key, value, "true, false or null")

    def archs(self, key: str) -> tuple[str, ...]:
        value = self.raw.get(key)
        if (
            isinstance(value, list)
            and len(value) <= MAX_ITEMS
            and all(isinstance(a, str) and COMPUTE_CAPABILITY.fullmatch(a) for a in value)
        ):
            return tuple(value)
        raise self.error(key, value, 'a list of compute capabilities like ["8.0", "9.0"]')

    def requires_python(self) -> str | None:
        value = self.text("requires_python", nullable=True, expected='a PEP 440 specifier like ">=3.9"')
        try:
            SpecifierSet(value or "")
        except InvalidSpecifier:
            raise self.error("requires_python", value, 'a PEP 440 specifier like ">=3.9"') from None
        return value

    def coverage(self) -> None:
        """What kernel_choice reads: checked here so that any entry read can be chosen from."""
        value = self.raw.get("coverage")
        expected = 'a list of {"arch": "8.0", "image": "sass", "dtype": "bf16", "direction": "fwd", "head_dims": [...]}'
        if value is None:
            return
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            raise self.error("coverage", value, expected)
        for i, item in enumerate(value):
            key = f"coverage[{i}]"
            if not isinstance(item, dict):
                raise self.error(key, item, expected)
            if not (isinstance(item.get("arch"), str) and COMPUTE_CAPABILITY.fullmatch(item["arch"])):
                raise self.error(f"{key}.arch", item.get("arch"), 'a compute capability like "8.0"')
            for field, choices in _COVERAGE_CHOICES.items():
                if item.get(field) not in choices:
                    raise self.error(f"{key}.{field}", item.get(field), " or ".join(choices))
            dims = item.get("head_dims", [])
            if not (
                isinstance(dims, list)
                and len(dims) <= MAX_ITEMS
                and all(
                    isinstance(d, int) and not isinstance(d, bool) and 0 < d <= MAX_HEAD_DIM for d in dims
                )
            ):
                raise self.error(f"{key}.head_dims", dims, f"a list of head dims from 1 to {MAX_HEAD_DIM}")


def entry_from_dict(raw: Any, where: str) -> WheelEntry:
    if not isinstance(raw, dict):
        raise WheelIndexError(
            f"{where}: got {textfile.shown(raw)}; expected an object\n"
            "  fix: re-run fa index on the wheels to rewrite index.json"
        )
    read = _EntryReader(raw, where)
    file = read.text("file", expected="a wheel file name")
    # A bare file name: it is joined to the index's directory or URL and to a scratch directory.
    if "/" in file or "\\" in file or not file.endswith(".whl") or file.startswith("."):
        raise read.error("file", file, "a wheel file name next to index.json")
    entry = WheelEntry(
        file=file,
        sha256=read.text("sha256", _SHA256, expected="64 hex digits").lower(),
        size=read.integer("size", 0, 1 << 40, nullable=True),
        version=read.text("version", expected="a PEP 440 version"),
        variant="" if raw.get("variant") == "" else read.text("variant", expected="a variant"),
        platform=read.text("platform", nullable=True, expected="x86_64 or aarch64"),
        cuda_major=read.integer("cuda_major", 1, 99, nullable=True),
        torch=read.text("torch", _TORCH_MINOR, nullable=True, expected='a torch minor like "2.5"'),
        cxx11abi=read.boolean("cxx11abi"),
        min_driver=read.text(
            "min_driver", DRIVER_VERSION, nullable=True, expected='a driver version like "525.60.13"'
        ),
        ptx_min_driver=read.text(
            "ptx_min_driver", DRIVER_VERSION, nullable=True, expected='a driver version like "575.51.03"'
        ),
        sass=read.archs("sass"),
        ptx=read.text("ptx", COMPUTE_CAPABILITY, nullable=True, expected='a compute capability like "9.0"'),
        requires_python=read.requires_python(),
        raw=raw,
    )
    read.coverage()
    try:
        check_agreement(raw)
    except Disagreement as exc:
        raise WheelIndexError(
            f"{where}.{exc.field}: {exc.problem}; the entry does not describe its own file\n"
            "  fix: re-run fa index on the wheels to rewrite index.json"
        ) from None
    if entry.platform is None:  # an index written before entries named the CPU: read it from the file name
        cpu = linux_cpu(next(iter(parse_wheel_filename(file)[3])).platform)
        entry = dataclasses.replace(entry, platform=cpu)
    return entry


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
    """Copy or download the wheel into dest_dir, then check it before anyone uses it: its size and sha256
    against the index, and its own name, metadata and manifest against the entry (a wheel that says
    another version, variant, torch or CUDA than the index is refused). Raises WheelIndexError and
    leaves nothing behind."""
    source = wheel_location(index, entry)
    dest = dest_dir / entry.file
    try:
        if source.startswith(("http://", "https://")):
            fetch.download(source, dest, None, size=entry.size)
        else:
            _copy_regular_file(Path(source), dest, entry.size)
        actual = sha256_file(dest)
        if actual != entry.sha256:
            raise WheelIndexError(
                f"{entry.file}: sha256 is {actual} but the index says {entry.sha256}; refusing to install it "
                "(the file was changed or corrupted: rebuild it with fa build, or fetch it again)"
            )
        _check_against_index(dest, entry)
    except (fetch.FetchError, OSError) as exc:
        dest.unlink(missing_ok=True)
        raise WheelIndexError(f"{source}: cannot fetch it ({exc})") from None
    except WheelIndexError:
        dest.unlink(missing_ok=True)
        raise
    return dest


def _copy_regular_file(source: Path, dest: Path, size: int | None) -> None:
    if not source.is_file():
        raise OSError(f"{source} is not a regular file")
    if size is not None and source.stat().st_size != size:
        raise WheelIndexError(
            f"{source.name}: {source.stat().st_size} bytes but the index says {size}; refusing to install it "
            "(the file was changed or corrupted: rebuild it with fa build, or fetch it again)"
        )
    shutil.copyfile(source, dest)


# What the selection decided on: the wheel's own manifest must say the same as the index entry.
_CHECKED_AGAINST_WHEEL = (
    "version",
    "variant",
    "platform",
    "cuda_major",
    "torch",
    "cxx11abi",
    "sass",
    "ptx",
    "min_driver",
    "ptx_min_driver",
    "coverage",
)


def _check_against_index(wheel: Path, entry: WheelEntry) -> None:
    try:
        own = wheel_entry(wheel)
    except WheelDirError as exc:
        raise WheelIndexError(f"{exc}; nothing installed") from None
    for key in _CHECKED_AGAINST_WHEEL:
        if key in entry.raw and entry.raw[key] != own.get(key):
            raise WheelIndexError(
                f"{entry.file}: the index says {key} {textfile.shown(entry.raw[key])}, the wheel itself "
                f"says {textfile.shown(own.get(key))}; refusing it (the index does not describe this wheel): "
                "re-run fa index on the wheels to rewrite index.json"
            )
