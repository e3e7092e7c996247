"""Fidelity: what keeping original JPEG bytes costs at read time, and photo-like test data.

``python -m benchmarks.fidelity cost [--images 40] [--repeats 5]``
    read-time cost of keeping original JPEG bytes (EXIF orientation and colour conversion
    done by the reader) against an upright YCbCr JPEG of the same picture;
``python -m benchmarks.fidelity photos DST --photos DIR [--images 1000]``
    ImageNet-like JPEGs cut from real photographs (see photo_crops), a SRC for
    ``dlpack bench``: the speed of restart markers is its convert and loader sections
    (ours-record vs ours-record-plain, ours-thread vs ours-plain; docs/benchmarks.md).

For ImageNet-like photos (tools/synth.py, ~500x375) in each variant (YCbCr upright, EXIF
orientation 3 and 6, grayscale, CMYK, YCCK) it times, per image, one full decode
(``Dataset[i]``'s path) and one RandomResizedCrop-like region decode to 224x224 (the
Loader's path). Variants are interleaved round by round and the median of the rounds is
reported as a ratio to the upright YCbCr file of the same picture (noisy shared machine:
ratios within one run, not absolute times, are the result).
"""
from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np


def _variants(pixels: np.ndarray) -> dict:
    from PIL import Image

    rgb = Image.fromarray(pixels)

    def save(img, orientation=1):
        exif = Image.Exif()
        exif[0x0112] = orientation
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=90, exif=exif)
        return out.getvalue()

    cmyk = save(rgb.convert("CMYK"))
    ycck = bytearray(cmyk)
    at = ycck.find(b"Adobe")
    ycck[at + 11] = 2
    return {"ycbcr": (save(rgb), 1), "orientation 3": (save(rgb, 3), 3),
            "orientation 6": (save(rgb, 6), 6), "grayscale": (save(rgb.convert("L")), 1),
            "CMYK": (cmyk, 1), "YCCK": (bytes(ycck), 1)}


def _time_one(data: bytes, orientation: int, scratch: np.ndarray, box) -> tuple[float, float]:
    from dlpack_io.reader import jpegdecode

    t0 = time.perf_counter()
    h, w = (box[4], box[5])
    jpegdecode.decode_region(data, (0, 0, h, w), 8, scratch, orientation=orientation)
    t1 = time.perf_counter()
    jpegdecode.decode_resized(data, box[:4], (224, 224), scratch, orientation=orientation)
    return t1 - t0, time.perf_counter() - t1


def run(images: int = 40, repeats: int = 5, seed: int = 0) -> dict:
    """{variant: {"full_us", "crop_us", "full_ratio", "crop_ratio"}} (medians of rounds)."""
    from dlpack_io.tools.synth import photo_like

    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(images):
        h, w = int(rng.integers(330, 420)), int(rng.integers(440, 560))
        variants = _variants(photo_like(rng, h, w))
        sets.append((variants, h, w))
    names = list(sets[0][0])
    rounds = {n: ([], []) for n in names}
    scratch = np.empty(600 * 600 * 4 + 64, np.uint8)
    for _ in range(repeats):
        for n in names:  # interleaved: every variant once per round
            full = crop = 0.0
            for variants, h, w in sets:
                data, orientation = variants[n]
                uh, uw = (w, h) if orientation >= 5 else (h, w)
                side = int(min(uh, uw) * 0.7)
                box = ((uh - side) // 2, (uw - side) // 2, side, side, uh, uw)
                a, b = _time_one(data, orientation, scratch, box)
                full, crop = full + a, crop + b
            rounds[n][0].append(full / len(sets) * 1e6)
            rounds[n][1].append(crop / len(sets) * 1e6)
    med = {n: (statistics.median(f), statistics.median(c)) for n, (f, c) in rounds.items()}
    base = med["ycbcr"]
    return {n: {"full_us": round(f), "crop_us": round(c), "full_ratio": round(f / base[0], 2),
                "crop_ratio": round(c / base[1], 2)} for n, (f, c) in med.items()}


def cost_main(args) -> None:
    """``cost``: print a markdown table of the read-time cost."""
    result = run(args.images, args.repeats)
    print("| stored as | full decode (us) | ratio | 224 crop decode+resize (us) | ratio |")
    print("|---|---|---|---|---|")
    for n, r in result.items():
        print(f"| {n} | {r['full_us']} | {r['full_ratio']:.2f}x | {r['crop_us']} | "
              f"{r['crop_ratio']:.2f}x |")


# ---- photo-like data ---------------------------------------------------------------------

def photo_crops(dst, count: int, photos, seed: int = 0) -> None:
    """ImageNet-like JPEGs (~500x375, 4:2:0, quality 75-95, standard tables) cut from real
    photographs: random crops (25-100% of the area, aspect 3:4..4:3) of the pictures in
    ``photos`` (e.g. scikit-image's and scikit-learn's sample photos), resized and
    mirrored at random. Without ``photos``: tools/synth.py's noisy synthetic images."""
    from pathlib import Path

    from PIL import Image

    from dlpack_io.tools.synth import make_image_folder

    if photos is None:
        make_image_folder(dst, count, 10, seed=seed)
        return
    sources = [Image.open(p).convert("RGB") for p in sorted(Path(photos).iterdir())
               if p.suffix.lower() in (".jpg", ".png") and min(Image.open(p).size) >= 300]
    rng = np.random.default_rng(seed)
    for i in range(count):
        img = sources[i % len(sources)]
        area = img.width * img.height * rng.uniform(0.25, 1.0)
        aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
        w = min(img.width, int(round((area * aspect) ** 0.5)))
        h = min(img.height, int(round((area / aspect) ** 0.5)))
        left, top = int(rng.integers(0, img.width - w + 1)), int(rng.integers(0, img.height - h + 1))
        tw = int(500 * rng.uniform(0.85, 1.15))
        crop = img.crop((left, top, left + w, top + h)).resize((tw, max(8, tw * h // w)))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        folder = Path(dst) / f"class_{i % 10:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        crop.save(folder / f"img_{i:06d}.jpg", quality=int(rng.integers(75, 96)))


def main(argv=None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    cost = sub.add_parser("cost", help="read-time cost of orientation and colour")
    cost.add_argument("--images", type=int, default=40)
    cost.add_argument("--repeats", type=int, default=5)
    photos = sub.add_parser("photos", help="ImageNet-like JPEGs cut from real photographs")
    photos.add_argument("dst", help="folder to write (class sub-folders of JPEGs)")
    photos.add_argument("--photos", help="folder of real photographs (default: synthetic)")
    photos.add_argument("--images", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.cmd == "cost":
        cost_main(args)
    else:
        photo_crops(args.dst, args.images, args.photos)


if __name__ == "__main__":
    main()
