"""HTTP for fa: pages and indexes, whole-file downloads checked against a sha256, and byte-range reads.

Plain urllib (honours the usual *_proxy variables); no session state. Every download lands through
`atomic.writing`, so a killed build leaves at most a `*.fa-tmp-*` file and never a truncated one under
the final name.

Nothing read from a server is trusted to end: every read is capped in size (the size the index
declares, else a sane maximum for its kind) and in time (a deadline for the whole transfer, not only
per socket read, so a server trickling a byte every few seconds is cut off too; the status line and
headers have one of their own, enforced by shutting the socket down). A download's expected size is
checked against its cap and the free disk space before a byte is written.

Nothing a server or a person hands fa as a URL reaches urllib unchecked (`url_problem`): a space,
a control character, a port that is no number or an unclosed `[` is refused with a message, not a
traceback. Redirects are followed only among http(s) URLs, never from https down to http, at most
MAX_REDIRECTS; no other scheme (ftp://, data:) is opened at all. Whatever a server sends (no status
line, a 70 KB header, 101 headers, broken chunked framing) ends in one FetchError naming the URL.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import os
import shutil
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from buildtool.core import atomic
from buildtool.core.textfile import printable
from buildtool.errors import FaError, UsageError

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
    that reach only a mirror), else PyPI's. Without a trailing slash. A malformed FA_PYPI_SIMPLE is
    BadURL (exit 2) naming the variable."""
    mirror = os.environ.get("FA_PYPI_SIMPLE")
    if not mirror:
        return DEFAULT_SIMPLE
    return checked_url(mirror, "FA_PYPI_SIMPLE").rstrip("/")


class FetchError(FaError):
    """A download that failed, ran past its size or time cap, or did not match its pinned hash; also a
    server that answered something other than HTTP, or redirected where fa does not follow. Exit 1."""


class BadURL(UsageError):
    """A URL a person or a file gave fa that it cannot use (malformed, another scheme). Exit 2."""


# What a URL may be: http(s) to a server, file:// for a local copy (FA_NVRTC_WHEELS). Redirects go only
# among http(s), never from https down to http, and at most MAX_REDIRECTS of them.
WEB_SCHEMES = ("http", "https")
MAX_URL_CHARS = 8192  # servers refuse far shorter request lines; a longer one is a mistake
MAX_REDIRECTS = 5
# The status line and headers must arrive within this (the body has its own deadline): a server that
# trickles its headers is cut off like one that trickles its body.
HEAD_DEADLINE_S = 60.0
SHOWN_URL_CHARS = 200
NETWORK_FIX = "check the URL and that the server is up, or retry later"


def shown_url(url: str) -> str:
    """`url` as a message may quote it: control characters escaped, at most SHOWN_URL_CHARS long."""
    text = printable(url)
    if len(text) <= SHOWN_URL_CHARS:
        return text
    return f"{text[:SHOWN_URL_CHARS]}... ({len(url)} characters)"


def url_problem(url: str, schemes: tuple[str, ...] = (*WEB_SCHEMES, "file")) -> str | None:
    """What is wrong with `url` and the fix, or None: checked before any request, so that urllib and
    http.client never see a URL they would raise on (a space, an unclosed `[`, a port that is no number)."""
    if len(url) > MAX_URL_CHARS:
        return f"{len(url)} characters long, more than the {MAX_URL_CHARS} fa accepts; shorten it"
    for i, c in enumerate(url):
        if c <= " " or c == "\x7f":
            what = "a space" if c == " " else f"a control character ({c!a})"
            return f"{what} at position {i}; percent-encode it (a space is %20)"
        if not c.isascii():
            return f"a non-ASCII character ({c!a}) at position {i}; percent-encode it"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        return f"not a URL ({exc}); write an IPv6 host in brackets, as http://[::1]:8000/"
    scheme = parts.scheme.lower()
    if not scheme or "://" not in url:
        return "not a URL (no scheme://); write it as http://HOST/PATH"
    if scheme not in schemes:
        return (
            f"fa reads {', '.join(s + '://' for s in schemes)} URLs, not {scheme}://; serve it over http(s)"
        )
    if scheme == "file":
        return None
    try:
        port = parts.port
    except ValueError:
        return f"the port in {parts.netloc!r} is not a number from 1 to 65535; write it as HOST:8000"
    if port == 0:
        return "port 0 is no port a server listens on; write it as HOST:8000"
    if not parts.hostname:
        return "no host name; write it as http://HOST/PATH"
    return None


def checked_url(url: str, source: str, schemes: tuple[str, ...] = (*WEB_SCHEMES, "file")) -> str:
    """`url` with its scheme lower-cased (`HTTP://` is a URL like `http://`), or BadURL naming `source`
    (the option or file the URL came from), what is wrong and the fix."""
    problem = url_problem(url, schemes)
    if problem is not None:
        raise BadURL(f"{source} {shown_url(url)}: {problem}")
    scheme, rest = url.split("://", 1)
    return f"{scheme.lower()}://{rest}"


class _Watch:
    """The deadline of one transfer, enforced on the socket itself: when it passes, the socket is shut
    down, so no read (the status line and headers included) outlasts it, however slowly bytes come."""

    def __init__(self, deadline_s: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + deadline_s
        self.fired = False
        self._sock: socket.socket | None = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
        self._restart()

    def extend(self, deadline_s: float) -> None:
        """A new deadline from now (the body's, once the headers are in)."""
        self.deadline = time.monotonic() + deadline_s
        self._restart()

    def _restart(self) -> None:
        self.cancel()
        timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._fire)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


class _WatchedHTTP(http.client.HTTPConnection):
    """A connection whose socket the watch arms as soon as it is open (HTTPS: after the handshake)."""

    def __init__(self, *args: Any, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch = watch

    def connect(self) -> None:
        super().connect()
        assert self.sock is not None
        self._watch.arm(self.sock)


class _WatchedHTTPS(_WatchedHTTP, http.client.HTTPSConnection):
    """HTTPSConnection's connect (TCP, then TLS) runs as _WatchedHTTP's super().connect()."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_WatchedHTTP, watch=self.watch), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        context = self._context  # type: ignore[attr-defined]
        return self.do_open(functools.partial(_WatchedHTTPS, watch=self.watch), req, context=context)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows at most MAX_REDIRECTS redirects, only to well-formed http(s) URLs, never https -> http."""

    max_redirections = MAX_REDIRECTS
    max_repeats = 1

    def http_error_302(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any) -> Any:
        # Checked here, before urllib's own check (which lets ftp:// through) and its urljoin (which
        # raises on an unclosed `[`).
        location = headers.get("location") or headers.get("uri") or ""
        try:
            newurl = urllib.parse.urljoin(req.full_url, location)
        except ValueError:
            newurl = location
        problem = url_problem(newurl, WEB_SCHEMES)
        if problem is None and req.type == "https" and newurl.lower().startswith("http://"):
            problem = "from https down to plain http"
        if problem is not None:
            raise FetchError(
                f"{shown_url(req.full_url)}: the server redirects to {shown_url(newurl)}, which fa does "
                f"not follow ({problem.split(';')[0]}); use the final URL, or fix the server"
            )
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


def _opener(watch: _Watch) -> urllib.request.OpenerDirector:
    """urllib's opener with only what fa uses: proxies from the environment, http(s) under the watch's
    deadline, file://, and the bounded redirects (no ftp://, data: or other schemes)."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        urllib.request.UnknownHandler(),
        _HTTPHandler(watch),
        _HTTPSHandler(watch),
        urllib.request.FileHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        _Redirects(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


def _problem(exc: BaseException) -> str:
    """What went wrong, in words, for any exception urllib and http.client raise (the server's own text
    escaped and cut short)."""
    if isinstance(exc, urllib.error.HTTPError):
        if 300 <= exc.code < 400:
            return f"more than {MAX_REDIRECTS} redirects, or a redirect loop (HTTP {exc.code})"
        return f"the server answered HTTP {exc.code} {printable(str(exc.reason))[:80]}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        return _problem(reason) if isinstance(reason, BaseException) else printable(str(reason))[:200]
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    if isinstance(exc, http.client.BadStatusLine):
        return "the server's answer does not start with an HTTP status line (not an HTTP server?)"
    if isinstance(exc, http.client.LineTooLong):
        return "the server sent a header or status line longer than HTTP allows"
    if isinstance(exc, http.client.IncompleteRead):
        return f"the body broke off after {len(exc.partial)} bytes (closed early, or bad chunked framing)"
    if isinstance(exc, http.client.HTTPException):
        text = printable(str(exc))[:200]
        if "headers" in text:
            return "the server sent more than 100 headers"
        return f"the server's answer is not valid HTTP ({text or type(exc).__name__})"
    if isinstance(exc, TimeoutError):
        return f"no answer within {TIMEOUT_S} s"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({printable(str(exc))[:200]})"
    if isinstance(exc, socket.gaierror):
        return f"the host name does not resolve ({exc.strerror})"
    if isinstance(exc, OSError):
        return exc.strerror or printable(str(exc))[:200] or type(exc).__name__
    return printable(str(exc))[:200] or type(exc).__name__


# What urllib, http.client and the socket layer raise for a bad server or network (ValueError: a URL
# from a redirect, or a header value, http.client cannot use).
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, OSError, ValueError)


@contextlib.contextmanager
def _opened(
    url: str,
    what: str,
    headers: dict[str, str] | None = None,
    method: str | None = None,
    head_deadline_s: float = HEAD_DEADLINE_S,
) -> Iterator[tuple[Any, _Watch]]:
    """The response to a request for `url`, its status line and headers read within `head_deadline_s`;
    every failure becomes one FetchError naming `what` (e.g. "cannot fetch URL"), the problem and a fix.
    The caller extends the watch for the body."""
    problem = url_problem(url)
    if problem is not None:
        raise FetchError(f"{what}: {problem}")
    watch = _Watch(head_deadline_s)
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})}, method=method)
    try:
        with _opener(watch).open(req, timeout=TIMEOUT_S) as resp:
            yield resp, watch
    except _NETWORK_ERRORS as exc:
        if watch.fired:
            raise _too_slow(what, watch) from None
        raise FetchError(f"{what}: {_problem(exc)}; {NETWORK_FIX}") from None
    except FetchError:
        if watch.fired:  # a body cut short by the deadline's shutdown: say it was the deadline
            raise _too_slow(what, watch) from None
        raise
    finally:
        watch.cancel()
    if watch.fired:  # the shut-down socket read as the end of the body: a cut-off, not a whole file
        raise _too_slow(what, watch)


def _too_slow(what: str, watch: _Watch) -> FetchError:
    return FetchError(
        f"{what}: not finished after {time.monotonic() - watch.start:.0f} s; stopped reading (a stalled "
        "or very slow server: retry later, or use a mirror)"
    )


class _Budget:
    """The size and time a transfer may take; `check(done)` raises FetchError once it is exceeded."""

    def __init__(self, url: str, max_bytes: int, deadline_s: float | None) -> None:
        self.url = shown_url(url)
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
    after every piece, so neither an endless body nor a trickle runs on; and, when the server declared
    a length, checked to be whole (http.client returns a body cut short as if it had ended)."""
    read = getattr(resp, "read1", None) or resp.read
    declared = None if getattr(resp, "chunked", False) else _declared(resp)
    done = 0
    budget.check(done)
    while chunk := read(min(CHUNK, budget.max_bytes - done + 1)):
        done += len(chunk)
        budget.check(done)
        yield chunk
    if declared is not None and done < declared:
        raise FetchError(
            f"{budget.url}: the body broke off after {done} of the {declared} bytes the server declared; "
            f"{NETWORK_FIX}"
        )


def _declared(resp: Any) -> int | None:
    raw = resp.headers.get("Content-Length") if getattr(resp, "headers", None) is not None else None
    if raw is None or not raw.strip().isascii() or not raw.strip().isdigit() or len(raw.strip()) > 20:
        return None
    return int(raw.strip())


def read_url(
    url: str,
    headers: dict[str, str] | None = None,
    *,
    max_bytes: int | None = None,
    deadline_s: float | None = None,
) -> bytes:
    """The body of `url`, at most `max_bytes` (default MAX_PAGE_BYTES), within `deadline_s` seconds
    (default PAGE_DEADLINE_S) for the whole transfer."""
    cap = MAX_PAGE_BYTES if max_bytes is None else max_bytes
    deadline = PAGE_DEADLINE_S if deadline_s is None else deadline_s
    shown = shown_url(url)
    with _opened(url, f"cannot fetch {shown}", headers, head_deadline_s=min(deadline, HEAD_DEADLINE_S)) as (
        resp,
        watch,
    ):
        watch.extend(deadline - (time.monotonic() - watch.start))  # the whole transfer, headers included
        declared = _declared(resp)
        if declared is not None and declared > cap:
            raise FetchError(
                f"{shown}: declares {declared} bytes, more than the {cap} fa reads from it; check the URL"
            )
        return b"".join(_chunks(resp, _Budget(url, cap, deadline)))


T = TypeVar("T")


def _local(dest: Path, action: Callable[[], T]) -> T:
    """`action()`, a write to the local file: its OSError (a full disk) is a WriteError naming `dest`,
    not a network problem."""
    try:
        return action()
    except OSError as exc:
        raise atomic.WriteError(dest, exc) from None


def _check_space(url: str, dest: Path, needed: int) -> None:
    """Refuses a download that cannot fit where it lands, before a byte is written."""
    folder = dest.parent
    while not folder.exists() and folder != folder.parent:  # the folder the download will create
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # the write itself will name the folder
    if needed > free:
        raise FetchError(
            f"{shown_url(url)}: {needed} bytes to download, only {free} free in {dest.parent}; free space "
            "there (or point TMPDIR / FA_CACHE elsewhere) and retry"
        )


def download(
    url: str,
    dest: Path,
    sha256: str | None,
    progress: ProgressHook | None = None,
    *,
    size: int | None = None,
    max_bytes: int = MAX_DOWNLOAD_BYTES,
) -> Path:
    """Stream `url` to `dest`. With `sha256`, a mismatch is refused and nothing lands at `dest`. With
    `size` (what an index declares), a body of any other length is refused; without it, the server's
    Content-Length caps it. Either way the expected size must be at most `max_bytes` and fit in the free
    space of dest's folder, checked before a byte is written."""
    shown = shown_url(url)
    if size is not None and size > max_bytes:
        raise FetchError(
            f"{shown}: the index declares {size} bytes, more than the {max_bytes} a file of this kind can "
            "be; refusing it (check the index)"
        )
    h = hashlib.sha256()
    with _opened(url, f"cannot download {shown}") as (resp, watch):
        declared = _declared(resp)
        if size is not None and declared is not None and declared != size:
            raise FetchError(f"{shown}: the server declares {declared} bytes, the index {size}; refusing it")
        if declared is not None and declared > max_bytes:
            raise FetchError(
                f"{shown}: the server declares {declared} bytes, more than the {max_bytes} a file of this "
                "kind can be; refusing it (check the URL)"
            )
        cap = size if size is not None else (declared if declared is not None else max_bytes)
        _check_space(url, dest, size if size is not None else (declared or 0))
        deadline = GRACE_S + cap / MIN_RATE_BPS
        watch.extend(deadline)
        budget = _Budget(url, cap, deadline)
        done = 0
        with atomic.writing(dest) as tmp, _local(dest, lambda: tmp.open("wb")) as out:
            for chunk in _chunks(resp, budget):
                _local(dest, functools.partial(out.write, chunk))
                h.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done, size or declared)
            out.flush()
            if size is not None and done != size:
                raise FetchError(
                    f"{shown}: got {done} bytes, the index declares {size}; refusing it (truncated)"
                )
            if sha256 is not None and h.hexdigest() != sha256.lower():
                raise FetchError(
                    f"{shown}: sha256 {h.hexdigest()} does not match the pinned {sha256}; refusing it "
                    "(a tampered or truncated download; retry, and if it persists check the pin)"
                )
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
    shown = shown_url(url)
    deadline = GRACE_S + (end - start) / MIN_RATE_BPS
    with _opened(
        url, f"cannot read bytes {start}-{end} of {shown}", {"Range": f"bytes={start}-{end - 1}"}
    ) as (
        resp,
        watch,
    ):
        if resp.status != 206:
            return b"", False
        watch.extend(deadline)
        data = b"".join(_chunks(resp, _Budget(url, end - start, deadline)))
    if len(data) != end - start:
        raise FetchError(f"{shown}: asked for {end - start} bytes at {start}, got {len(data)}")
    return data, True


def content_length(url: str) -> int:
    with _opened(url, f"cannot read the size of {shown_url(url)}", method="HEAD") as (resp, _):
        length = _declared(resp)
    if length is None:
        raise FetchError(f"cannot read the size of {shown_url(url)}: no Content-Length in its answer")
    return length
