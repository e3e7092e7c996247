"""How far resized_crop is from PIL's BILINEAR resize of the same box (docs/kernels.md).

PIL's BILINEAR is a triangle filter widened by the downscale factor (it antialiases), so
plain bilinear (``antialias=False``) drifts away from it as boxes shrink more, while
``antialias=True`` stays within rounding of it. Run as a script to print the table in
docs/kernels.md::

    python tests/kernels/test_kernels_pil.py [n_images]

Images are photo-like (smooth colour fields, shapes, lines, blur, sensor noise), 500x375,
saved and reloaded as JPEG quality 90, like the decoded JPEGs the reader produces.
"""

import io
import sys

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter

from dlpack_io.kernels import reference

# (name, box side or None for the whole image, output side)
CASES = [("2x upscale", 112, 224), ("1x", 224, 224), ("1.5x down", 336, 224),
         ("2x down", 350, 175), ("3x down", 360, 120), ("whole 500x375 -> 224", None, 224)]


def photo(rng: np.random.Generator, w: int = 500, h: int = 375) -> Image.Image:
    """A photo-like RGB image, JPEG (q90) encoded and decoded."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 60 * np.sin(a * xx / 60 + p) * np.cos(b * yy / 45) + rng.uniform(-40, 40)
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(25):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        box = (x0, y0, x0 + int(rng.integers(5, 150)), y0 + int(rng.integers(5, 120)))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.integers(2) else draw.rectangle)(box, fill=fill)
    for _ in range(20):
        pts = [(int(rng.integers(0, w)), int(rng.integers(0, h))) for _ in range(2)]
        draw.line(pts, fill=tuple(int(v) for v in rng.integers(0, 256, 3)),
                  width=int(rng.integers(1, 4)))
    noisy = np.asarray(pil.filter(ImageFilter.GaussianBlur(0.7))).astype(np.float32)
    noisy += rng.normal(0, 6, noisy.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def pil_diff(n_images: int, seed: int = 0) -> dict:
    """Mean |ours - PIL| (0..255, uint8 outputs) per case, for antialias False and True."""
    rng = np.random.default_rng(seed)
    images = [photo(rng) for _ in range(n_images)]
    result = {}
    for name, side, out in CASES:
        diffs = {False: [], True: []}
        for im in images:
            batch = torch.from_numpy(np.asarray(im).copy())[None]
            h, w = batch.shape[1:3]
            bh, bw = (h, w) if side is None else (side, side)
            top, left = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
            want = np.asarray(im.resize((out, out), Image.BILINEAR,
                                        box=(left, top, left + bw, top + bh)), np.float32)
            for aa in (False, True):
                got = reference.resized_crop(batch, torch.tensor([[top, left, bh, bw]]), out,
                                             False, False, antialias=aa)
                diffs[aa].append(np.abs(got[0].permute(1, 2, 0).numpy() - want).mean())
        result[name] = {aa: float(np.mean(d)) for aa, d in diffs.items()}
    return result


def test_antialias_tracks_pil_and_bilinear_drifts():
    res = pil_diff(2)
    for name, d in res.items():
        assert d[True] < 0.5, (name, d)
    assert res["1x"][False] < 0.05
    assert res["3x down"][False] > 4 * res["3x down"][True]


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    print(f"mean |resized_crop - PIL BILINEAR| in 0..255 units, {n} images 500x375 JPEG q90")
    print("| box -> output | antialias=False | antialias=True |\n|---|---:|---:|")
    for name, d in pil_diff(n).items():
        print(f"| {name} | {d[False]:.2f} | {d[True]:.2f} |")
