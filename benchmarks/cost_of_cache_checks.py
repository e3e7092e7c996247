"""What the cache-directory checks of issue 26 cost on a warm remote epoch, where every
record comes from the cache: a record file read the checked way (O_NOFOLLOW | O_NONBLOCK,
fstat: regular and bounded) against a plain ``open().read()``, and a record read out of a
pinned whole shard (fstat: regular, right size) against a plain ``pread``; next to the
CRC-32 check every cached record already had, and the decode a Loader does per sample.

    python -m benchmarks.cost_of_cache_checks [--records 2000] [--bytes 110000] [--repeats 7]
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote import cache as cache_mod


def _plain_read(path, _size):
    with open(path, "rb") as f:
        return f.read()


def _plain_pread(path, offset, length, _size):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def _time(fn, items, repeats):
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for item in items:
            fn(*item)
        best.append((time.perf_counter() - t0) / len(items))
    return statistics.median(best)


def _jpeg(size: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (375, 500, 3), dtype=np.uint8))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90)
    return out.getvalue()


def main() -> None:
    """Print microseconds per record for each way, and the checks' share of a decode."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=110_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for j in range(args.records):
            path = os.path.join(tmp, str(j))
            with open(path, "wb") as f:
                f.write(rng.bytes(args.bytes))
            files.append((path, args.bytes))
        shard = os.path.join(tmp, "shard")
        with open(shard, "wb") as f:
            f.write(rng.bytes(args.bytes * 64))
        size = os.path.getsize(shard)
        ranges = [(shard, (j % 64) * args.bytes, args.bytes, size) for j in range(args.records)]
        rows = {
            "record file, open().read()": _time(_plain_read, files, args.repeats),
            "record file, cache_mod.read_file": _time(cache_mod.read_file, files, args.repeats),
            "pinned shard, os.pread": _time(_plain_pread, ranges, args.repeats),
            "pinned shard, cache_mod.pread_exact": _time(cache_mod.pread_exact, ranges, args.repeats),
        }
        data = open(files[0][0], "rb").read()
        rows["CRC-32 of the record (always done)"] = _time(fmt.crc32, [(data,)] * 200,
                                                            args.repeats)
        jpeg = _jpeg(args.bytes)
        from PIL import Image

        def decode(b):
            Image.open(io.BytesIO(b)).convert("RGB").load()
        rows["PIL decode of a 500x375 JPEG"] = _time(decode, [(jpeg,)] * 50, args.repeats)
    for name, seconds in rows.items():
        print(f"{name:40s} {seconds * 1e6:8.1f} us")
    extra_file = rows["record file, cache_mod.read_file"] - rows["record file, open().read()"]
    extra_pin = rows["pinned shard, cache_mod.pread_exact"] - rows["pinned shard, os.pread"]
    decode_us = rows["PIL decode of a 500x375 JPEG"]
    print(f"extra per record: {extra_file * 1e6:+.1f} us (record file), "
          f"{extra_pin * 1e6:+.1f} us (pinned shard) = "
          f"{100 * extra_file / decode_us:+.2f}% / {100 * extra_pin / decode_us:+.2f}% "
          f"of one decode")


if __name__ == "__main__":
    main()
