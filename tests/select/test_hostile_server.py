"""What an index server (or a person typing --index) can do to fa: a real misbehaving server on
127.0.0.1 (raw sockets, tests/select/raw_http.py) and malformed URLs. Each ends in one line naming the
URL or option, what was wrong and the fix, exit 1 for the network and 2 for bad input; never a
traceback."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from buildtool.compat import wheel_index
from buildtool.compat.wheel_index import (
    IndexServerError,
    WheelIndex,
    WheelIndexError,
    entry_from_dict,
    fetch_wheel,
    load_index,
    wheel_location,
)
from buildtool.core import atomic, fetch
from buildtool.errors import EXIT_FAILED, EXIT_USAGE
from tests.hostile import small_filesystem
from tests.select.fixture_index import kernel_entry
from tests.select.raw_http import raw_server, redirect, response, trickle

REPO = Path(__file__).resolve().parents[2]
ENV = REPO / "tests/select/envs/a100-ngc-24.10.json"
INDEX = {"schema": 1, "package": "fa-attn", "wheels": [kernel_entry(12, "2.13", True)]}


def fa_doctor(index: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "buildtool.cli", "doctor", "--index", index, "--env", str(ENV)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **env},
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error, checked to be a single printable `error:` line with no traceback."""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    if lines and lines[0].startswith("fa doctor: "):  # what it was doing (commands.say), then the error
        lines = lines[1:]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    assert lines[0].isprintable()
    assert len(lines[0]) < 600
    return lines[0]


# What a server sends back for index.json, and a word the message must hold.
BROKEN_ANSWERS = {
    "not-http": (b"HELLO THERE\r\n\r\n", "status line"),
    "long-header": (
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n{}",
        "longer than HTTP allows",
    ),
    "101-headers": (
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n{}",
        "more than 100 headers",
    ),
    "bad-chunk-size": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        "chunked framing",
    ),
    "chunk-cut-short": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100\r\n{}", "chunked framing"),
    "body-cut-short": (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{}", "broke off"),
    "no-answer": (b"", "without"),
    "server-error": (response("500 \x1b[31mOops"), "HTTP 500"),
    "redirect-to-ftp": (redirect("ftp://127.0.0.1/index.json"), "not ftp://"),
    "redirect-to-file": (redirect("file:///etc/passwd"), "not file://"),
    "redirect-malformed": (redirect("http://[::1/index.json"), "Invalid IPv6"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_ANSWERS))
def test_a_broken_server_is_one_network_error(case):
    answer, said = BROKEN_ANSWERS[case]
    with raw_server() as server:
        server.answers["/index.json"] = answer
        url = server.url
        done = fa_doctor(url)
    line = one_line_error(done)
    assert done.returncode == EXIT_FAILED, line
    assert url in line
    assert said in line
    assert "\x1b" not in line


def test_redirects_are_bounded():
    with raw_server() as server:
        for i in range(10):
            server.answers[f"/r{i}/index.json"] = redirect(f"{server.url}r{i + 1}/index.json")
        with pytest.raises(IndexServerError, match=r"more than 5 redirects"):
            load_index(server.url + "r0/")
        assert len(server.requests) == fetch.MAX_REDIRECTS + 1


def test_a_redirect_loop_stops():
    with raw_server() as server:
        server.answers["/index.json"] = redirect(server.url + "index.json")
        with pytest.raises(IndexServerError, match=r"redirect loop"):
            load_index(server.url)


def test_a_redirect_among_http_urls_is_followed():
    with raw_server() as server:
        server.answers["/old/index.json"] = redirect(server.url + "new/index.json", "301 Moved Permanently")
        server.answers["/new/index.json"] = response(body=json.dumps(INDEX).encode())
        index = load_index(server.url + "old/")
    assert [e.file for e in index.entries] == [INDEX["wheels"][0]["file"]]


@pytest.fixture
def tls(tmp_path, monkeypatch):
    """A server-side TLS context for 127.0.0.1 whose self-signed certificate fa trusts (SSL_CERT_FILE)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_https_is_read_and_never_redirected_down_to_http(tls):
    with raw_server(tls) as server, raw_server() as plain:
        server.answers["/index.json"] = response(body=json.dumps(INDEX).encode())
        assert load_index(server.url).entries  # the certificate is trusted: https works
        server.answers["/down/index.json"] = redirect(plain.url + "index.json")
        plain.answers["/index.json"] = response(body=json.dumps(INDEX).encode())
        with pytest.raises(IndexServerError, match="from https down to plain http"):
            load_index(server.url + "down/")
        assert plain.requests == []


def test_trickled_headers_are_cut_off_by_the_deadline(monkeypatch):
    monkeypatch.setattr(wheel_index, "INDEX_DEADLINE_S", 1.0)
    with raw_server() as server:
        # Headers that never end, a byte every 0.1 s: each socket read is quick.
        server.answers["/index.json"] = trickle(b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 1000, 0.1)
        t0 = time.monotonic()
        with pytest.raises(IndexServerError, match=r"not finished after 1 s"):
            load_index(server.url)
        assert time.monotonic() - t0 < 5


def test_an_upper_case_scheme_is_a_url_not_a_path():
    with raw_server() as server:
        server.answers["/index.json"] = response(body=json.dumps(INDEX).encode())
        index = load_index(server.url.replace("http://", "HTTP://"))
        entry = index.entries[0]
        assert wheel_location(index, entry) == server.url + urllib.parse.quote(entry.file)


def test_an_upper_case_scheme_is_named_when_unsupported():
    with pytest.raises(WheelIndexError, match=r"not ftp://"):
        load_index("FTP://example.org/wheels/")


# (what --index gets, a word the message must hold); none of these reaches the network.
MALFORMED = {
    "space": ("http://127.0.0.1:9/my wheels/", "a space at position"),
    "control": ("http://127.0.0.1:9/\x1b[31mred/", "control character"),
    "bad-port": ("http://127.0.0.1:99999/", "not a number from 1 to 65535"),
    "word-port": ("http://127.0.0.1:http/", "not a number from 1 to 65535"),
    "port-zero": ("http://127.0.0.1:0/", "port 0"),
    "unclosed-bracket": ("http://[::1/", "Invalid IPv6 URL"),
    "no-host": ("http:///wheels/", "no host name"),
    "non-ascii": ("http://127.0.0.1:9/\u00e9t\u00e9/", "non-ASCII"),
}


def test_an_over_long_url_is_refused_before_it_is_parsed():
    """Any argument over 4096 characters is refused at the edge (commands/_options.py), so a 20,000
    character URL never reaches the URL checks (whose own cap, 8192, guards FA_PYPI_SIMPLE)."""
    done = fa_doctor("http://127.0.0.1:9/" + "a" * 20_000, PYTHONIOENCODING="ascii")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.startswith("error: --index: a value of 20019 characters")
    assert "at most 4096 characters" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.isascii()
    assert max(len(line) for line in done.stderr.splitlines()) < 200


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_url_is_one_input_error(case):
    url, said = MALFORMED[case]
    done = fa_doctor(url, PYTHONIOENCODING="ascii")
    line = one_line_error(done)
    assert done.returncode == EXIT_USAGE, line
    assert line.startswith("error: --index http://")
    assert said in line
    assert line.isascii()


def test_an_over_long_path_is_refused_at_the_edge(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "buildtool.cli",
            "doctor",
            "--wheels",
            str(tmp_path / ("a" * 5000)),
            "--env",
            str(ENV),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    # refused at the edge (commands/_options.py: no argument over 4096 characters), never echoed whole
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.startswith("error: --wheels: a value of ")
    assert "Traceback" not in done.stderr
    assert max(len(line) for line in done.stderr.splitlines()) < 200


def test_a_refused_connection_names_the_url_and_exits_1():
    with raw_server() as server:
        url = server.url
    done = fa_doctor(url)  # the server is gone: nothing listens on its port now
    line = one_line_error(done)
    assert done.returncode == EXIT_FAILED
    assert url in line
    assert "refused" in line


def test_two_entries_for_one_file_with_different_hashes_are_refused(tmp_path):
    first = kernel_entry(12, "2.13", True)
    (tmp_path / "index.json").write_text(
        json.dumps({**INDEX, "wheels": [first, {**first, "sha256": "1" * 64}]})
    )
    with pytest.raises(
        WheelIndexError, match=r"wheels\[0\] and wheels\[1\] both describe .* differ in sha256"
    ):
        load_index(str(tmp_path))


def test_the_same_entry_twice_is_read_once_as_written(tmp_path):
    first = kernel_entry(12, "2.13", True)
    (tmp_path / "index.json").write_text(json.dumps({**INDEX, "wheels": [first, first]}))
    assert len(load_index(str(tmp_path)).entries) == 2


def _entry(size: int | None):
    return entry_from_dict({**kernel_entry(12, "2.13", True), "size": size}, "index.json")


def test_a_declared_terabyte_is_refused_before_a_byte(tmp_path):
    entry = _entry(1 << 40)
    with raw_server() as server:
        with pytest.raises(WheelIndexError, match=r"declares 1099511627776 bytes, more than the 536870912"):
            fetch_wheel(WheelIndex(location=server.url, entries=(entry,)), entry, tmp_path)
        assert server.requests == []
    assert list(tmp_path.iterdir()) == []


def test_a_server_declaring_a_terabyte_is_refused_before_a_byte(tmp_path):
    with raw_server() as server:
        server.answers["/big.whl"] = (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n" + b"\0" * 1000
        )
        with pytest.raises(fetch.FetchError, match=r"declares 1099511627776 bytes, more than the"):
            fetch.download(server.url + "big.whl", tmp_path / "big.whl", None)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB file system (tmpfs), as root; skipped where mounting is not allowed."""
    with small_filesystem(tmp_path / "small", "1m") as mount:
        yield mount


def test_a_download_larger_than_the_free_space_is_refused_before_a_byte(small_disk):
    with raw_server() as server:
        server.answers["/x.whl"] = response(body=b"\0" * (2 << 20))
        with pytest.raises(
            fetch.FetchError, match=rf"2097152 bytes to download, only \d+ free in {small_disk}"
        ):
            fetch.download(server.url + "x.whl", small_disk / "x.whl", None)
    assert list(small_disk.iterdir()) == []


def test_a_full_disk_during_a_download_names_the_file(small_disk):
    with raw_server() as server:  # no Content-Length: the space cannot be checked up front
        server.answers["/x.whl"] = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"\0" * (2 << 20)
        with pytest.raises(atomic.WriteError, match=rf"cannot write {small_disk / 'x.whl'}: No space left"):
            fetch.download(server.url + "x.whl", small_disk / "x.whl", None)
    assert list(small_disk.iterdir()) == []


@pytest.mark.parametrize(
    "mirror", ["http://[::1/simple", "https://mirror.example:port/simple", "ftp://m/simple"]
)
def test_a_malformed_mirror_is_named_by_its_variable(monkeypatch, mirror):
    monkeypatch.setenv("FA_PYPI_SIMPLE", mirror)
    with pytest.raises(fetch.BadURL, match=r"^FA_PYPI_SIMPLE ") as err:
        fetch.simple_index()
    assert err.value.exit_code == EXIT_USAGE


def test_an_upper_case_mirror_scheme_is_read_as_a_url(monkeypatch):
    monkeypatch.setenv("FA_PYPI_SIMPLE", "HTTPS://mirror.example/simple/")
    assert fetch.simple_index() == "https://mirror.example/simple"


def _served(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def test_a_byte_order_mark_is_read_past_over_http_as_in_a_file():
    """Round three: a UTF-8 BOM before index.json over HTTP was 'not JSON (Unexpected UTF-8 BOM)',
    where the same file on disk is read."""
    with raw_server() as server:
        server.answers["/index.json"] = _served(b"\xef\xbb\xbf" + json.dumps(INDEX).encode())
        index = load_index(server.url)
    assert [e.file for e in index.entries] == [INDEX["wheels"][0]["file"]]


def test_a_utf16_index_over_http_is_named_as_such():
    body = json.dumps(INDEX).encode("utf-16")  # with its byte order mark
    with raw_server() as server:
        server.answers["/index.json"] = _served(body)
        url = server.url
        done = fa_doctor(url)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert f"{url}index.json: UTF-16 text" in done.stderr
    assert "fix: " in done.stderr
    assert "Traceback" not in done.stderr
