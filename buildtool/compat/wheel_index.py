"""The wheels on offer: index.json (docs/contracts.md section 5) from a directory or an http(s)/file URL,
or, for a directory without index.json, the manifests inside the wheels themselves (section 3).

Also fetches one wheel and checks it before anyone uses it: its size and sha256 against the index,
and its own name, metadata and manifest against the index's entry.

Nothing read here is trusted: index.json is read with a size cap and, from a server, a deadline for
the whole transfer; each entry is read by the runtime's schema (every field typed and bounded) and must
describe its own file (wheel_file.check_agreement). A bad entry is refused, naming it and the field,
never dropped.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import parse_wheel_filename

from buildtool.core import fetch, textfile
from buildtool.core.cpus import wheel_cpu
from buildtool.core.fetch import sha256_file
from buildtool.core.runtime import schema
from buildtool.core.wheel_file import Disagreement, WheelDirError, check_agreement, wheel_entry
from buildtool.errors import EXIT_FAILED, UsageError

INDEX_FILE = "index.json"
URL_SCHEMES = ("http", "https", "file")
MAX_INDEX_BYTES = 16 << 20  # index.json is a few KB per wheel; a release's is well under 1 MB
INDEX_DEADLINE_S = 60.0  # to read index.json whole, however slowly the server sends it
# An fa-attn wheel is about 3.3 MiB (docs/figures.md); a declared size past this is not one of ours,
# and is refused before a byte is downloaded.
MAX_WHEEL_BYTES = 512 << 20
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
REWRITE = "  fix: re-run fa index on the wheels to rewrite index.json"


class WheelIndexError(UsageError):
    """The wheels cannot be read or trusted; the message says where and what to do."""


class IndexServerError(WheelIndexError):
    """The index server failed (unreachable, not HTTP, too slow, too much): a network failure, exit 1,
    where a bad index.json or a bad --index URL is bad input, exit 2."""

    exit_code: ClassVar[int] = EXIT_FAILED


@dataclass(frozen=True)
class WheelIndex:
    location: str  # the directory or URL the index was read from
    entries: tuple[schema.IndexEntry, ...]


def is_url(location: str) -> bool:
    """A location that starts with a scheme (`http://`, `HTTP://`, `ftp://`) is a URL, never a path."""
    return _SCHEME.match(location) is not None


def load_index(location: str) -> WheelIndex:
    """Read the index at a directory path or an http(s)/file URL of a directory holding index.json."""
    if is_url(location):
        scheme = location.split("://", 1)[0].lower()
        if scheme not in URL_SCHEMES:
            raise WheelIndexError(
                f"--index {fetch.shown_url(location)}: fa reads http://, https:// and file:// URLs, not "
                f"{fetch.shown_url(scheme)}://; serve the folder over http(s), or pass --wheels DIR for a "
                "local copy"
            )
        url = fetch.checked_url(location, "--index", URL_SCHEMES).rstrip("/") + "/"
        if scheme == "file":
            return _load_dir(Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path)), location)
        text = _read_url(url + INDEX_FILE)
        return WheelIndex(location=url, entries=_parse_index(text, url + INDEX_FILE))
    return _load_dir(Path(location), location)


def _load_dir(directory: Path, location: str) -> WheelIndex:
    if not _is_dir(directory):
        raise WheelIndexError(
            f"{fetch.shown_url(location)}: no such directory (run fa build, or pass --wheels DIR / --index URL)"
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
        raise WheelIndexError(f"{location}: neither {INDEX_FILE} nor any .whl file here{_below(directory)}")
    return WheelIndex(location=str(directory), entries=tuple(entry_from_wheel(w) for w in wheels))


def _below(directory: Path) -> str:
    """What to do about a folder without wheels: read the wheel index one level down when there is one
    (`fa build --local` writes wheels/local/, README's `fa doctor` reads wheels/), else build."""
    try:
        found = sorted(p.parent for p in directory.glob(f"*/{INDEX_FILE}"))
    except OSError:
        found = []
    if not found:
        return " (run fa build)"
    return (
        f"; a wheel index is in {', '.join(str(p) for p in found)}\n  fix: read it with --wheels {found[0]}"
    )


def _is_dir(directory: Path) -> bool:
    """is_dir() that answers False for a path the system cannot even look up (a name past NAME_MAX)."""
    try:
        return directory.is_dir()
    except (OSError, ValueError):
        return False


def _read_url(url: str) -> str:
    try:
        data = fetch.read_url(url, max_bytes=MAX_INDEX_BYTES, deadline_s=INDEX_DEADLINE_S)
    except fetch.FetchError as exc:
        raise IndexServerError(f"{exc} (--index)") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise WheelIndexError(
            f"{url}: UTF-16 text (a byte order mark), not the UTF-8 index.json fa writes\n  fix: serve it "
            "as fa index wrote it (UTF-8), or re-run fa index on the wheels"
        )
    try:
        # A UTF-8 byte order mark (some editors and servers add one) is read past, as in a local file.
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise WheelIndexError(
            f"{url}: not UTF-8 text, so not an index.json fa wrote; check the --index URL"
        ) from None


def _parse_index(text: str, where: str) -> tuple[schema.IndexEntry, ...]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WheelIndexError(
            f"{where}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})\n{REWRITE}"
        ) from None
    except (ValueError, RecursionError) as exc:  # a number past int()'s digit limit, nesting past the stack
        problem = "nested too deeply" if isinstance(exc, RecursionError) else "a number too long to read"
        raise WheelIndexError(f"{where}: not an index.json fa wrote ({problem})\n{REWRITE}") from None
    try:
        entries = schema.read_index(data)
    except schema.SchemaError as exc:
        raise WheelIndexError(f"{where}: {exc}\n{REWRITE}") from None
    alls = [e for e in entries if e.info.all_wheel]
    rest = [e for e in entries if not e.info.all_wheel]
    named = [(e, f"wheels[{i}]") for i, e in enumerate(rest)] + [
        (e, f"all_wheels[{i}]") for i, e in enumerate(alls)
    ]
    checked = tuple(_checked(e, f"{where}: {name}") for e, name in named)
    _refuse_conflicts(checked, [name for _, name in named], where)
    return checked


def _refuse_conflicts(entries: tuple[schema.IndexEntry, ...], names: list[str], where: str) -> None:
    """Two entries for one file name must be the same entry: which hash, size or torch would fa trust?"""
    first: dict[str, int] = {}
    for i, entry in enumerate(entries):
        j = first.setdefault(entry.file, i)
        if j != i and entry != entries[j]:
            field = next(
                (
                    f.name
                    for f in dataclasses.fields(entry)
                    if getattr(entry, f.name) != getattr(entries[j], f.name)
                ),
                "entry",
            )
            raise WheelIndexError(
                f"{where}: {names[j]} and {names[i]} both describe {entry.file} but differ in {field}; an "
                f"index lists each wheel once\n{REWRITE}"
            )


def entry_from_dict(raw: Any, where: str) -> schema.IndexEntry:
    """One index.json entry, read and checked (WheelIndexError names the field)."""
    try:
        entry = schema.IndexEntry.from_json(raw, "")
    except schema.SchemaError as exc:
        raise WheelIndexError(f"{where}.{exc}\n{REWRITE}") from None
    return _checked(entry, where)


def _checked(entry: schema.IndexEntry, where: str) -> schema.IndexEntry:
    """What the schema cannot check: the entry describes its own file, and its requires_python parses.
    An entry written before entries named the CPU takes it from the wheel's file name."""
    try:
        check_agreement(entry.file, entry.info)
    except Disagreement as exc:
        raise WheelIndexError(
            f"{where}.{exc.field}: {exc.problem}; the entry does not describe its own file\n{REWRITE}"
        ) from None
    if entry.requires_python is not None:
        try:
            SpecifierSet(entry.requires_python)
        except InvalidSpecifier:
            raise WheelIndexError(
                f"{where}.requires_python: got {textfile.shown(entry.requires_python)}; expected a PEP 440 "
                f'specifier like ">=3.9"\n{REWRITE}'
            ) from None
    if entry.info.platform is not None:
        return entry
    platform = wheel_cpu(next(iter(parse_wheel_filename(entry.file)[3])).platform)
    return dataclasses.replace(entry, info=dataclasses.replace(entry.info, platform=platform))


def entry_from_wheel(path: Path) -> schema.IndexEntry:
    """An index entry computed from a wheel file and the manifest inside it, as `fa index` writes it."""
    try:
        return wheel_entry(path)
    except WheelDirError as exc:
        raise WheelIndexError(str(exc)) from exc


def base_url(index: WheelIndex) -> str:
    """The URL the per-variant indexes sit under (the folder of index.json), as pip and uv take it: the
    http(s) or file URL given, or a local directory's absolute file:// URL."""
    if is_url(index.location):
        return index.location.rstrip("/")
    return Path(index.location).resolve().as_uri()


def missing_pages(index: WheelIndex, index_path: str) -> Path | None:
    """The PEP 503 page a local wheel folder lacks (wheels copied in without `fa index`), else None;
    an http(s) index is not asked (doctor makes no request for it)."""
    if is_url(index.location) and not index.location.startswith("file:"):
        return None
    folder = (
        Path(urllib.request.url2pathname(urllib.parse.urlsplit(index.location).path))
        if is_url(index.location)
        else Path(index.location)
    )
    page = folder / index_path / schema.PACKAGE / "index.html"
    return None if page.is_file() else page


def wheel_location(index: WheelIndex, entry: schema.IndexEntry) -> str:
    """Where the wheel file is: a path for a directory index, a URL for an http one."""
    if _is_web(index.location):
        return urllib.parse.urljoin(index.location, urllib.parse.quote(entry.file))
    return str(Path(index.location) / entry.file)


def fetch_wheel(index: WheelIndex, entry: schema.IndexEntry, dest_dir: Path) -> Path:
    """Copy or download the wheel into dest_dir, then check it before anyone uses it: its size and sha256
    against the index, and its own name, metadata and manifest against the entry (a wheel that says
    another version, variant, torch or CUDA than the index is refused). Raises WheelIndexError and
    leaves nothing behind."""
    source = wheel_location(index, entry)
    dest = dest_dir / entry.file
    if entry.size is not None and entry.size > MAX_WHEEL_BYTES:
        raise WheelIndexError(
            f"{entry.file}: the index declares {entry.size} bytes, more than the {MAX_WHEEL_BYTES} an fa-attn "
            f"wheel can be; refusing it before downloading\n{REWRITE}"
        )
    try:
        if _is_web(source):
            fetch.download(source, dest, None, size=entry.size, max_bytes=MAX_WHEEL_BYTES)
        else:
            _copy_regular_file(Path(source), dest, entry.size)
        actual = sha256_file(dest)
        if actual != entry.sha256:
            raise WheelIndexError(
                f"{entry.file}: sha256 is {actual} but the index says {entry.sha256}; refusing to install it "
                "(the file was changed or corrupted: rebuild it with fa build, or fetch it again)"
            )
        _check_against_index(dest, entry)
    except fetch.FetchError as exc:
        dest.unlink(missing_ok=True)
        raise IndexServerError(str(exc)) from None
    except OSError as exc:
        dest.unlink(missing_ok=True)
        raise WheelIndexError(f"{fetch.shown_url(source)}: cannot fetch it ({exc})") from None
    except WheelIndexError:
        dest.unlink(missing_ok=True)
        raise
    return dest


def _is_web(location: str) -> bool:
    return location.lower().startswith(("http://", "https://"))


def _copy_regular_file(source: Path, dest: Path, size: int | None) -> None:
    if not source.is_file():
        raise OSError(f"{source} is not a regular file")
    if source.stat().st_size > MAX_WHEEL_BYTES:
        raise WheelIndexError(
            f"{source}: {source.stat().st_size} bytes, more than the {MAX_WHEEL_BYTES} an fa-attn wheel can "
            "be; refusing it (is it the right file?)"
        )
    if size is not None and source.stat().st_size != size:
        raise WheelIndexError(
            f"{source.name}: {source.stat().st_size} bytes but the index says {size}; refusing to install it "
            "(the file was changed or corrupted: rebuild it with fa build, or fetch it again)"
        )
    shutil.copyfile(source, dest)


def _check_against_index(wheel: Path, entry: schema.IndexEntry) -> None:
    """What the selection decided on must be what the wheel says of itself."""
    try:
        own = wheel_entry(wheel)
    except WheelDirError as exc:
        raise WheelIndexError(f"{exc}; nothing installed") from None
    for field in dataclasses.fields(schema.WheelInfo):
        said, actual = getattr(entry.info, field.name), getattr(own.info, field.name)
        if said != actual:
            raise WheelIndexError(
                f"{entry.file}: the index says {field.name} {textfile.shown(said)}, the wheel itself says "
                f"{textfile.shown(actual)}; refusing it (the index does not describe this wheel)\n{REWRITE}"
            )
