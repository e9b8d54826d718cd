"""HTTP for fa: pages and indexes, whole-file downloads checked against a sha256, and byte-range reads.

Plain urllib (honours the usual *_proxy variables); no session state. Every download lands through
`atomic.writing`, so a killed build leaves at most a `*.fa-tmp-*` file and never a truncated one under
the final name.

Nothing read from a server is trusted to end: every read is capped in size (the size the index
declares, else a sane maximum for its kind) and in time (a deadline for the whole transfer, not only
per socket read, so a server trickling a byte every few seconds is cut off too).
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from buildtool.core import atomic
from buildtool.errors import FaError

# Called with (bytes done, total bytes or None) as a download advances.
ProgressHook = Callable[[int, "int | None"], None]

USER_AGENT = "fa-toolchain"
CHUNK = 1 << 20
TIMEOUT_S = 30  # one connect or socket read
# Pages (PyPI's torch page is about 4 MB of JSON) and index.json files (a few KB per wheel).
MAX_PAGE_BYTES = 64 << 20
PAGE_DEADLINE_S = 180.0
# A download without a declared size: torch wheels, the largest file fa fetches, are about 2.5 GB.
MAX_DOWNLOAD_BYTES = 8 << 30
# The whole transfer must average at least MIN_RATE after a start-up GRACE (slow links still finish:
# 1 GB at 64 KiB/s is 4.5 hours; a byte every 5 s is cut off after about a minute).
GRACE_S = 60.0
MIN_RATE_BPS = 64 << 10


DEFAULT_SIMPLE = "https://pypi.org/simple"


def simple_index() -> str:
    """The PEP 503 index every PyPI download goes through: FA_PYPI_SIMPLE (a mirror, for networks
    that reach only a mirror), else PyPI's. Without a trailing slash."""
    return (os.environ.get("FA_PYPI_SIMPLE") or DEFAULT_SIMPLE).rstrip("/")


class FetchError(FaError):
    """A download that failed, ran past its size or time cap, or did not match its pinned hash."""


def _request(url: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})


class _Budget:
    """The size and time a transfer may take; `check(done)` raises FetchError once it is exceeded."""

    def __init__(self, url: str, max_bytes: int, deadline_s: float | None) -> None:
        self.url = url
        self.max_bytes = max_bytes
        self.deadline_s = deadline_s
        self.start = time.monotonic()

    def check(self, done: int) -> None:
        if done > self.max_bytes:
            raise FetchError(
                f"{self.url}: the server sent more than {self.max_bytes} bytes, more than it declared or "
                "than a file of this kind can be; stopped reading (check the URL or the server)"
            )
        elapsed = time.monotonic() - self.start
        if self.deadline_s is not None and elapsed > self.deadline_s:
            raise FetchError(
                f"{self.url}: not finished after {elapsed:.0f} s ({done} bytes); stopped reading "
                "(a stalled or very slow server: retry later, or use a mirror)"
            )
        if elapsed > GRACE_S and done < MIN_RATE_BPS * (elapsed - GRACE_S):
            raise FetchError(
                f"{self.url}: {done} bytes in {elapsed:.0f} s, under {MIN_RATE_BPS // 1024} KiB/s on "
                "average; stopped reading (a stalled server: retry later, or use a mirror)"
            )


def _chunks(resp: Any, budget: _Budget) -> Iterator[bytes]:
    """The body in pieces as they arrive (read1: one socket read each), checked against the budget
    after every piece, so neither an endless body nor a trickle runs on."""
    read = getattr(resp, "read1", None) or resp.read
    done = 0
    budget.check(done)
    while chunk := read(min(CHUNK, budget.max_bytes - done + 1)):
        done += len(chunk)
        budget.check(done)
        yield chunk


def _declared(resp: Any) -> int | None:
    try:
        value = int(resp.headers.get("Content-Length") or "")
    except (ValueError, AttributeError):
        return None
    return value if value >= 0 else None


def read_url(
    url: str,
    headers: dict[str, str] | None = None,
    *,
    max_bytes: int | None = None,
    deadline_s: float | None = None,
) -> bytes:
    """The body of `url`, at most `max_bytes` (default MAX_PAGE_BYTES), within `deadline_s` seconds
    (default PAGE_DEADLINE_S)."""
    cap = MAX_PAGE_BYTES if max_bytes is None else max_bytes
    budget = _Budget(url, cap, PAGE_DEADLINE_S if deadline_s is None else deadline_s)
    try:
        with urllib.request.urlopen(_request(url, headers), timeout=TIMEOUT_S) as resp:
            declared = _declared(resp)
            if declared is not None and declared > cap:
                raise FetchError(f"{url}: declares {declared} bytes, more than the {cap} fa reads from it")
            return b"".join(_chunks(resp, budget))
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"cannot fetch {url}: {e}") from e


def download(
    url: str,
    dest: Path,
    sha256: str | None,
    progress: ProgressHook | None = None,
    *,
    size: int | None = None,
) -> Path:
    """Stream `url` to `dest`. With `sha256`, a mismatch is refused and nothing lands at `dest`. With
    `size` (what an index declares), a body of any other length is refused; without it, the server's
    Content-Length or MAX_DOWNLOAD_BYTES caps it."""
    h = hashlib.sha256()
    try:
        with atomic.writing(dest) as tmp, tmp.open("wb") as out:
            with urllib.request.urlopen(_request(url), timeout=TIMEOUT_S) as resp:
                declared = _declared(resp)
                if size is not None and declared is not None and declared != size:
                    raise FetchError(
                        f"{url}: the server declares {declared} bytes, the index {size}; refusing it"
                    )
                cap = size if size is not None else (declared or MAX_DOWNLOAD_BYTES)
                budget = _Budget(url, cap, GRACE_S + cap / MIN_RATE_BPS)
                done = 0
                for chunk in _chunks(resp, budget):
                    out.write(chunk)
                    h.update(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, size or declared)
            out.flush()
            if size is not None and done != size:
                raise FetchError(
                    f"{url}: got {done} bytes, the index declares {size}; refusing it (truncated)"
                )
            if sha256 is not None and h.hexdigest() != sha256.lower():
                raise FetchError(
                    f"{url}: sha256 {h.hexdigest()} does not match the pinned {sha256}; refusing it "
                    "(a tampered or truncated download; retry, and if it persists check the pin)"
                )
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"cannot download {url}: {e}") from e
    return dest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def read_range(url: str, start: int, end: int) -> tuple[bytes, bool]:
    """Bytes [start, end) of `url`. Returns (data, honoured): honoured is False when the server
    ignored the Range header and answered 200 (then `data` is empty and nothing was read)."""
    req = _request(url, {"Range": f"bytes={start}-{end - 1}"})
    budget = _Budget(url, end - start, GRACE_S + (end - start) / MIN_RATE_BPS)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            if resp.status != 206:
                return b"", False
            data = b"".join(_chunks(resp, budget))
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"cannot read bytes {start}-{end} of {url}: {e}") from e
    if len(data) != end - start:
        raise FetchError(f"{url}: asked for {end - start} bytes at {start}, got {len(data)}")
    return data, True


def content_length(url: str) -> int:
    req = _request(url)
    req.method = "HEAD"
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            length = _declared(resp)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise FetchError(f"cannot read the size of {url}: {e}") from e
    if length is None:
        raise FetchError(f"cannot read the size of {url}: no Content-Length in its answer")
    return length
