"""The parent's side of ``child``: start one, send a line, wait for the reply with a timeout
while polling the memory of its process tree, and kill its whole process group at the end."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

from dlpack_io.tools.bench.memory import PeakTracker


class ChildError(RuntimeError):
    """The child died, hung past its timeout, or answered with an error."""


class Child:
    """A contender process; ``ask`` sends one line and returns the decoded reply."""

    def __init__(self, first: dict, log_path: str, env=None):
        self.log = open(log_path, "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "dlpack_io.tools.bench.child"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, bufsize=1,
                                     start_new_session=True, env=env)
        self.first, self.log_path = first, log_path
        self.memory = PeakTracker(self.proc.pid)

    def ask(self, line: str, timeout: float, track: bool = False) -> dict:
        """Send ``line``; wait up to ``timeout`` s for one JSON line back (polling memory)."""
        try:
            self.proc.stdin.write(line.rstrip("\n") + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ChildError(f"process exited ({exc}); see {self.log_path}") from exc
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                reply = self.proc.stdout.readline()
                if not reply:
                    raise ChildError(f"process exited (status {self.proc.poll()}); "
                                     f"see {self.log_path}")
                data = json.loads(reply)
                if "error" in data:
                    raise ChildError(data["error"])
                return data
            if track:
                self.memory.poll()
            if time.monotonic() > deadline:
                self.kill()
                raise ChildError(f"no answer within {timeout:.0f} s (hung; killed)")

    def start(self, timeout: float) -> dict:
        """Send the first command (build the loader, or run the conversion)."""
        return self.ask(json.dumps(self.first), timeout, track=True)

    def quit(self, timeout: float = 30.0) -> dict:
        """Ask for the child's own rusage, then end its process group."""
        try:
            reply = self.ask("quit", timeout)
            self.wait_exit(grace=15.0)
            return reply
        except ChildError as exc:
            return {"error": str(exc)}
        finally:
            self.kill()

    def wait_exit(self, grace: float) -> None:
        """Let the child exit by itself and its helpers (resource tracker) finish, briefly."""
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the child's process group (it and its workers) and reap it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.log.close()
