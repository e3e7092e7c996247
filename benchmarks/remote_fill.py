"""A cold epoch 0's fetch alone (no decoding), per planner setting, interleaved round by
round: seconds until batch 0 is in, until every batch is in, the loader process's CPU
seconds, requests and bytes. Issue 30: few large ranges (the fill) against batch by batch.

    python -m benchmarks.remote_fill LOCAL_DATASET [--rounds 3] [--out /tmp/remote-fill]

LOCAL_DATASET: a converted data set (e.g. the "local" folder benchmarks.remote_epochs
makes); it is uploaded to a SeaweedFS server on this machine. Batches of 128, one rank.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import time

import numpy as np

VARIANTS = {"batch by batch (fill off)": {"fill_bytes": 0},
            "batch 0, then fill 4 MiB x8": {"fill_bytes": 4 << 20, "fill_inflight": 8,
                                            "after": True, "hold": False},
            "batch 0 in, then fill 4 MiB x8": {"fill_bytes": 4 << 20, "fill_inflight": 8,
                                               "after": True, "hold": True},
            "fill 4 MiB x8": {"fill_bytes": 4 << 20, "fill_inflight": 8},
            "fill 4 MiB x4": {"fill_bytes": 4 << 20, "fill_inflight": 4},
            "fill 8 MiB x8": {"fill_bytes": 8 << 20, "fill_inflight": 8},
            "fill 16 MiB x8 (default)": {"fill_bytes": 16 << 20, "fill_inflight": 8}}


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _once(url: str, cache: str, batches, options: dict) -> tuple:
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.remote import planner

    shutil.rmtree(cache, ignore_errors=True)
    ds = Dataset(url, cache_dir=cache)
    options = dict(options)
    planner.FILL_FIRST = 0 if options.pop("after", False) else 8
    planner.HOLD_FILL = options.pop("hold", True)
    ds._remote.fetch_options.update(options)
    t0, c0 = time.perf_counter(), _cpu()
    prefetch = ds.start_prefetch(batches, mode="records")
    prefetch.wait(0)
    first = time.perf_counter() - t0
    for k in range(len(batches)):
        prefetch.wait(k)
    row = (first, time.perf_counter() - t0, _cpu() - c0, prefetch.stats["requests"],
           prefetch.stats["bytes_fetched"])
    prefetch.close()
    return row


def main() -> None:
    """Run the rounds (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("local")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="/tmp/remote-fill")
    args = parser.parse_args()
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.remote.storage import Store
    from dlpack_io.tools.bench.seaweed import SeaweedServer

    shutil.rmtree(os.path.join(args.out, "seaweed"), ignore_errors=True)
    rows = {v: [] for v in VARIANTS}
    with SeaweedServer(os.path.join(args.out, "seaweed"), buckets=["bench"]) as server:
        os.environ.update(server.env())
        store = Store("s3://bench/ds")
        for name in os.listdir(args.local):
            store.put_file(name, os.path.join(args.local, name))
        order = np.random.default_rng(0).permutation(len(Dataset(args.local)))
        batches = [order[i:i + 128] for i in range(0, len(order), 128)]
        print("load", open("/proc/loadavg").read().strip(), flush=True)
        for r in range(args.rounds):
            for name, options in VARIANTS.items():
                rows[name].append(_once("s3://bench/ds", os.path.join(args.out, "cache"),
                                        batches, options))
                print(r, name, [round(x, 3) for x in rows[name][-1]], flush=True)
        print("load", open("/proc/loadavg").read().strip())
    for name, got in rows.items():
        med = [statistics.median(x[i] for x in got) for i in range(5)]
        print(json.dumps({name: {"batch0_s": round(med[0], 3), "all_s": round(med[1], 3),
                                 "cpu_s": round(med[2], 3), "requests": int(med[3]),
                                 "bytes": int(med[4])}}))


if __name__ == "__main__":
    main()
