"""Generate photo-like JPEG folders for the demo, the tests and the benchmarks.

Real photographs cannot ship with the project, so we synthesise images with the statistics
that matter to a data loader: ImageNet-like size (about 500x375), smooth shading with
edges and fine texture so that JPEG files come out at roughly 110 KB at quality 90 and
decode as slowly as real photos do. Output is a pure function of the seed.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def photo_like(rng: np.random.Generator, height: int, width: int, noise: float = 30.0) -> np.ndarray:
    """One HWC uint8 RGB image: gradient sky, a few shaded shapes, per-pixel texture."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(40, 215, size=3).astype(np.float32)
    tilt = rng.uniform(-0.25, 0.25, size=(2, 3)).astype(np.float32)
    img = base + yy[..., None] * tilt[0] + xx[..., None] * tilt[1]
    for _ in range(int(rng.integers(3, 7))):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        ry, rx = rng.uniform(0.08, 0.4) * height, rng.uniform(0.08, 0.4) * width
        mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1.0
        shade = rng.uniform(-90, 90, size=3).astype(np.float32)
        img[mask] += shade + (yy[mask, None] - cy) * rng.uniform(-0.3, 0.3)
    freq = rng.uniform(0.05, 0.3)
    img += 12.0 * np.sin(xx * freq + yy * freq * 0.7)[..., None]
    img += rng.normal(0.0, noise, size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def make_image_folder(root, num_images: int, num_classes: int = 10, *, seed: int = 0,
                      size=(375, 500), quality: int = 90, jitter: float = 0.15) -> list[Path]:
    """Write ``num_images`` JPEGs as ``root/class_XX/img_NNNNNN.jpg``; return their paths.

    ``size`` is (height, width); each image's sides vary by up to ``jitter`` around it,
    as ImageNet's do. Classes are assigned round-robin so every class is populated.
    """
    from PIL import Image

    root = Path(root)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(num_images):
        h = max(8, int(size[0] * rng.uniform(1 - jitter, 1 + jitter)))
        w = max(8, int(size[1] * rng.uniform(1 - jitter, 1 + jitter)))
        folder = root / f"class_{i % num_classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img_{i:06d}.jpg"
        Image.fromarray(photo_like(rng, h, w)).save(path, quality=quality)
        paths.append(path)
    log.info("wrote %d images to %s", num_images, root)
    return paths


def folder_bytes(root) -> int:
    """Total size in bytes of the regular files below ``root``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def main(argv=None) -> None:
    """``python -m dlpack_io.tools.synth DIR --count N``: write a demo JPEG folder."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="folder to create (class sub-folders inside)")
    parser.add_argument("--count", type=int, default=600, help="number of images")
    parser.add_argument("--classes", type=int, default=10, help="number of class folders")
    parser.add_argument("--seed", type=int, default=0, help="seed (output is a function of it)")
    args = parser.parse_args(argv)
    if Path(args.root).exists() and any(Path(args.root).rglob("*.jpg")):
        existing = sum(1 for _ in Path(args.root).rglob("*.jpg"))
        if existing == args.count:
            print(f"{args.root}: {existing} images already there")
            return
    paths = make_image_folder(args.root, args.count, args.classes, seed=args.seed)
    print(f"wrote {len(paths)} JPEGs ({folder_bytes(args.root) / len(paths) / 1e3:.0f} KB mean) "
          f"to {args.root}")


if __name__ == "__main__":
    main()
