"""A cold s3:// epoch 0 with ranges received in place (``Store.receive_range``) against the
same epoch through obstore's bodies (``DLPACK_DIRECT_RECEIVE=0``): the fetching threads' CPU
per image, the whole process's, images/s and the peak resident memory an epoch adds.

    python -m benchmarks.direct_receive SRC_JPEG_FOLDER [--rounds 4] [--batch-size 128]
        [--out /tmp/direct-receive]

SRC is packed once (16 MB shards) and uploaded to a real SeaweedFS on this machine. Each
epoch runs in a fresh process (so ``ru_maxrss`` is that epoch's), with a fresh cache_dir,
RandomResizedCrop 224 + flip, 2 thread workers; the two ways alternate round by round.
Fetching threads: receiving (direct) or obstore's Tokio threads, plus the landing thread and
the planner's loop (``benchmarks.remote_cpu``'s per-thread sampling). Prints one JSON line
per epoch, then the medians of each way. Warm the machine's memory first on a fresh VM (the
first touch of a page costs ~9 us there and swamps the fetching threads' figures).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys

_FETCHING = ("receiving (direct)", "obstore (Tokio)", "landing (one thread)",
             "landing (executor)", "planner loop")


def _child(cache: str, batch_size: int, server_pid: int) -> None:
    from benchmarks.remote_cpu import epoch, name_threads
    from dlpack_io.reader import Dataset

    name_threads()
    shutil.rmtree(cache, ignore_errors=True)
    ds = Dataset("s3://bench/ds", cache_dir=cache)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    row = epoch(ds, batch_size, server_pid)
    added = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    row["fetching_ms"] = round(sum(row["threads_ms"].get(k, 0.0) for k in _FETCHING), 3)
    row["peak_rss_added_mb"] = round(added / 1024, 1)
    print(json.dumps(row), flush=True)


def main() -> None:
    """Run the rounds (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--out", default="/tmp/direct-receive")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # (cache, server pid)
    args = parser.parse_args()
    if args.child:
        return _child(args.child[0], args.batch_size, int(args.child[1]))
    from benchmarks.remote_cpu import setup
    from dlpack_io.reader.remote.storage import Store
    from dlpack_io.tools.bench.seaweed import SeaweedServer

    local_dir = setup(args.src, args.out)
    rows: dict = {"0": [], "1": []}
    with SeaweedServer(os.path.join(args.out, "seaweed"), buckets=["bench"]) as server:
        env = dict(os.environ, **server.env())
        os.environ.update(server.env())
        store = Store("s3://bench/ds")
        for name in os.listdir(local_dir):
            store.put_file(name, os.path.join(local_dir, name))
        for _ in range(args.rounds):
            for way in ("0", "1"):
                out = subprocess.run(
                    [sys.executable, "-m", "benchmarks.direct_receive", args.src, "--child",
                     os.path.join(args.out, "cache"), str(server.proc.pid),
                     "--batch-size", str(args.batch_size)],
                    env=dict(env, DLPACK_DIRECT_RECEIVE=way), capture_output=True, text=True,
                    check=True)
                row = json.loads(out.stdout.strip().splitlines()[-1])
                print(json.dumps({"direct": way == "1", **row}), flush=True)
                rows[way].append(row)
    for way, label in (("0", "through obstore"), ("1", "received in place")):
        keys = ("images_per_s", "cpu_ms_per_image", "fetching_ms", "server_ms",
                "peak_rss_added_mb")
        print(label, {k: statistics.median(r[k] for r in rows[way]) for k in keys})


if __name__ == "__main__":
    main()
