"""What writing a fetched record into new page-cache pages costs on this machine, and
whether the host takes free memory back (a VM whose balloon driver reports free pages):
``pwrite`` of 110 KB pieces (a record) into a fresh, preallocated file, CPU microseconds per
piece, (a) after the memory has sat free for a while, (b) right after as much memory was
touched and freed again (pages the host backs), (c) rewriting pages already there.

    python -m benchmarks.page_cache_writes [--dir .] [--mb 200] [--idle 20] [--rounds 3]

Where (a) is many times (b), a cold s3:// epoch on this machine pays the hypervisor for
each new page it keeps, and how much depends on how long memory sat free before it: one
reason its extra CPU per image over the local epoch varies from run to run (docs/remote.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

PIECE = 110_000


def _write_file(folder: str, mb: int, rewrite: bool = False) -> float:
    """CPU microseconds per 110 KB piece written into a new preallocated file (``rewrite``:
    written twice, the second pass timed: pages already in the page cache)."""
    path = os.path.join(folder, f".page-cache-writes-{os.getpid()}")
    size = mb << 20
    piece = np.full(PIECE, 7, dtype=np.uint8).tobytes()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        passes = 2 if rewrite else 1
        for _ in range(passes):
            t = time.process_time()
            for off in range(0, size - PIECE, PIECE):
                os.pwrite(fd, piece, off)
            spent = time.process_time() - t
        return spent / (size // PIECE) * 1e6
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    """Run the rounds (see the module doc); one JSON line each, then the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".")
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--idle", type=float, default=20.0,
                        help="seconds the memory sits free before (a)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for _ in range(args.rounds):
        time.sleep(args.idle)
        idle = _write_file(args.dir, args.mb)
        touched = np.ones(4 * args.mb << 20, dtype=np.uint8)  # backed by the host now
        del touched
        backed = _write_file(args.dir, args.mb)
        rows.append({"after_idle_us": round(idle, 1), "right_after_touch_us": round(backed, 1),
                     "rewrite_us": round(_write_file(args.dir, args.mb, rewrite=True), 1),
                     "loadavg": open("/proc/loadavg").read().split()[0]})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({k: statistics.median(r[k] for r in rows) for k in rows[0]
                      if k != "loadavg"}))


if __name__ == "__main__":
    main()
