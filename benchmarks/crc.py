"""What one record's CRC-32 costs: zlib against zlib-ng (what ``fmt.crc32`` uses when it is
installed), on ImageNet-sized records (~110 KB), interleaved, medians of repeats.

    python -m benchmarks.crc [--size 110000] [--calls 2000] [--repeats 7]

Every record a remote epoch reads is checked by the planner (before it is published) and
by the worker (before a decoder sees it); a local epoch checks none, so this is the per-image
CPU the remote path pays beside the decode (about 1.5 CPU-ms per image here, docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import zlib


def _time(fn, data, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(data)
    return (time.perf_counter() - t0) / calls


def main() -> None:
    """Print microseconds per record for each implementation and the ratio (JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=110_000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    from zlib_ng import zlib_ng

    data = memoryview(os.urandom(args.size + 3))[3:]  # an unaligned slice, as records are
    contenders = {"zlib": zlib.crc32, "zlib-ng": zlib_ng.crc32}
    if len({fn(data) for fn in contenders.values()}) != 1:
        raise SystemExit("the implementations disagree: not the same CRC-32")
    times = {name: [] for name in contenders}
    for _ in range(args.repeats):
        for name, fn in contenders.items():
            times[name].append(_time(fn, data, args.calls))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(json.dumps({"bytes": args.size, **{f"{n}_us": round(v * 1e6, 1) for n, v in med.items()},
                      "zlib / zlib-ng": round(med["zlib"] / med["zlib-ng"], 2)}))


if __name__ == "__main__":
    main()
