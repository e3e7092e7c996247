"""Ray on one machine for the Ray conversion benchmark (benchmarks/convert_ray): a head
node on loopback in its own session, and cgroups that count the CPU of every process of a
group (exited ones included)."""
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

HOST = "127.0.0.2"  # loopback; Ray rewrites 127.0.0.1 to the machine's network address


class HeadNode:
    """``ray start --head --block`` in its own session, on loopback, private temp dir; its
    processes count their CPU in ``self.cpu`` (a CPUGroup)."""

    def __init__(self, cpus: int):
        self.cpu = CPUGroup("dlbench-head")
        self.tmp = tempfile.mkdtemp(prefix="dlbench")
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        self.address = f"{HOST}:{port}"
        self.log = Path(self.tmp, "head.log")
        ray = str(Path(sys.executable).with_name("ray"))
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [ray, "start", "--head", "--block", "--node-ip-address", HOST, "--port", str(port),
                 "--num-cpus", str(cpus), "--include-dashboard=false", "--temp-dir", self.tmp,
                 "--disable-usage-stats"], stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, preexec_fn=lambda: self.cpu.add(os.getpid()))
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed:\n{self.log.read_text(errors='replace')}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM (Ray drains and stops its processes), SIGKILL what is left after 60 s."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.cpu.remove()


class CPUGroup:
    """A cgroup that counts the CPU time of every process put in it and of their children,
    exited ones included (cgroup v1 cpuacct, or v2). ``usage()`` is None where cgroups
    cannot be made (not root): the CPU columns then read n/a."""

    ROOTS = ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")

    def __init__(self, name: str):
        self.path = None
        for root in self.ROOTS:
            v1 = os.path.exists(os.path.join(root, "cpuacct.usage"))
            v2 = os.path.exists(os.path.join(root, "cgroup.procs")) and not v1 \
                and os.path.exists(os.path.join(root, "cgroup.controllers"))
            if not (v1 or v2):
                continue
            path = os.path.join(root, f"{name}-{os.getpid()}")
            try:
                os.makedirs(path, exist_ok=True)
            except OSError:
                continue
            self.path, self.root, self.v1 = path, root, v1
            break

    def add(self, pid: int) -> None:
        """Count ``pid`` (and the processes it starts from now on) in this group."""
        if self.path:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(pid))

    def usage(self):
        """CPU seconds used in the group so far, or None."""
        if not self.path:
            return None
        if self.v1:
            with open(os.path.join(self.path, "cpuacct.usage")) as f:
                return int(f.read()) / 1e9
        with open(os.path.join(self.path, "cpu.stat")) as f:
            return int(f.read().split("usage_usec")[1].split()[0]) / 1e6

    def remove(self, *, move_self: bool = False) -> None:
        """Delete the group once its processes are gone (``move_self``: this process
        first goes back to the root group)."""
        if not self.path:
            return
        if move_self:
            with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.rmdir(self.path)
                return
            except OSError:  # processes still leaving
                time.sleep(0.1)
