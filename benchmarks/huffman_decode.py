"""Our Huffman decoder (reader/_huffman.c) against libjpeg-turbo's own, on a data set's JPEG
records: the CPU time of a whole-image decode, each way, in one thread of one process.

    python -m benchmarks.huffman_decode DIR [--images 64] [--rounds 12]
    # DIR: a jpeg-mode data set (e.g. benchmarks.batch_path's DIR/jpeg)

Per round, one pass over the records with ours, one with libjpeg's, one with ours again
(``_jpeg.fast_huffman`` switches between them; nothing else changes: the same IDCT,
upsampling and colour conversion, the same pixels): the ratio of the two, and medians of it
over rounds, so a slower or faster machine moment cancels out. At full scale (8/8) and at
1/8, where the IDCT and colour conversion shrink to almost nothing and the entropy decoding
is what is left.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def main(argv=None) -> None:
    """Time whole-image decodes of DIR's records with each Huffman decoder; print JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args(argv)
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.format.spec import native_jpeg

    jpeg = native_jpeg()
    if jpeg is None:
        raise SystemExit("the C extension dlpack_io.reader._jpeg is not built")
    ds = Dataset(args.root)
    n = min(args.images, len(ds))
    records = [bytes(ds.shards[s].payload(int(i))) for s, i in
               (ds.locate(k) for k in range(n))]
    out = np.empty(max(jpeg.header(r)[0] * jpeg.header(r)[1] for r in records) * 3, np.uint8)

    def one_pass(ours: bool, scale: int) -> float:
        jpeg.fast_huffman(ours)
        start = time.thread_time()
        for r in records:
            h, w, _ = jpeg.header(r)
            jpeg.decode_region(r, out, 0, 0, h, w, scale)
        return (time.thread_time() - start) / n * 1e6

    was = jpeg.fast_huffman()
    result = {"images": n, "mean_bytes": round(sum(map(len, records)) / n), "load": None}
    try:
        for scale in (8, 1):
            ratios, ours_us, theirs_us = [], [], []
            for _ in range(args.rounds):
                a, b, c = one_pass(True, scale), one_pass(False, scale), one_pass(True, scale)
                ratios.append((a + c) / 2 / b)
                ours_us.append((a + c) / 2)
                theirs_us.append(b)
            result[f"scale_{scale}_8"] = {
                "ours_us": round(statistics.median(ours_us), 1),
                "libjpeg_us": round(statistics.median(theirs_us), 1),
                "ours_over_libjpeg": round(statistics.median(ratios), 3)}
    finally:
        jpeg.fast_huffman(was)
    result["load"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
