"""Which lossless codec stores segmentation masks (issue 25): bytes per mask and decode
time per mask, for raw arrays, zlib at levels 1/6/9 and PNG (what VOC/ADE20K ship).

    python -m benchmarks.mask_codec [--masks 200] [--repeats 5]

Masks are VOC-like label maps drawn with PIL (500 x 375, a background, 1..6 objects as
filled ellipses and polygons with class ids 1..20, a 255 "void" outline of 3 pixels around
each object as VOC has) and ADE20K-like ones (dense: 10..30 regions, uint16 ids). Every
codec is round-tripped and compared to the array (lossless or it is not listed). Times are
medians over ``--repeats`` passes over all masks, in one run, so the ratios are fair.
"""
from __future__ import annotations

import argparse
import io
import statistics
import time
import zlib

import numpy as np


def voc_like(rng, w=500, h=375):
    """A sparse label map: background 0, a few objects, a 255 outline around each."""
    from PIL import Image, ImageDraw

    img = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(img)
    for _ in range(rng.integers(1, 7)):
        cls = int(rng.integers(1, 21))
        x0, y0 = rng.integers(0, w - 40), rng.integers(0, h - 40)
        x1, y1 = x0 + rng.integers(30, w - x0), y0 + rng.integers(30, h - y0)
        box = [int(x0), int(y0), int(x1), int(y1)]
        if rng.random() < 0.5:
            draw.ellipse(box, fill=cls, outline=255, width=3)
        else:
            pts = [(int(rng.integers(box[0], box[2])), int(rng.integers(box[1], box[3])))
                   for _ in range(6)]
            draw.polygon(pts, fill=cls, outline=255)
    return np.asarray(img)


def ade_like(rng, w=512, h=384):
    """A dense label map of 10..30 regions (Voronoi cells), uint16 ids up to 3000."""
    n = int(rng.integers(10, 31))
    cx, cy = rng.integers(0, w, n), rng.integers(0, h, n)
    ids = rng.integers(1, 3000, n).astype(np.uint16)
    yy, xx = np.mgrid[0:h, 0:w]
    d = (xx[..., None] - cx) ** 2 + (yy[..., None] - cy) ** 2
    return ids[d.argmin(-1)]


def _png(mask):
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(mask).save(out, format="PNG")
    return out.getvalue()


def _unpng(data, mask):
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)))


CODECS = {
    "raw": (lambda m: m.tobytes(), lambda d, m: np.frombuffer(d, m.dtype).reshape(m.shape)),
    "zlib-1": (lambda m: zlib.compress(m.tobytes(), 1),
               lambda d, m: np.frombuffer(zlib.decompress(d), m.dtype).reshape(m.shape)),
    "zlib-6": (lambda m: zlib.compress(m.tobytes(), 6),
               lambda d, m: np.frombuffer(zlib.decompress(d), m.dtype).reshape(m.shape)),
    "zlib-9": (lambda m: zlib.compress(m.tobytes(), 9),
               lambda d, m: np.frombuffer(zlib.decompress(d), m.dtype).reshape(m.shape)),
    "png": (_png, _unpng),
}


def measure(masks, repeats):
    """codec -> (mean bytes, median decode microseconds per mask, encode us per mask)."""
    out = {}
    for name, (enc, dec) in CODECS.items():
        t0 = time.perf_counter()
        blobs = [enc(m) for m in masks]
        enc_us = (time.perf_counter() - t0) / len(masks) * 1e6
        for b, m in zip(blobs, masks):
            if not np.array_equal(dec(b, m), m):
                raise SystemExit(f"{name} is not lossless")
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for b, m in zip(blobs, masks):
                dec(b, m)
            times.append((time.perf_counter() - t0) / len(masks) * 1e6)
        out[name] = (sum(map(len, blobs)) / len(blobs), statistics.median(times), enc_us)
    return out


def main(argv=None):
    """Print one table per mask kind."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--masks", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    for kind, make in (("VOC-like uint8 500x375", voc_like), ("ADE-like uint16 512x384", ade_like)):
        masks = [make(rng) for _ in range(args.masks)]
        print(f"{kind}: {args.masks} masks, median of {args.repeats}")
        print(f"  {'codec':8s} {'bytes/mask':>11s} {'decode us':>10s} {'encode us':>10s}")
        for name, (size, dec_us, enc_us) in measure(masks, args.repeats).items():
            print(f"  {name:8s} {size:11.0f} {dec_us:10.1f} {enc_us:10.1f}")


if __name__ == "__main__":
    main()
