"""Decoded planes at rest, the two layouts side by side: bytes against the JPEGs, and the CPU
of a RandomResizedCrop box's region read (decode_region to RGBX, no resize) from each.

    python -m benchmarks.planes_layouts SRC [--images 300] [--rounds 5]

SRC: a folder of JPEGs (e.g. ``python -m dlpack_io.tools.synth SRC --count 1000``). Each JPEG
becomes a version-1 payload (the planes as they are) and a version-2 one (packed in 8x8
blocks, what the packer writes) in memory, ~75 MB each for 300 photos: more than the CPU's
caches, as a mapped shard is. Every round reads each payload's box once per layout, in
turn, the same boxes (``torchvision``'s RandomResizedCrop arithmetic, scale 0.08-1, ratio
3/4-4/3, seed 0); CPU time per image, medians over rounds, with the load average.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time
from pathlib import Path

import numpy as np


def box(rng: random.Random, h: int, w: int) -> tuple[int, int, int, int]:
    """A RandomResizedCrop box (top, left, height, width), or the whole image."""
    for _ in range(10):
        area = h * w * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw
    return 0, 0, h, w


def main(argv=None) -> None:
    """Print one JSON line per round and one of medians."""
    from dlpack_io.reader.format.spec import native_jpeg

    _jpeg = native_jpeg()  # the C extension: to_planes writes either layout

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    files = sorted(Path(args.src).rglob("*.jpg"))[:args.images]
    rng = random.Random(0)
    records, jpeg_bytes = [], 0
    for f in files:
        data = f.read_bytes()
        h, w, _ = _jpeg.header(data)
        plain, packed = _jpeg.to_planes(data, 1 << 40, False), _jpeg.to_planes(data, 1 << 40)
        if plain is None:
            continue
        jpeg_bytes += len(data)
        records.append((plain, packed, box(rng, h, w)))
    out = np.empty(max(r[2][2] * r[2][3] for r in records) * 4 * 4, np.uint8)
    sizes = {"plain": sum(len(r[0]) for r in records), "packed": sum(len(r[1]) for r in records)}
    per_image = {"plain": [], "packed": []}
    for rnd in range(args.rounds + 1):  # round 0 warms up
        for layout, at in (("plain", 0), ("packed", 1)):
            start = time.process_time()
            for rec in records:
                _jpeg.decode_region(rec[at], out, *rec[2], 8, 4, 1)
            cpu = (time.process_time() - start) / len(records) * 1e6
            if rnd:
                per_image[layout].append(cpu)
        if rnd:
            print(json.dumps({"round": rnd, **{k: round(v[-1], 1) for k, v in per_image.items()},
                              "load": os.getloadavg()[0]}))
    print(json.dumps({"images": len(records),
                      "bytes_over_jpeg": {k: round(v / jpeg_bytes, 3) for k, v in sizes.items()},
                      "region_us_per_image": {k: round(statistics.median(v), 1)
                                              for k, v in per_image.items()},
                      "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
