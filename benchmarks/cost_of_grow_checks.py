"""What the SIGBUS-safe checks of issue 30 cost: a record another process wrote into a
growing shard (and every record of an assembled shard without its stamp) is now checked on
bytes read with ``pread`` instead of on the mapped pages (a file cut under the check made
the old way die of SIGBUS). Both ways CRC the same bytes of a warm file; interleaved A B
rounds, medians.

    python -m benchmarks.cost_of_grow_checks [--records 600] [--bytes 110000] [--repeats 9]
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time

from dlpack_io.reader import format as fmt


def mapped(fd: int, size: int, spans) -> int:
    """The old way: CRC over slices of one read-only map."""
    mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    view, total = memoryview(mm), 0
    for at, n in spans:
        total ^= fmt.crc32(view[at:at + n])
    view.release()
    mm.close()
    return total


def read(fd: int, _size: int, spans) -> int:
    """The new way: CRC over each record's bytes read with pread."""
    total = 0
    for at, n in spans:
        total ^= fmt.crc32(os.pread(fd, n, at))
    return total


def main() -> None:
    """Print per-record microseconds of both ways and their ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=600)
    ap.add_argument("--bytes", type=int, default=110_000)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    spans = [(4096 + i * args.bytes, args.bytes) for i in range(args.records)]
    size = 4096 + args.records * args.bytes
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "0.grow")
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        fd = os.open(path, os.O_RDONLY)
        times = {"mapped": [], "pread": []}
        for _ in range(args.repeats):  # A B A B: the same warm file for both
            for name, fn in (("mapped", mapped), ("pread", read)):
                t0 = time.perf_counter()
                fn(fd, size, spans)
                times[name].append((time.perf_counter() - t0) / args.records * 1e6)
        os.close(fd)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.records} records of {args.bytes} bytes, {args.repeats} rounds, "
          f"loadavg {open('/proc/loadavg').read().split()[:3]}")
    for k, v in med.items():
        print(f"  {k:7s} median {v:8.1f} us/record  ({args.bytes / v:.0f} MB/s)")
    print(f"  pread / mapped = {med['pread'] / med['mapped']:.2f}")


if __name__ == "__main__":
    main()
