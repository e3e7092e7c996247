"""The larger-than-RAM benchmark's page-cache limit: a cgroup v1 memory cgroup whose limit
a governor keeps at the epoch's anonymous memory + the cache allowed."""
from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks.larger_than_ram.cache import MB, Peaks, read_fields


class MemCgroup:
    """A cgroup v1 memory cgroup under ``root``, created now, removed by :meth:`remove`."""

    def __init__(self, root, name: str):
        self.path = Path(root) / name
        self.path.mkdir()

    def _write(self, name: str, value) -> None:
        (self.path / name).write_text(f"{value}\n")

    def limit(self, nbytes: int) -> None:
        """Cap memory (anonymous + page cache) charged to the group."""
        self._write("memory.limit_in_bytes", int(nbytes))

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group."""
        self._write("cgroup.procs", pid)

    def no_oom_kill(self) -> None:
        """Make a task that hits the limit wait for more memory instead of being killed."""
        self._write("memory.oom_control", 1)

    def confine(self, pid: int, cache_bytes: int) -> Peaks:
        """Move ``pid`` in, with ``cache_bytes`` of page cache from now on; the running
        :class:`Peaks` of the group's memory.stat (see :func:`governor`)."""
        self.no_oom_kill()
        probe = governor(self, cache_bytes)
        probe()  # the first limit: nothing charged yet
        self.add(pid)
        return Peaks(probe, every=0.02)

    def stat(self) -> dict:
        """memory.stat plus under_oom, max_usage_in_bytes and failcnt."""
        out = read_fields(str(self.path / "memory.stat"))
        out["under_oom"] = read_fields(str(self.path / "memory.oom_control"))["under_oom"]
        for name in ("max_usage_in_bytes", "failcnt"):
            out[name] = int((self.path / f"memory.{name}").read_text())
        return out

    def remove(self) -> None:
        """rmdir the group (its tasks have exited; retried while the kernel lets them go)."""
        for attempt in range(50):
            try:
                return self.path.rmdir()
            except FileNotFoundError:
                return None
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.1)


def cgroup_usable(root) -> bool:
    """Whether a memory cgroup can be created (and removed) under ``root``."""
    try:
        MemCgroup(root, f"dlpack-ltr-probe-{os.getpid()}").remove()
        return (Path(root) / "memory.limit_in_bytes").exists()
    except OSError:
        return False


def cgroup_limit(anon: int, cache_bytes: int) -> int:
    """The limit that leaves ``cache_bytes`` of page cache to a group using ``anon`` bytes of
    anonymous memory now (page-rounded)."""
    return -(-(anon + cache_bytes) // 4096) * 4096


def governor(group: MemCgroup, cache_bytes: int):
    """A probe for :class:`Peaks` that also keeps ``group``'s limit at its anonymous memory
    + ``cache_bytes``: the Loader's buffers grow and shrink during an epoch, and a fixed limit
    would leave the page cache whatever they do not use. Only memory charged after the move
    counts (the child's earlier memory stays charged where it was). A task that hits the limit
    waits (the OOM killer is off in the group) until the next call raises it."""
    state = {"limit": 0, "stalls": 0}

    def probe() -> dict:
        st = group.stat()
        target = cgroup_limit(st["rss"], cache_bytes)
        if st["under_oom"]:  # an allocation waits: anonymous memory outgrew the limit
            state["stalls"] += 1
            target = max(target, state["limit"] + max(cache_bytes, 64 * MB))
        if abs(target - state["limit"]) > MB:
            try:
                group.limit(target)
                state["limit"] = target
            except OSError:  # EBUSY: not reclaimable yet; the next call tries again
                pass
        return dict(st, oom_stalls=state["stalls"])
    return probe
