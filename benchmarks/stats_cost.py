"""What the always-on stall meter (``loader.stats()``) costs: per batch, per epoch, per call.

    python -m benchmarks.stats_cost [--repeats 5]

Prints the minimum over repeats of ``timeit`` runs of exactly what the Loader does per batch
(clock reads, counters, the stage seconds a batch carries, the ``log_every`` check), what a
worker adds per batch part to time its stages, at each epoch's start and end, and for one
``loader.stats()`` snapshot (docs/benchmarks.md, "Cost of loader.stats()"). Without CUDA
the GPU timeline does nothing; with it, two event records and queries per batch are added
(measured with ``--cuda`` where a GPU is present).
"""
from __future__ import annotations

import argparse
import time
import timeit

from dlpack_io.reader.batch import build as stagetimes
from dlpack_io.reader.batch.stats import LogSchedule
from dlpack_io.reader.batch.pipeline import StatsClock


def _device(cuda: bool):
    import torch

    return torch.device("cuda") if cuda else None


def worker_part(parts: int = 2):
    """What the workers add to one batch to time its stages: the table, the clock reads of
    each part (plan, decode, user, transforms) and the totals."""
    stages = stagetimes.stage_table(parts)
    stages[0, stagetimes.PLAN] = time.perf_counter() - time.perf_counter()
    for row in stages:
        t0, user0 = time.perf_counter(), stagetimes.user_seconds()
        t1, user = time.perf_counter(), stagetimes.user_seconds() - user0
        row[stagetimes.DECODE:] = (t1 - t0 - user, user, time.perf_counter() - t1)
    return stagetimes.stage_totals(stages)


def measure(repeats: int, cuda: bool = False) -> dict:
    """Seconds per operation: {"per_batch", "worker_stages", "per_epoch", "stats_call"}."""
    clock, schedule = StatsClock(2, "thread", _device(cuda)), LogSchedule(None)
    clock.start_epoch(0, [])
    stages = worker_part()

    def per_batch():
        clock.delivered(256, 0.0, 1, stages, 0.0)
        clock.handed()
        clock.asked()
        schedule.due(clock.epoch.batches)

    def per_epoch():
        clock.start_epoch(0, [])
        clock.end_epoch([])

    def best(fn, number):
        return min(timeit.repeat(fn, number=number, repeat=repeats)) / number
    number = 20_000 if cuda else 200_000
    return {"per_batch": best(per_batch, number), "worker_stages": best(worker_part, 50_000),
            "per_epoch": best(per_epoch, 2_000),
            "stats_call": best(lambda: clock.snapshot([], True), 2_000)}


def main(argv=None) -> int:
    """Run and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cuda", action="store_true", help="with the CUDA event timeline")
    a = p.parse_args(argv)
    costs = measure(a.repeats, a.cuda)
    print("| what | cost |\n|---|---|")
    for name, seconds in costs.items():
        print(f"| {name} | {seconds * 1e6:.1f} us |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
