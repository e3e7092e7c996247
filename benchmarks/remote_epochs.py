"""Epoch 0 (cold cache) and epoch 1 (kept records) over s3:// against the same data set on
local disk, in one process, interleaved round by round: images/s and CPU-ms per image of the
loader process (the SeaweedFS server is another process and not counted).

    python -m benchmarks.remote_epochs SRC_JPEG_FOLDER [--rounds 3] [--batch-size 128]
        [--out /tmp/remote-epochs]

Per round: local epoch 0, s3:// epoch 0 with a fresh cache_dir, s3:// epoch 1 from what
epoch 0 kept (shards assembled into one mapped file each), s3:// epoch 1 from records kept
one file each (assembly switched off; its epoch 0 timed too: what assembling costs epoch 0),
local epoch 1; RandomResizedCrop 224 + flip, 2 thread workers. Prints one JSON
line per round and the medians of the within-round ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import time


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _epoch(ds, epoch: int, batch_size: int) -> dict:
    from dlpack_io.reader import Loader, RandomHorizontalFlip, RandomResizedCrop

    loader = Loader(ds, batch_size=batch_size, num_workers=2, seed=0, drop_last=False,
                    transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])
    loader.set_epoch(epoch)
    t0, c0, n, first = time.perf_counter(), _cpu(), 0, None
    for _, labels in loader:
        n += len(labels)
        first = first or time.perf_counter() - t0
    loader.close()
    seconds, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"images_per_s": round(n / seconds), "cpu_ms_per_image": round(1e3 * cpu / n, 2),
            "first_batch_s": round(first, 3)}


def main() -> None:
    """Run the rounds (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--out", default="/tmp/remote-epochs")
    args = parser.parse_args()
    from dlpack_io.packer import convert
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.remote.storage import Store
    from dlpack_io.tools.bench.seaweed import SeaweedServer

    local_dir = os.path.join(args.out, "local")
    if not os.path.exists(os.path.join(local_dir, "manifest.json")):
        convert(args.src, local_dir, shard_size="16MB", progress=False)
    shutil.rmtree(os.path.join(args.out, "seaweed"), ignore_errors=True)
    with SeaweedServer(os.path.join(args.out, "seaweed"), buckets=["bench"]) as server:
        os.environ.update(server.env())
        store = Store("s3://bench/ds")
        for name in os.listdir(local_dir):
            store.put_file(name, os.path.join(local_dir, name))
        local, rows = Dataset(local_dir), []
        for _ in range(args.rounds):
            cache = os.path.join(args.out, "cache")
            shutil.rmtree(cache, ignore_errors=True)
            remote = Dataset("s3://bench/ds", cache_dir=cache)
            records = _records_only(os.path.join(args.out, "cache-records"))
            row = {"local_e0": _epoch(local, 0, args.batch_size),
                   "s3_e0": _epoch(remote, 0, args.batch_size),
                   "s3_e0_records": _epoch(records, 0, args.batch_size),
                   "s3_e1": _epoch(remote, 1, args.batch_size),
                   "s3_e1_records": _epoch(records, 1, args.batch_size),
                   "local_e1": _epoch(local, 1, args.batch_size)}
            print(json.dumps(row), flush=True)
            rows.append(row)
            del remote, records
    _summary(rows)


def _summary(rows) -> None:
    """Print the medians of the within-round ratios."""
    def ratio(a, b, key):
        return round(statistics.median(r[a][key] / r[b][key] for r in rows), 2)
    print(json.dumps({
        "s3 e0 / local e0 images/s": ratio("s3_e0", "local_e0", "images_per_s"),
        "s3 e1 / local e1 images/s": ratio("s3_e1", "local_e1", "images_per_s"),
        "s3 e0 / local e0 CPU per image": ratio("s3_e0", "local_e0", "cpu_ms_per_image"),
        "s3 e1 / local e1 CPU per image": ratio("s3_e1", "local_e1", "cpu_ms_per_image"),
        "s3 e1 record files / local e1 images/s": ratio("s3_e1_records", "local_e1",
                                                        "images_per_s"),
        "s3 e1 assembled / record files images/s": ratio("s3_e1", "s3_e1_records",
                                                         "images_per_s"),
        "s3 e1 assembled / record files CPU per image": ratio("s3_e1", "s3_e1_records",
                                                              "cpu_ms_per_image"),
        "s3 e0 assembling / not assembling images/s": ratio("s3_e0", "s3_e0_records",
                                                            "images_per_s"),
        "s3 e0 assembling / not assembling CPU per image": ratio("s3_e0", "s3_e0_records",
                                                                 "cpu_ms_per_image")}))


def _records_only(cache: str):
    """The s3:// data set with its kept records left as one file each (shards neither
    grown in place nor assembled): epochs 0 and 1 as they were before, for the comparison."""
    from dlpack_io.reader import Dataset

    shutil.rmtree(cache, ignore_errors=True)
    ds = Dataset("s3://bench/ds", cache_dir=cache)
    ds._remote.whole.after_publish = lambda *args: None
    ds._remote.growing.enabled = False  # epoch 0 as before growing shards: a file per record
    return ds


if __name__ == "__main__":
    main()
