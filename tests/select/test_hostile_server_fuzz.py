"""Property-based fuzz of what an index server and an --index URL can hand fa (hypothesis): whatever
the URL, and whatever bytes a server on 127.0.0.1 answers with (status line, headers, framing, body),
loading the index gives a WheelIndex or fa's own error with a short, printable message; nothing else.
No request leaves 127.0.0.1: a URL to any other host is only checked, never opened."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from buildtool.compat.wheel_index import WheelIndex, is_url, load_index, wheel_location
from buildtool.core import fetch
from tests.hostile import NASTY_STRINGS, fa_errors_only, mutated
from tests.select.fixture_index import kernel_entry
from tests.select.raw_http import RawServer, raw_server

VALID = {"schema": 1, "package": "fa-attn", "wheels": [kernel_entry(12, "2.13", True)]}


@pytest.fixture(scope="module")
def server() -> Iterator[RawServer]:
    with raw_server() as running:
        yield running


def _local_only(location: str, server: RawServer) -> bool:
    """True unless `location` is an http(s) URL fa would open to a host other than this server's."""
    if not is_url(location) or fetch.url_problem(location) is not None:
        return True
    parts = urllib.parse.urlsplit(location)
    if parts.scheme.lower() not in fetch.WEB_SCHEMES:
        return True
    return parts.hostname == "127.0.0.1" and parts.port == urllib.parse.urlsplit(server.url).port


url_texts = st.one_of(
    st.text(max_size=60),
    st.sampled_from(NASTY_STRINGS),
    st.builds(
        "".join,
        st.lists(
            st.sampled_from(
                [
                    "http",
                    "HTTP",
                    "https",
                    "ftp",
                    "file",
                    "://",
                    ":",
                    "/",
                    "[",
                    "]",
                    "::1",
                    "127.0.0.1",
                    "@",
                    "%",
                    "?",
                ]
            )
            | st.text(max_size=5),
            max_size=8,
        ),
    ),
)


@given(url_texts)
@example("http://[::1/")
@example("HTTP://127.0.0.1:99999/")
@example("http://127.0.0.1:0x50/")
@example("file://%00/")
def test_any_location_is_checked_or_refused(location):
    problem = fetch.url_problem(location)
    assert problem is None or (problem.isprintable() and len(problem) < 400)
    result = fa_errors_only(lambda: fetch.checked_url(location, "--index"))
    if isinstance(result, str):
        assert result.split("://", 1)[0].islower()


@given(st.text(max_size=40) | st.sampled_from(NASTY_STRINGS))
@example("a b")
@example("%")
@example("\x00")
def test_any_path_on_the_server_is_read_or_refused(server, path):
    url = server.url + path
    server.answers["/index.json"] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    if not _local_only(url, server):
        return
    fa_errors_only(lambda: load_index(url))


@st.composite
def http_answers(draw: st.DrawFn) -> bytes:
    """What a server may send: an HTTP-ish status line, headers (framing among them) and a body that is
    index.json, mutated index.json, or bytes."""
    status = draw(
        st.sampled_from(
            [
                b"HTTP/1.1 200 OK",
                b"HTTP/1.0 200 OK",
                b"HTTP/1.1 302 Found",
                b"HTTP/1.1 500 Oops",
                b"HTTP/9 2",
                b"",
            ]
        )
        | st.binary(max_size=30)
    )
    body = draw(
        st.sampled_from([json.dumps(VALID).encode()])
        | mutated(VALID).map(lambda doc: json.dumps(doc).encode())
        | st.binary(max_size=200)
    )
    headers = draw(
        st.lists(
            st.sampled_from(
                [
                    b"Content-Length: %d" % len(body),
                    b"Content-Length: %d" % (len(body) + 7),
                    b"Content-Length: -1",
                    b"Content-Length: 99999999999999999999999",
                    b"Transfer-Encoding: chunked",
                    b"Location: ftp://127.0.0.1/",
                    b"Location: http://[::1",
                    b"Location: /index.json",
                    b"Content-Type: application/json",
                    b"X: " + b"a" * 70_000,
                ]
            )
            | st.binary(max_size=40),
            max_size=6,
        )
    )
    if b"Transfer-Encoding: chunked" in headers and draw(st.booleans()):
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return status + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body


@given(http_answers())
@example(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
@example(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n")
def test_any_answer_is_an_index_or_fa_error(server, answer):
    server.answers["/fuzz/index.json"] = answer
    index = fa_errors_only(lambda: load_index(server.url + "fuzz/"))
    if isinstance(index, WheelIndex):
        for entry in index.entries:
            assert wheel_location(index, entry).startswith(server.url)
