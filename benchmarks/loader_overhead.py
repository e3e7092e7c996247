"""The Loader's CPU per image against the bare work of the same samples: how much of a
core goes to anything but the region decode + resize + flip (issue: a loader at its
decode limit).

    python -m benchmarks.loader_overhead DIR [--rounds 5] [--epochs 2] [--set planes]
    # DIR: batch_path's; --set: its jpeg (default) or planes (--mode planes) data set

For each round, one after the other on the same records (files re-read untimed first):

* ``bare``: the region decode + resize + flip into CHW of one epoch's samples, in the
  calling thread, with the crops the Loader draws (``benchmarks.bare_decode``'s loop);
* ``serial``: the Loader with ``num_workers=0``;
* ``threads`` / ``processes``: the Loader with 2 thread / process workers, ``loader.stats()``
  on (it is always on).

Recipe: RandomResizedCrop(224) + flip, uint8 output, batch 64 (the work the bare loop does;
no epilogue). CPU is this process's and its live worker processes' (/proc), per image, medians
over rounds of ``--epochs`` epochs each, with the machine's load beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from benchmarks import warm_page_cache

BATCH, SIZE = 64, 224


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (worker processes included while they run)."""
    out = [pid]
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [q for c in f.read().split() for q in _tree(int(c))]
        except OSError:
            pass
    return out


def _cpu() -> float:
    """CPU seconds of this process and its live descendants (from /proc: children that
    are still running count, which ``os.times`` leaves out until they are reaped)."""
    from dlpack_io.reader.batch.stats import proc_cpu
    return proc_cpu(_tree(os.getpid()))


def _recipe():
    from dlpack_io.reader import RandomHorizontalFlip, RandomResizedCrop
    return [RandomResizedCrop(SIZE), RandomHorizontalFlip()]


def bare(path: str, epochs: int) -> tuple[float, float, int]:
    """CPU and wall seconds and images of the bare loop over ``epochs`` epochs of the
    Loader's crops."""
    from dlpack_io.reader import Dataset, jpegdecode
    from dlpack_io.reader.batch.plan import compile_spec, plan_batch
    from dlpack_io.reader.format import KIND_JPEG

    ds = Dataset(path)
    spec = compile_spec(_recipe())
    out = np.empty((BATCH, 3, SIZE, SIZE), np.uint8).reshape(-1)
    buf = np.empty(jpegdecode.scratch_bytes(1000, 1000), np.uint8)
    plane = 3 * SIZE * SIZE
    plans = [plan_batch(spec, ds, np.arange(s, min(s + BATCH, len(ds))), seed=0, epoch=e)
             for e in range(epochs) for s in range(0, len(ds), BATCH)]
    start, wall, n = _cpu(), time.perf_counter(), 0
    for plan in plans:
        p = plan.params
        for k in range(len(plan.local)):
            payload = ds.shards[plan.shard_ids[k]].payload(int(plan.local[k]))
            reduce = int(plan.entries[k]["kind"]) == KIND_JPEG  # planes: full scale only
            jpegdecode.decode_resized(payload, p.boxes[k], (SIZE, SIZE), buf, reduce,
                                      orientation=int(plan.entries[k]["orientation"]),
                                      into=(out, k * plane, p.flip_h[k], p.flip_v[k]))
            n += 1
    return _cpu() - start, time.perf_counter() - wall, n


def loader(path: str, epochs: int, workers: int, kind: str) -> tuple[float, float, int]:
    """CPU and wall seconds and images of ``epochs`` Loader epochs (after one untimed
    warm-up)."""
    from dlpack_io.reader import Dataset, Loader, Workers

    options = {"workers": Workers(kind=kind)} if workers else {}
    with Loader(Dataset(path), batch_size=BATCH, num_workers=workers, seed=0,
                transforms=_recipe(), **options) as it:
        for _ in it:  # warm-up: workers started, buffers made
            pass
        start, wall, n = _cpu(), time.perf_counter(), 0
        for _ in range(epochs):
            for images, _labels in it:
                n += len(images)
        return _cpu() - start, time.perf_counter() - wall, n


def main(argv=None) -> None:
    """Print one JSON line per run and a summary of medians."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--set", default="jpeg", choices=("jpeg", "planes"))
    args = p.parse_args(argv)
    path = os.path.join(args.root, args.set)
    runs = {"bare": lambda: bare(path, args.epochs),
            "serial": lambda: loader(path, args.epochs, 0, "thread"),
            "threads": lambda: loader(path, args.epochs, 2, "thread"),
            "processes": lambda: loader(path, args.epochs, 2, "process")}
    per_image = {k: [] for k in runs}
    for r in range(args.rounds):
        for kind, run in runs.items():
            warm_page_cache(path)
            cpu, wall, n = run()
            per_image[kind].append(1000 * cpu / n)
            print(json.dumps({"round": r, "kind": kind, "cpu_ms_per_image": round(1000 * cpu / n, 4),
                              "images_per_s": round(n / wall), "cores_busy": round(cpu / wall, 2),
                              "load": os.getloadavg()[0]}), flush=True)
    med = {k: statistics.median(v) for k, v in per_image.items()}
    print(json.dumps({"median_cpu_ms_per_image": {k: round(v, 4) for k, v in med.items()},
                      "over_bare": {k: round(v / med["bare"], 3) for k, v in med.items()},
                      "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
