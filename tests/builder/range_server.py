"""A local HTTP server for the build tests: serves a folder, honouring `Range: bytes=a-b` unless told
to ignore it (like a server or proxy without range support)."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a directory, honouring single `Range: bytes=a-b` requests unless `ignore_range`."""

    ignore_range = False

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        rng = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if not rng or self.ignore_range or not path.is_file():
            return super().do_GET()
        data = path.read_bytes()
        spec = rng.split("=", 1)[1]
        first, _, last = spec.partition("-")
        if first == "":
            start, end = len(data) - int(last), len(data)
        else:
            start, end = int(first), (int(last) + 1 if last else len(data))
        body = data[start:end]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve(directory: Path, ignore_range: bool = False) -> tuple[str, http.server.ThreadingHTTPServer]:
    handler = type("H", (_RangeHandler,), {"ignore_range": ignore_range})

    def make(*args: object, **kwargs: object) -> _RangeHandler:
        return handler(*args, directory=str(directory), **kwargs)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server
