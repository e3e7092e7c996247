"""A small hostile S3 stand-in for tests: serves a folder's files as objects of any bucket
(HEAD and GET with Range, the requests obstore makes) and misbehaves on demand.

    with HostileS3(folder) as server:
        server.faults["shard-00000.rec"] = "long"    # see FAULTS
        env = server.env()                            # AWS_* variables pointing at it

Faults (per object name, "*" for every object): "long" (a correct Content-Range but a body
longer than asked, with a Content-Length that matches the long body), "endless" (a
Content-Length of 1 TB and a body that never ends), "slow" (one byte every 0.5 s),
"flip" (the right length, one byte flipped), "huge-size" (HEAD claims a 1 PB object).
Every request is recorded in ``requests`` as (method, object name, Range header).
"""
from __future__ import annotations

import http.server
import os
import socketserver
import threading
from email.utils import formatdate
from urllib.parse import unquote

FAULTS = ("long", "endless", "slow", "flip", "huge-size")


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # a client cutting a body off is what the tests want, not news


class HostileS3:
    """Threads on 127.0.0.1, a free port; a context manager (stops the server on exit)."""

    def __init__(self, folder):
        self.folder = str(folder)
        self.faults: dict[str, str] = {}
        self.requests: list = []
        self.stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _handler(self))
        self.port = self._httpd.server_address[1]

    def env(self) -> dict:
        """AWS_* variables that point obstore at this server."""
        return {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}", "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "hostile", "AWS_SECRET_ACCESS_KEY": "hostile-secret"}

    def fault(self, name: str) -> str | None:
        """The fault configured for object ``name``."""
        return self.faults.get(name, self.faults.get("*"))

    def __enter__(self):
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(server: HostileS3):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _object(self):
            # the last part of the key; GCS's XML API sends the key's "/" as %2F
            name = unquote(self.path.split("?")[0]).rstrip("/").rsplit("/", 1)[-1]
            path = os.path.join(server.folder, name)
            data = open(path, "rb").read() if os.path.isfile(path) else None
            return name, data

        def _common(self, size: int):
            self.send_header("ETag", '"hostile-etag"')
            self.send_header("Last-Modified", formatdate(usegmt=True))
            self.send_header("Content-Type", "application/octet-stream")

        def do_HEAD(self):  # noqa: N802
            name, data = self._object()
            server.requests.append(("HEAD", name, None))
            if data is None:
                return self._missing()
            size = 2**50 if server.fault(name) == "huge-size" else len(data)
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self._common(size)
            self.end_headers()

        def _missing(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):  # noqa: N802
            name, data = self._object()
            rng = self.headers.get("Range")
            server.requests.append(("GET", name, rng))
            if data is None:
                return self._missing()
            start, end = 0, len(data)
            if rng:
                a, b = rng.split("=")[1].split("-")
                start, end = int(a), min(int(b) + 1, len(data))
            body, fault = data[start:end], server.fault(name)
            self.send_response(206 if rng else 200)
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self._common(len(data))
            if fault == "long":
                body = body + b"\xAA" * (len(body) + 4096)
            elif fault == "flip" and body:
                body = bytes([body[0] ^ 0xFF]) + body[1:]
            if fault == "endless":
                return self._endless()
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if fault == "slow":
                return self._slow(body)
            self.wfile.write(body)

        def _endless(self):
            self.send_header("Content-Length", str(2**40))
            self.end_headers()
            chunk = b"\x55" * 65536
            try:
                while not server.stopping.is_set():
                    self.wfile.write(chunk)
            except OSError:
                pass  # the client cut us off: what it should do

        def _slow(self, body):
            try:
                for i in range(len(body)):
                    if server.stopping.wait(0.5):  # a drip, not a synchronisation
                        return
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
            except OSError:
                pass
    return Handler
