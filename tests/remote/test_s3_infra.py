"""The S3 test infrastructure itself: the SeaweedFS launcher and the latency proxy."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from dlpack_io.tools.bench.latencyproxy import LatencyProxy, process_cpu_seconds
from dlpack_io.tools.bench.seaweed import SeaweedServer, free_ports


class _Echo:
    """A real TCP server answering each 4-byte length-prefixed message with it reversed."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                while True:
                    head = _recv(conn, 4)
                    if not head:
                        break
                    body = _recv(conn, int.from_bytes(head, "little"))
                    conn.sendall(head + body[::-1])

    def close(self):
        self.sock.close()


def _recv(conn, n):
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            return out
        out += chunk
    return out


def _roundtrip(conn, payload: bytes) -> bytes:
    conn.sendall(len(payload).to_bytes(4, "little") + payload)
    head = _recv(conn, 4)
    return _recv(conn, int.from_bytes(head, "little"))


def test_proxy_forwards_bytes_intact_and_adds_the_delay():
    echo = _Echo()
    payload = os.urandom(3 * 2**20)  # larger than one chunk: order must be kept
    try:
        with LatencyProxy("127.0.0.1", echo.port, delay_request=0.1, delay_response=0.05) as proxy:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as conn:
                assert _roundtrip(conn, b"warm") == b"mraw"
                t0 = time.monotonic()
                assert _roundtrip(conn, payload) == payload[::-1]
                assert _roundtrip(conn, b"abc") == b"cba"
                elapsed = time.monotonic() - t0
            # two request/response exchanges, each delayed 0.1 s out and 0.05 s back
            assert elapsed >= 2 * 0.15
            pid = proxy.proc.pid
            assert proxy.cpu_seconds() == pytest.approx(process_cpu_seconds(pid), abs=0.5)
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    finally:
        echo.close()


def test_process_cpu_seconds_reads_what_the_process_used():
    """A child that burns 0.3 s of CPU, says how much it used, then waits: /proc says the
    same (to the clock tick)."""
    code = ("import sys, time\nwhile time.process_time() < 0.3:\n    pass\n"
            "print(time.process_time(), flush=True)\nsys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        used = float(child.stdout.readline())
        got = process_cpu_seconds(child.pid)
    finally:
        child.stdin.close()
        child.wait(60)
    assert used >= 0.3 and used - 0.02 <= got <= used + 0.2, (used, got)


def _zombie(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_proxy_without_delay_and_a_server_that_refuses():
    port = free_ports(1)[0]  # nobody listens there
    with LatencyProxy("127.0.0.1", port) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as conn:
            conn.sendall(b"hello")
            try:  # the proxy closes the client side: an orderly close, or a reset when it
                closed = conn.recv(10) == b""  # closed before reading our bytes (Linux: RST)
            except ConnectionResetError:
                closed = True
            assert closed


def test_seaweed_answers_s3_and_stops_without_leaving_a_process(tmp_path):
    import obstore
    from obstore.store import S3Store

    with SeaweedServer(tmp_path, buckets=["infra-test"]) as server:
        env = server.env()
        store = S3Store("infra-test", endpoint=server.endpoint, region="us-east-1",
                        access_key_id=env["AWS_ACCESS_KEY_ID"],
                        secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                        client_options={"allow_http": True})
        obstore.put(store, "k", b"payload")
        assert bytes(obstore.get(store, "k").bytes()) == b"payload"
        pid = server.proc.pid
    assert server.proc is None
    assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
    assert os.path.isdir(tmp_path / "data") and os.path.isdir(tmp_path / "logs")


def test_seaweed_start_failure_is_reported_and_cleaned_up(tmp_path):
    server = SeaweedServer(tmp_path, start_timeout=0.01)
    with pytest.raises(RuntimeError, match="weed mini"):
        server.start()
    assert server.proc is None


def test_seaweed_that_loses_a_port_race_is_started_again_on_other_ports(tmp_path, monkeypatch):
    """The first attempt is handed an S3 port that another process holds (what a port found
    free and taken before weed binds it looks like): weed exits, and start() tries again on
    fresh ports, keeping the failed attempt's output."""
    from dlpack_io.tools.bench import seaweed

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    real, calls = seaweed.free_ports, []

    def first_with_a_taken_port(n):
        ports = real(n)
        calls.append(n)
        if len(calls) == 1:
            ports[seaweed._PORT_FLAGS.index("s3.port")] = held.getsockname()[1]
        return ports

    monkeypatch.setattr(seaweed, "free_ports", first_with_a_taken_port)
    try:
        with SeaweedServer(tmp_path, buckets=["race-test"]) as server:
            assert server.port != held.getsockname()[1]
            assert len(calls) == 2
        assert (tmp_path / "weed.out.1").exists() and (tmp_path / "weed.out").exists()
    finally:
        held.close()
