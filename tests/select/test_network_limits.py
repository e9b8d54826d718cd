"""Nothing a server sends is trusted to end: an endless index.json, a wheel body longer than index.json
declares and a server trickling a byte at a time are each cut off, by size or by a deadline for the
whole transfer (not only per socket read), with a message naming the URL."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildtool.compat import wheel_index
from buildtool.compat.wheel_index import WheelIndex, WheelIndexError, entry_from_dict, fetch_wheel, load_index
from buildtool.core import fetch
from tests.select.fixture_index import kernel_entry


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "endless"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        mode = type(self).mode
        try:
            if mode == "endless":  # chunked, never ends
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                block = b"[" * 65536
                while True:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
            elif mode == "longer":  # declares nothing, sends more than the index says
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                while True:
                    self.wfile.write(b"\0" * 65536)
            elif mode == "huge":  # declares more than fa reads
                self.send_response(200)
                self.send_header("Content-Length", str(1 << 40))
                self.end_headers()
                self.wfile.write(b"{")
            elif mode == "trickle":  # a byte at a time: each read is quick, the whole never ends
                self.send_response(200)
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                while True:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", handler
    httpd.shutdown()
    httpd.server_close()


def test_an_endless_index_is_cut_off_by_size(server, monkeypatch):
    url, handler = server
    handler.mode = "endless"
    monkeypatch.setattr(wheel_index, "MAX_INDEX_BYTES", 1 << 20)
    t0 = time.monotonic()
    with pytest.raises(WheelIndexError, match=r"more than 1048576 bytes") as err:
        load_index(url)
    assert url in str(err.value) and time.monotonic() - t0 < 30


def test_an_index_declaring_a_huge_size_is_refused_before_reading(server):
    url, handler = server
    handler.mode = "huge"
    with pytest.raises(WheelIndexError, match="declares 1099511627776 bytes"):
        load_index(url)


def test_a_trickling_index_is_cut_off_by_the_deadline(server, monkeypatch):
    url, handler = server
    handler.mode = "trickle"
    monkeypatch.setattr(wheel_index, "INDEX_DEADLINE_S", 1.0)
    t0 = time.monotonic()
    with pytest.raises(WheelIndexError, match=r"not finished after 1 s"):
        load_index(url)
    assert time.monotonic() - t0 < 10  # each read took 0.1 s; only the total deadline can stop it


def test_a_trickling_download_is_cut_off_by_the_minimum_rate(server, monkeypatch, tmp_path):
    url, handler = server
    handler.mode = "trickle"
    monkeypatch.setattr(fetch, "GRACE_S", 0.5)
    monkeypatch.setattr(fetch, "MIN_RATE_BPS", 1000)
    dest = tmp_path / "x.whl"
    with pytest.raises(fetch.FetchError, match="on average"):
        fetch.download(url + "x.whl", dest, None)
    assert list(tmp_path.iterdir()) == []


def test_a_wheel_body_longer_than_the_index_declares_is_refused(server, tmp_path):
    url, handler = server
    handler.mode = "longer"
    entry = entry_from_dict({**kernel_entry(12, "2.13", True), "size": 100_000}, "index.json")
    dest_dir = tmp_path / "dl"
    dest_dir.mkdir()
    with pytest.raises(WheelIndexError, match="more than 100000 bytes"):
        fetch_wheel(WheelIndex(location=url, entries=(entry,)), entry, dest_dir)
    assert list(dest_dir.iterdir()) == []


def test_a_local_wheel_of_another_size_is_refused(tmp_path):
    entry = entry_from_dict({**kernel_entry(12, "2.13", True), "size": 10}, "index.json")
    house = tmp_path / "house"
    house.mkdir()
    (house / entry.file).write_bytes(b"x" * 11)
    dest_dir = tmp_path / "dl"
    dest_dir.mkdir()
    with pytest.raises(WheelIndexError, match="11 bytes but the index says 10"):
        fetch_wheel(WheelIndex(location=str(house), entries=(entry,)), entry, dest_dir)
    assert list(dest_dir.iterdir()) == []


def test_a_special_file_named_like_the_wheel_is_refused(tmp_path):
    entry = entry_from_dict({**kernel_entry(12, "2.13", True), "size": None}, "index.json")
    house = tmp_path / "house"
    house.mkdir()
    (house / entry.file).symlink_to("/dev/zero")
    dest_dir = tmp_path / "dl"
    dest_dir.mkdir()
    with pytest.raises(WheelIndexError, match="not a regular file"):
        fetch_wheel(WheelIndex(location=str(house), entries=(entry,)), entry, dest_dir)


def test_unsupported_url_schemes_are_named(tmp_path: Path):
    with pytest.raises(WheelIndexError, match=r"not ftp://"):
        load_index("ftp://example.org/wheels/")
