"""Memory of a process and all its descendants, polled from /proc (Linux).

PSS (proportional set size) divides shared pages (torch's libraries, a forked parent's heap,
page-cache pages of mmapped files) among the processes that share them, so the sum over a
loader's processes is what it really costs; RSS sums count shared pages once per process.
"""
from __future__ import annotations

import os


def _children_map() -> dict:
    kids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree_pids(root: int) -> list:
    """``root`` and every descendant that is alive now."""
    kids, out, todo = _children_map(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _rollup(pid: int) -> tuple[int, int]:
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def tree_memory(root: int) -> dict:
    """{"rss_kb": sum, "pss_kb": sum, "processes": n} over ``root`` and its descendants."""
    pids = tree_pids(root)
    totals = [_rollup(p) for p in pids]
    return {"rss_kb": sum(t[0] for t in totals), "pss_kb": sum(t[1] for t in totals),
            "processes": len(pids)}


class PeakTracker:
    """Keeps the peak of tree_memory over repeated ``poll()`` calls."""

    def __init__(self, root: int):
        self.root, self.peak = root, {"rss_kb": 0, "pss_kb": 0, "processes": 0}

    def poll(self) -> None:
        """Sample once and keep the maxima."""
        now = tree_memory(self.root)
        for key, value in now.items():
            self.peak[key] = max(self.peak[key], value)
