"""What targets cost a conversion (issue 25): ``dlpack convert`` of the same JPEGs with
no targets, with COCO boxes (``--coco``) and with COCO boxes plus masks (sidecars),
interleaved round by round in one run; medians of images/s and the ratios.

    python -m benchmarks.convert_targets [--images 300] [--repeats 3] [--workers 2]

"plain" packs the JPEGs alone (--no-labels), "boxes" with --coco, "boxes+masks" with
--coco and a sidecar mask per image. Images are 500 x 375 JPEGs (quality 90) of random shapes, 1..8 boxes each, masks
VOC-like label maps (benchmarks/mask_codec.py). Everything is written under --root.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

import numpy as np

from benchmarks.mask_codec import voc_like


def make_source(root: str, n: int, seed: int = 0) -> str:
    """SRC with ``n`` JPEGs and their ``.mask.png``; returns the COCO file's path."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    src = os.path.join(root, "src", "imgs")
    os.makedirs(src, exist_ok=True)
    images, anns = [], []
    for k in range(n):
        mask = voc_like(rng)
        pixels = (mask[..., None] * np.array([7, 13, 29], np.uint8)) + \
            rng.integers(0, 40, mask.shape + (3,), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(src, f"{k}.jpg"), quality=90)
        Image.fromarray(mask).save(os.path.join(src, f"{k}.mask.png"))
        images.append({"id": k, "file_name": f"imgs/{k}.jpg", "width": 500, "height": 375})
        for _ in range(int(rng.integers(1, 9))):
            x, y = float(rng.uniform(0, 400)), float(rng.uniform(0, 300))
            anns.append({"id": len(anns), "image_id": k, "category_id": int(rng.integers(1, 21)),
                         "bbox": [x, y, float(rng.uniform(1, 500 - x)),
                                  float(rng.uniform(1, 375 - y))]})
    coco = os.path.join(root, "instances.json")
    with open(coco, "w") as f:
        json.dump({"images": images, "annotations": anns,
                   "categories": [{"id": c, "name": f"class{c}"} for c in range(1, 21)]}, f)
    return coco


KINDS = ("plain", "boxes", "boxes+masks")


def run(root: str, coco: str, kind: str, workers: int) -> float:
    """images/s of one conversion of ``kind`` (src-nomask holds the same JPEGs, hard
    linked, without the sidecar masks that src has)."""
    from dlpack_io.packer import convert

    dst = os.path.join(root, f"dst-{kind}")
    shutil.rmtree(dst, ignore_errors=True)
    src = os.path.join(root, "src" if kind == "boxes+masks" else "src-nomask")
    options = {"labels": False} if kind == "plain" else {"coco": coco}
    t0 = time.perf_counter()
    result = convert(src, dst, workers=workers, progress=False, **options)
    return result["num_samples"] / (time.perf_counter() - t0)


def _without_masks(root: str) -> None:
    src, out = os.path.join(root, "src", "imgs"), os.path.join(root, "src-nomask", "imgs")
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(src):
        if name.endswith(".jpg") and not os.path.exists(os.path.join(out, name)):
            os.link(os.path.join(src, name), os.path.join(out, name))


def main(argv=None):
    """Print the medians and the ratios to the plain conversion."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="/tmp/dlpack-bench-targets")
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    coco = make_source(args.root, args.images)
    _without_masks(args.root)
    rates: dict = {kind: [] for kind in KINDS}
    for _ in range(args.repeats):
        for kind in rates:
            rates[kind].append(run(args.root, coco, kind, args.workers))
    base = statistics.median(rates["plain"])
    for kind, values in rates.items():
        med = statistics.median(values)
        print(f"{kind:12s} {med:8.1f} images/s  ({med / base:.2f}x plain)")


if __name__ == "__main__":
    main()
