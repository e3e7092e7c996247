"""Fidelity and JPEG-speed benchmarks (one self-contained file).

``python -m dlpack_io.tools.bench_fidelity cost [--images 40] [--repeats 5]``
    read-time cost of keeping original JPEG bytes (EXIF orientation and colour conversion
    done by the reader) against an upright YCbCr JPEG of the same picture;
``python -m dlpack_io.tools.bench_fidelity speed ROOT [--photos DIR] [--images 1000]``
    conversion with and without restart markers, and one epoch of the torch DataLoader over
    the files (PIL decode, random-resized-crop 224, flip, batch 256, 2 workers) against our
    Loader (2 threads) over both data sets, plus the decode-only limit: contenders
    interleaved round by round, medians of per-round ratios (see speed_main).

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
import os
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


# ---- speed -------------------------------------------------------------------------------

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


def _files_loader(src, workers: int):
    """torch DataLoader over the JPEG files: PIL decode, RRC 224 (PIL bilinear), flip, CHW."""
    import random
    from pathlib import Path

    import torch
    from PIL import Image

    from dlpack_io.reader import RandomResizedCrop

    files = sorted(str(p) for p in Path(src).rglob("*.jpg"))
    rrc = RandomResizedCrop(224)

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            rnd = random.Random(i)
            img = Image.open(files[i]).convert("RGB")
            top, left, h, w = (int(v) for v in rrc.boxes([img.height], [img.width], 0, 0, [i])[0])
            out = img.resize((224, 224), Image.BILINEAR, box=(left, top, left + w, top + h))
            if rnd.random() < 0.5:
                out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            return torch.from_numpy(np.asarray(out).transpose(2, 0, 1).copy()), 0

    loader = torch.utils.data.DataLoader(Files(), batch_size=256, shuffle=True,
                                         num_workers=workers, persistent_workers=True)
    return lambda: loader


def _our_loader(dst, workers: int):
    import torch

    from dlpack_io.reader import Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop

    loader = Loader(Dataset(dst), batch_size=256, shuffle="global", seed=0,
                    num_workers=workers, dtype=torch.uint8,
                    transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])
    return lambda: loader


def _decode_limit(dst, threads: int = 2) -> float:
    """Images/s of the region decode + resize alone (no loader), in ``threads`` threads
    (the C decoder and PIL's resize release the GIL), same boxes: the physical limit."""
    from concurrent.futures import ThreadPoolExecutor

    from dlpack_io.reader import Dataset, RandomResizedCrop, jpegdecode

    ds, rrc = Dataset(dst), RandomResizedCrop(224)
    scratch = np.empty(jpegdecode.scratch_bytes(800, 800), np.uint8)
    jobs = []
    for i in range(len(ds)):
        payload, entry = ds.record(i)
        box = rrc.boxes([int(entry["height"])], [int(entry["width"])], 0, 0, [i])[0]
        jobs.append((bytes(payload), box, int(entry["orientation"])))
    def work(part):
        buf = np.empty_like(scratch)
        for payload, box, o in part:
            jpegdecode.decode_resized(payload, box, (224, 224), buf, orientation=o)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, [jobs[k::threads] for k in range(threads)]))
    return len(jobs) / (time.perf_counter() - start)


def _epoch(make_iter, path) -> float:
    from dlpack_io.tools.pagecache import warm

    warm(path)
    start, n = time.perf_counter(), 0
    for _, labels in make_iter():
        n += len(labels)
    return n / (time.perf_counter() - start)


def _convert_seconds(src, dst, restarts: bool) -> tuple[float, int]:
    from dlpack_io.packer import convert

    start = time.perf_counter()
    res = convert(src, dst, shard_size="64MB", workers=2, progress=False, overwrite=True,
                  jpeg_restarts=restarts)
    return time.perf_counter() - start, res["num_bytes"]


def speed_main(args) -> dict:
    """``speed``: conversion and loader rounds, interleaved; print and return the ratios."""
    import json
    from pathlib import Path

    from dlpack_io.tools.pagecache import warm

    root = Path(args.root)
    src = root / "jpegs"
    if not src.exists():
        photo_crops(src, args.images, args.photos)
    conv = {False: [], True: []}
    for r in range(args.rounds):
        for restarts in ((False, True) if r % 2 == 0 else (True, False)):
            warm(src)
            conv[restarts].append(_convert_seconds(src, root / f"ds-{restarts}", restarts))
    table = {"dataloader": (_files_loader(src, 2), src),
             "ours": (_our_loader(root / "ds-False", 2), root / "ds-False"),
             "ours_restarts": (_our_loader(root / "ds-True", 2), root / "ds-True")}
    rates = {n: [] for n in table}
    limits = {False: [], True: []}
    for r in range(-1, args.rounds):  # round -1 warms up
        names = list(table)[r % 3:] + list(table)[:r % 3] if r >= 0 else list(table)
        for n in names:
            rate = _epoch(*table[n])
            if r >= 0:
                rates[n].append(rate)
        for restarts in (False, True):
            limit = _decode_limit(root / f"ds-{restarts}")
            if r >= 0:
                limits[restarts].append(limit)
    med = statistics.median
    out = {
        "images": len(list(src.rglob("*.jpg"))), "source_bytes": sum(p.stat().st_size for p in src.rglob("*.jpg")),
        "convert_s": {str(k): med(s for s, _ in v) for k, v in conv.items()},
        "convert_ratio": med(b[0] / a[0] for a, b in zip(conv[False], conv[True])),
        "bytes": {str(k): v[0][1] for k, v in conv.items()},
        "loader": {n: med(v) for n, v in rates.items()},
        "ours / dataloader": med(a / b for a, b in zip(rates["ours"], rates["dataloader"])),
        "ours_restarts / dataloader": med(a / b for a, b in zip(rates["ours_restarts"], rates["dataloader"])),
        "decode_limit_2threads": {str(k): med(v) for k, v in limits.items()},
        "ours / limit": med(a / b for a, b in zip(rates["ours"], limits[False])),
        "ours_restarts / limit": med(a / b for a, b in zip(rates["ours_restarts"], limits[True])),
        "load": os.getloadavg()[0],
    }
    print(json.dumps(out, indent=1))
    (root / "speed.json").write_text(json.dumps(out, indent=1))
    return out


def main(argv=None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    cost = sub.add_parser("cost", help="read-time cost of orientation and colour")
    cost.add_argument("--images", type=int, default=40)
    cost.add_argument("--repeats", type=int, default=5)
    speed = sub.add_parser("speed", help="conversion and loader throughput, restarts or not")
    speed.add_argument("root", help="work folder (JPEGs and data sets are made there)")
    speed.add_argument("--photos", help="folder of real photographs to cut the JPEGs from")
    speed.add_argument("--images", type=int, default=1000)
    speed.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    (cost_main if args.cmd == "cost" else speed_main)(args)


if __name__ == "__main__":
    main()
