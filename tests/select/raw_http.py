"""A misbehaving HTTP server on 127.0.0.1, written on raw sockets so that it can send what no HTTP
library would: a status line that is not HTTP, a 70 KB header, 101 headers, broken chunked framing, a
body cut short, headers trickled a byte at a time, redirects anywhere.

`RawServer.answers` maps a request path to the bytes sent back (or to a function that writes to the
socket itself); the connection is closed after each answer. Every connection is bounded in time, and
the server stops with the fixture that started it.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

Answer = bytes | Callable[[socket.socket], None]
REQUEST_TIMEOUT_S = 5.0


def response(status: str = "200 OK", body: bytes = b"", headers: tuple[str, ...] = ()) -> bytes:
    """A well-formed HTTP/1.1 answer (Content-Length set, connection closed after)."""
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def redirect(location: str, status: str = "302 Found") -> bytes:
    return response(status, headers=(f"Location: {location}",))


def trickle(data: bytes, every_s: float) -> Callable[[socket.socket], None]:
    """Sends `data` a byte at a time, `every_s` apart: each read is quick, the whole never ends."""

    def send(conn: socket.socket) -> None:
        for i in range(len(data)):
            conn.sendall(data[i : i + 1])
            time.sleep(every_s)

    return send


class RawServer:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls  # an https server when set
        self.answers: dict[str, Answer] = {}
        self.requests: list[bytes] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self._sock.getsockname()[1]}/"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(REQUEST_TIMEOUT_S)
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                piece = conn.recv(4096)
                if not piece:
                    return
                head += piece
            self.requests.append(head)
            target = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else "/"
            path = target.split("?", 1)[0]
            answer = self.answers.get(path, response("404 Not Found", b"no such file"))
            if callable(answer):
                answer(conn)
            else:
                conn.sendall(answer)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()


@contextlib.contextmanager
def raw_server(tls: ssl.SSLContext | None = None) -> Iterator[RawServer]:
    server = RawServer(tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()
