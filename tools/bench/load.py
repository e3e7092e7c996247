"""CPU used by other users of the machine while a contender runs (Linux /proc).

The machine is shared: each timed epoch records how many cores' worth of CPU time went to
processes outside the contender's tree (and outside this harness), so a slow epoch can be
told apart from a slow loader.
"""
from __future__ import annotations

import os

from dlpack_io.tools.bench.memory import tree_pids

TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy() -> int:
    """Busy jiffies of all CPUs since boot (user+nice+system+irq+softirq+steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields))


def tree_cpu(root: int) -> int:
    """CPU jiffies of ``root``'s live tree, including children each of them has reaped."""
    total = 0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total


class ForeignLoad:
    """Start before an epoch, ``stop(seconds)`` after: cores used by everything else."""

    def __init__(self, root: int):
        self.root = root
        self.machine, self.tree, self.me = machine_busy(), tree_cpu(root), _self_cpu()

    def stop(self, seconds: float) -> float:
        """Average number of cores busy outside the contender and this harness; the
        contender's own CPU seconds (its whole process tree) are kept in ``own_s``."""
        busy = machine_busy() - self.machine
        contender = tree_cpu(self.root) - self.tree
        self.own_s = contender / TICKS
        ours = contender + (_self_cpu() - self.me)
        return max(0.0, (busy - ours) / TICKS / max(seconds, 1e-9))


def _self_cpu() -> int:
    t = os.times()
    return round((t.user + t.system) * TICKS)
