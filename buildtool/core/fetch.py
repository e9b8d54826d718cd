"""HTTP for the build: whole-file downloads checked against a pinned sha256, and byte-range reads.

Plain urllib (honours the usual *_proxy variables); no session state. Every download lands through
`atomic.writing`, so a killed build leaves at most a `*.tmp-*` file and never a truncated one
under the final name.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from buildtool.core import atomic
from buildtool.errors import FaError

# Called with (bytes done, total bytes or None) as a download advances.
ProgressHook = Callable[[int, "int | None"], None]

USER_AGENT = "fa-toolchain (fa build)"
CHUNK = 1 << 20
TIMEOUT_S = 60


class FetchError(FaError):
    """A download that failed or did not match its pinned hash."""


def _request(url: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})


def read_url(url: str, headers: dict[str, str] | None = None) -> bytes:
    try:
        with urllib.request.urlopen(_request(url, headers), timeout=TIMEOUT_S) as resp:
            return resp.read()
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(f"cannot fetch {url}: {e}") from e


def download(url: str, dest: Path, sha256: str | None, progress: ProgressHook | None = None) -> Path:
    """Stream `url` to `dest`. With `sha256`, a mismatch is refused and nothing lands at `dest`."""
    h = hashlib.sha256()
    try:
        with atomic.writing(dest) as tmp, tmp.open("wb") as out:
            with urllib.request.urlopen(_request(url), timeout=TIMEOUT_S) as resp:
                total = int(resp.headers.get("Content-Length") or 0) or None
                done = 0
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
                    h.update(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
            out.flush()
            if sha256 is not None and h.hexdigest() != sha256:
                raise FetchError(
                    f"{url}: sha256 {h.hexdigest()} does not match the pinned {sha256}; refusing it "
                    "(a tampered or truncated download; retry, and if it persists check the pin)"
                )
    except (urllib.error.URLError, OSError) as e:
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
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            if resp.status != 206:
                return b"", False
            data = resp.read()
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(f"cannot read bytes {start}-{end} of {url}: {e}") from e
    if len(data) != end - start:
        raise FetchError(f"{url}: asked for {end - start} bytes at {start}, got {len(data)}")
    return data, True


def content_length(url: str) -> int:
    req = _request(url)
    req.method = "HEAD"
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return int(resp.headers["Content-Length"])
    except (urllib.error.URLError, OSError, KeyError, ValueError) as e:
        raise FetchError(f"cannot read the size of {url}: {e}") from e
