"""A real multi-node Ray cluster on this machine for tests (imported by path).

Every node is its own ``ray start --block`` process in its own session, on the
loopback address 127.0.0.2 (Ray rewrites 127.0.0.1 to the machine's network address; any
other 127.x stays on loopback), with free ports and a private temp dir for Ray's session
files, so nothing touches /tmp/ray or another cluster. Token authentication is off, as
`ray start` has it by default in Ray 2.60 (a driver reads the token when it imports ray,
so a token set by a fixture would not reach this process's drivers).
``stop()`` sends SIGTERM to each node (Ray drains and stops its raylet, GCS and workers),
waits until no process of the node's session is left (Ray's workers have process groups of
their own, but stay in the session), and SIGKILLs what is left only as a fallback.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.2"
READY = "Ray runtime started"


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on HOST right now (held open together, then freed)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _node_ports(ports: list[int]) -> list[str]:
    names = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
    return [arg for name, port in zip(names, ports) for arg in (name, str(port))]


def session_pids(sessions) -> list[int]:
    """Live processes in the given sessions (zombies, already dead, are left out)."""
    if not sessions:
        return []
    out = subprocess.run(["pgrep", "-s", ",".join(map(str, sessions))],
                         capture_output=True, text=True).stdout.split()
    alive = []
    for pid in map(int, out):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


RAY_GAVE_UP = "timed out during startup"  # Ray's own words when the GCS never saw the node


class RayGaveUp(RuntimeError):
    """A node Ray itself gave up starting (see LocalRayCluster.start)."""


class LocalRayCluster:
    """A head node plus ``nodes - 1`` worker nodes, ``cpus`` CPUs each."""

    def __init__(self, nodes: int = 2, cpus: int = 1, object_store_mb: int = 200):
        self.nodes, self.cpus, self.object_store = nodes, cpus, object_store_mb * 2**20
        # Unix socket paths must stay under 108 bytes: keep the temp dir short.
        self.root = Path(tempfile.mkdtemp(prefix="dlray"))
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled",
                        RAY_TMPDIR=str(self.root))
        self.procs: list[subprocess.Popen] = []
        self.address = None

    def _ray(self) -> str:
        return str(Path(sys.executable).with_name("ray"))

    def _start_node(self, args: list[str], log: Path, deadline: float) -> None:
        with open(log, "wb") as out:
            proc = subprocess.Popen([self._ray(), "start", "--block", "--node-ip-address", HOST,
                                     "--num-cpus", str(self.cpus), "--object-store-memory",
                                     str(self.object_store), "--disable-usage-stats", *args],
                                    stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                    start_new_session=True)
        self.procs.append(proc)
        while READY not in log.read_text(errors="replace"):  # the node says when it is up
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log.read_text(errors="replace")
                gave_up = RayGaveUp if RAY_GAVE_UP in text else RuntimeError
                raise gave_up(f"ray node did not start:\n{text}")
            time.sleep(0.1)

    def start(self, timeout: float = 120) -> "LocalRayCluster":
        """Start every node; return self once all have reported ready. A node Ray itself
        gives up on (its registration with the GCS timed out after 30 s: a machine loaded by
        other work, seen once in CI) is started once more, all of it afresh; any other
        failure raises at once."""
        try:
            return self._start_once(timeout)
        except RayGaveUp:
            self.root = Path(tempfile.mkdtemp(prefix="dlray"))
            self.env["RAY_TMPDIR"] = str(self.root)
            return self._start_once(timeout)

    def _start_once(self, timeout: float) -> "LocalRayCluster":
        deadline = time.monotonic() + timeout
        ports = free_ports(8 + 6 * (self.nodes - 1))
        self.address = f"{HOST}:{ports[0]}"
        head = ["--head", "--port", str(ports[0]), "--dashboard-port", str(ports[1]),
                "--include-dashboard=false", "--temp-dir", str(self.root),
                *_node_ports(ports[2:8])]
        try:
            self._start_node(head, self.root / "head.log", deadline)
            for k in range(1, self.nodes):
                extra = _node_ports(ports[8 + 6 * (k - 1):8 + 6 * k])
                self._start_node(["--address", self.address, *extra],
                                 self.root / f"node{k}.log", deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, cpus: int | None = None, timeout: float = 120) -> int:
        """Start one more worker node (``cpus`` CPUs, default the cluster's); returns its
        node manager port, which ``ray.nodes()`` reports as ``NodeManagerPort``."""
        ports = free_ports(6)
        saved, self.cpus = self.cpus, self.cpus if cpus is None else cpus
        try:
            self._start_node(["--address", self.address, *_node_ports(ports)],
                             self.root / f"node{len(self.procs)}.log",
                             time.monotonic() + timeout)
        finally:
            self.cpus = saved
        return ports[0]

    def sessions(self) -> set[int]:
        """Session ids of the nodes: every process a node starts stays in its session."""
        return {p.pid for p in self.procs}

    def stop(self, timeout: float = 60) -> None:
        """Stop worker nodes, then the head; no process of the cluster survives."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in reversed(self.procs):  # poll() reaps the node's leader
            while (proc.poll() is None or session_pids({proc.pid})) and time.monotonic() < deadline:
                time.sleep(0.1)
            for pid in session_pids({proc.pid}):
                os.kill(pid, signal.SIGKILL)
            proc.wait()
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)  # Ray's session files and the logs


DRIVER_ENV = ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")


def module_cluster(nodes: int = 2, cpus: int = 1, env: dict | None = None):
    """Body of a module-scoped pytest fixture: start a cluster (``env`` replaces the nodes'
    environment), let this process's drivers connect like the subprocess ones, yield it,
    stop it and check that no process of it survived."""
    import pytest

    c = LocalRayCluster(nodes=nodes, cpus=cpus)
    if env is not None:
        c.env = dict(env, **{k: c.env[k] for k in (*DRIVER_ENV, "RAY_TMPDIR")})
    c.start()
    mp = pytest.MonkeyPatch()
    for key in DRIVER_ENV:
        mp.setenv(key, c.env[key])
    try:
        yield c
    finally:
        mp.undo()
        sessions = c.sessions()
        c.stop()
    assert session_pids(sessions) == [], "ray processes survived stop()"
