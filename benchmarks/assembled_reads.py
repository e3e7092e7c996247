"""What one record read from an assembled shard costs a worker (issue 30, epoch >= 1): the
per-call time of ``WholeShards.view(k)`` (with its signature recheck, and without), of
``RemoteShard.payload(j)`` (what the Loader's host path calls per JPEG record) and, for
reference, of a local shard's ``payload(j)``; the payloads also with two threads calling at
once (wall time per call). The data set is put on a SeaweedFS started
here, read once over s3:// with ``cache_dir`` (epoch 0 keeps and assembles every shard),
then timed in this process; interleaved round by round, medians of the rounds.

    python -m benchmarks.assembled_reads SRC_JPEG_FOLDER [--rounds 7] [--calls 20000]
        [--out /tmp/assembled-reads]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time


def _per_call_us(fn, args: list, calls: int) -> float:
    """Microseconds per call of ``fn(*a)``, cycling through ``args``."""
    n = len(args)
    t0 = time.perf_counter()
    for i in range(calls):
        fn(*args[i % n])
    return 1e6 * (time.perf_counter() - t0) / calls


def _two_threads_us(fn, args: list, calls: int) -> float:
    """Wall microseconds per call of ``fn(*a)`` with two threads calling at once (as the
    Loader's two thread workers do; a system call lets the other thread take the GIL)."""
    import threading

    threads = [threading.Thread(target=_per_call_us, args=(fn, args[i::2], calls // 2))
               for i in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 1e6 * (time.perf_counter() - t0) / calls


def _prepare(src: str, out: str):
    """(local Dataset, s3:// Dataset with every shard assembled, the server)."""
    from dlpack_io.packer import convert
    from dlpack_io.reader import Dataset, Loader, RandomResizedCrop
    from dlpack_io.reader.remote.storage import Store
    from dlpack_io.tools.bench.seaweed import SeaweedServer

    local_dir = os.path.join(out, "local")
    if not os.path.exists(os.path.join(local_dir, "manifest.json")):
        convert(src, local_dir, shard_size="16MB", progress=False)
    shutil.rmtree(os.path.join(out, "seaweed"), ignore_errors=True)
    server = SeaweedServer(os.path.join(out, "seaweed"), buckets=["bench"]).__enter__()
    os.environ.update(server.env())
    store = Store("s3://bench/ds")
    for name in os.listdir(local_dir):
        store.put_file(name, os.path.join(local_dir, name))
    cache = os.path.join(out, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    remote = Dataset("s3://bench/ds", cache_dir=cache)
    loader = Loader(remote, batch_size=128, num_workers=2, seed=0, drop_last=False,
                    transforms=[RandomResizedCrop(224)])
    for _ in loader:  # epoch 0: every record kept, every shard assembled
        pass
    loader.close()
    return Dataset(local_dir), remote, server


def main() -> None:
    """Run the rounds (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--out", default="/tmp/assembled-reads")
    args = parser.parse_args()
    local, remote, server = _prepare(args.src, args.out)
    try:
        whole = remote._remote.whole
        shards = range(len(remote.shards))
        if any(whole.view(k) is None for k in shards):
            raise SystemExit("a shard was not assembled: nothing to time")
        views = [(k,) for k in shards]
        recs = [(sh, j) for sh in remote.shards for j in range(len(sh))]
        lrecs = [(sh, j) for sh in local.shards for j in range(len(sh))]
        cases = {"view": (whole.view, views),
                 "view_norecheck": (lambda k: whole.view(k, recheck=False), views),
                 "s3_payload": (lambda sh, j: sh.payload(j), recs),
                 "local_payload": (lambda sh, j: sh.payload(j), lrecs)}
        rows = []
        for _ in range(args.rounds):
            row = {name: round(_per_call_us(fn, a, args.calls), 2)
                   for name, (fn, a) in cases.items()}
            for name in ("s3_payload", "local_payload"):
                row[name + "_2threads"] = round(_two_threads_us(*cases[name], args.calls), 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
        med = {f"{name} us (median)": round(statistics.median(r[name] for r in rows), 2)
               for name in rows[0]}
        med["loadavg"] = open("/proc/loadavg").read().split()[:3]
        print(json.dumps(med))
    finally:
        server.__exit__(None, None, None)


if __name__ == "__main__":
    main()
