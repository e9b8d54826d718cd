"""The torch releases on PyPI: which minors exist, their patches, the Pythons each has a Linux build for
per CPU (x86_64, aarch64), and a wheel of each CPU to take the C++ headers from.

Read from PyPI's simple API (PEP 691 JSON; a server may answer with the PEP 503 HTML page instead,
which some mirrors do, so both are read into the same JSON shape). The response is cached in
`cache_dir()/pypi/torch.json` for a day; `refresh=True` forces a new fetch, and an unreachable PyPI
falls back to a stale cache. The parsing (`catalog_from_simple_json`) is pure, so tests feed it a
trimmed real response (tests/builder/data/torch_simple.json).
"""

from __future__ import annotations

import html
import html.parser
import json
import logging
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from buildtool.core import atomic, fetch
from buildtool.core.cache import cache_dir
from buildtool.core.cpus import PLATFORMS, X86_64, linux_cpu
from buildtool.core.textfile import shown
from buildtool.errors import FaError

SIMPLE_URL = "https://pypi.org/simple/torch/"
# What pip sends: JSON preferred, the HTML page accepted.
ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
TTL_S = 24 * 3600

log = logging.getLogger("fa.pypi")


class CatalogError(FaError):
    """The torch catalog could not be read (offline without a cache, or an unreadable response)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}\n  fix: {fix}")
        self.problem = problem
        self.fix = fix


@dataclass(frozen=True)
class TorchFile:
    filename: str
    url: str
    sha256: str
    size: int | None  # None when the index page does not say (the PEP 503 HTML form)
    python_tag: str  # "cp312"
    platform_tag: str  # "manylinux_2_28_x86_64"


@dataclass(frozen=True)
class PlatformBuilds:
    """torch's wheels of one minor for one CPU (Linux)."""

    patches: tuple[str, ...]  # sorted patches with a wheel for this CPU: ("2.5.0", "2.5.1")
    pythons: tuple[str, ...]  # with a build in any of those patches: "3.10", "3.13t", ...
    header_source: TorchFile  # a wheel of the OLDEST of those patches (headers are per patch)

    @property
    def oldest(self) -> str:
        return self.patches[0]


@dataclass(frozen=True)
class TorchMinor:
    minor: str  # "2.5"
    patches: tuple[str, ...]  # sorted, final releases only, on any CPU we build for
    builds: Mapping[str, PlatformBuilds]  # per CPU ("x86_64", "aarch64") with at least one wheel

    def pythons(self, platform: str = X86_64) -> tuple[str, ...]:
        """The Pythons PyPI has a torch build of this minor for on Linux `platform` (may be none)."""
        build = self.builds.get(platform)
        return build.pythons if build else ()


@dataclass(frozen=True)
class TorchCatalog:
    minors: dict[str, TorchMinor]  # sorted by version

    def newest(self, n: int = 3) -> list[str]:
        return list(self.minors)[-n:]


SOURCE_KEY = "fa-source"  # in the cached copy: the page it was read from


def torch_page_url() -> str:
    """torch's page on the index fa reads (FA_PYPI_SIMPLE, else PyPI)."""
    return f"{fetch.simple_index()}/torch/"


def fetch_torch_catalog(
    refresh: bool = False,
    *,
    read: Callable[[str, dict[str, str]], bytes] = fetch.read_url,
    cache_file: Path | None = None,
    ttl_s: float = TTL_S,
) -> TorchCatalog:
    """The catalog from the cache when it is younger than `ttl_s` and came from the same index, else
    from the index (FA_PYPI_SIMPLE, else PyPI)."""
    path = cache_file or cache_dir() / "pypi" / "torch.json"
    url = torch_page_url()
    cached, problem = _read_cache(path, url)
    if cached is not None and not refresh and time.time() - path.stat().st_mtime < ttl_s:
        return catalog_from_simple_json(cached)
    try:
        body = read(url, {"Accept": ACCEPT})
    except fetch.FetchError as e:
        if cached is None:
            raise CatalogError(
                f"cannot read the torch releases from {url} ({e}), and {problem}",
                "connect to the index once (the answer is cached for a day; FA_PYPI_SIMPLE names a "
                "mirror), or point FA_CACHE at a cache that holds pypi/torch.json",
            ) from None
        age_h = (time.time() - path.stat().st_mtime) / 3600
        log.warning("%s unreachable (%s); using the cached torch catalog from %.0f h ago", url, e, age_h)
        return catalog_from_simple_json(cached)
    data = simple_json_from_response(body, url)
    try:
        atomic.write_json(path, {**data, SOURCE_KEY: url})
    except atomic.WriteError as e:  # a full or read-only FA_CACHE: the answer is read, only not kept
        log.warning("the torch catalog is not cached (%s)", str(e).replace("\n", ";"))
    return catalog_from_simple_json(data)


def _read_cache(path: Path, url: str) -> tuple[dict[str, Any] | None, str]:
    """The cached answer for `url`, or None and what is wrong with the cache (for the message): a
    damaged copy is said to be damaged, not missing."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, f"there is no cached copy at {path}"
    except (OSError, ValueError) as e:
        return None, f"the cached copy at {path} cannot be read ({e})"
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None, f"the cached copy at {path} is damaged (not JSON; delete it)"
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        return None, f'the cached copy at {path} is damaged (no "files" list; delete it)'
    source = data.get(SOURCE_KEY, SIMPLE_URL)
    if source != url:
        return None, f"the cached copy at {path} came from another index ({shown(source)})"
    return data, ""


def simple_json_from_response(body: bytes, url: str) -> dict[str, Any]:
    """PEP 691 JSON as is; a PEP 503 HTML page converted to the same shape (no sizes in HTML)."""
    text = body.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise CatalogError(f"{url} answered with broken JSON ({e})", "retry with --refresh") from None
        if not isinstance(data, dict) or not isinstance(data.get("files"), list):
            raise CatalogError(f"{url} answered JSON without a files list", "retry with --refresh") from None
        return data
    parser = _LinkParser(url)
    parser.feed(text)
    if not parser.files:
        raise CatalogError(f"{url} answered with no torch files (not an index page?)", "retry with --refresh")
    return {"meta": {"api-version": "1.0"}, "name": "torch", "files": parser.files}


class _LinkParser(html.parser.HTMLParser):
    """PEP 503 anchors -> PEP 691 file dicts."""

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base
        self.files: list[dict[str, Any]] = []
        self._attrs: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._attrs = dict(attrs)

    def handle_data(self, data: str) -> None:
        if self._attrs is None or not self._attrs.get("href"):
            return
        href = urllib.parse.urljoin(self.base, self._attrs["href"] or "")
        url, _, fragment = href.partition("#")
        algo, _, digest = fragment.partition("=")
        entry: dict[str, Any] = {
            "filename": data.strip(),
            "url": url,
            "hashes": {algo: digest} if digest else {},
            "yanked": "data-yanked" in self._attrs,
        }
        if self._attrs.get("data-requires-python"):
            entry["requires-python"] = html.unescape(self._attrs["data-requires-python"] or "")
        self.files.append(entry)
        self._attrs = None

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._attrs = None


def python_of(interpreter: str, abi: str) -> str | None:
    """("cp313", "cp313t") -> "3.13t"; None for tags that are not CPython 3."""
    if not interpreter.startswith("cp3"):
        return None
    minor = interpreter[3:]
    if not minor.isdigit():
        return None
    return f"3.{minor}" + ("t" if abi.endswith("t") else "")


def catalog_from_simple_json(data: dict[str, Any]) -> TorchCatalog:
    """Group PyPI's torch files into minors: final releases with a Linux wheel for a CPU we build for."""
    by_version: dict[Version, list[tuple[TorchFile, str, int, str]]] = {}
    for entry in data.get("files", []):
        if entry.get("yanked"):
            continue
        try:
            _, version, build, tags = parse_wheel_filename(entry["filename"])
        except (InvalidWheelFilename, KeyError):
            continue  # sdists and the odd malformed name carry no build we can use
        if version.is_prerelease or version.is_devrelease or version.local is not None:
            continue
        for tag in sorted(tags, key=str):
            python = python_of(tag.interpreter, tag.abi)
            cpu = linux_cpu(tag.platform)
            if python is None or cpu is None:
                continue
            file = TorchFile(
                filename=entry["filename"],
                url=entry["url"],
                sha256=entry.get("hashes", {}).get("sha256", ""),
                size=entry.get("size"),
                python_tag=tag.interpreter,
                platform_tag=tag.platform,
            )
            by_version.setdefault(version, []).append((file, python, build[0] if build else 0, cpu))
            break

    grouped: dict[str, list[Version]] = {}
    for version in sorted(by_version):
        grouped.setdefault(f"{version.major}.{version.minor}", []).append(version)

    minors = {}
    for minor, versions in grouped.items():
        builds = {}
        for cpu in PLATFORMS:
            mine = [v for v in versions if any(f[3] == cpu for f in by_version[v])]
            if not mine:
                continue
            pythons = {python for v in mine for _, python, _, c in by_version[v] if c == cpu}
            builds[cpu] = PlatformBuilds(
                patches=tuple(str(v) for v in mine),
                pythons=tuple(sorted(pythons, key=_python_sort_key)),
                header_source=_header_source([f[:3] for f in by_version[mine[0]] if f[3] == cpu]),
            )
        minors[minor] = TorchMinor(minor=minor, patches=tuple(str(v) for v in versions), builds=builds)
    return TorchCatalog(minors=minors)


def _header_source(files: list[tuple[TorchFile, str, int]]) -> TorchFile:
    # Any wheel of the patch has the same headers; pick one deterministically: a regular (not
    # free-threaded) build, the latest re-upload (build tag), then by name.
    def key(item: tuple[TorchFile, str, int]) -> tuple[Any, ...]:
        file, python, build = item
        return (python.endswith("t"), -build, file.filename)

    return min(files, key=key)[0]


def _python_sort_key(python: str) -> tuple[int, int, bool]:
    major, minor = python.removesuffix("t").split(".")
    return int(major), int(minor), python.endswith("t")
