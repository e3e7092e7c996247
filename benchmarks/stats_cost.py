"""What the always-on stall meter (``loader.stats()``) costs: per batch, per epoch, per call.

    python -m benchmarks.stats_cost [--repeats 5]

Prints the minimum over repeats of ``timeit`` runs of exactly what the Loader does per batch
(clock reads, counters, the ``log_every`` check), at each epoch's start and end, and for one
``loader.stats()`` snapshot (docs/benchmarks.md, "Cost of loader.stats()").
"""
from __future__ import annotations

import argparse
import time
import timeit

from dlpack_io.reader.batch.stats import LogSchedule, StatsClock


def measure(repeats: int) -> dict:
    """Seconds per operation: {"per_batch", "per_epoch", "stats_call"}."""
    clock, schedule = StatsClock(2, "thread"), LogSchedule(None)
    clock.start_epoch(0, [])

    def per_batch():
        now = time.perf_counter()
        clock.waited(now - now)
        clock.delivered(256, 0.0, 1)
        later = time.perf_counter()
        clock.stepped(later - now)
        schedule.due(clock.epoch.batches)

    def per_epoch():
        clock.start_epoch(0, [])
        clock.end_epoch([])

    def best(fn, number):
        return min(timeit.repeat(fn, number=number, repeat=repeats)) / number
    return {"per_batch": best(per_batch, 200_000), "per_epoch": best(per_epoch, 2_000),
            "stats_call": best(lambda: clock.snapshot([], True), 2_000)}


def main(argv=None) -> int:
    """Run and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    costs = measure(p.parse_args(argv).repeats)
    print("| what | cost |\n|---|---|")
    for name, seconds in costs.items():
        print(f"| {name} | {seconds * 1e6:.1f} us |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
