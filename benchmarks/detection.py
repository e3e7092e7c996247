"""What boxes and masks cost a Loader epoch (issue 25), beside a DataLoader doing the same
geometry the transforms.v2 way (per sample, PIL + numpy).

    python -m benchmarks.detection --root /tmp/det [--images 512] [--repeats 3] [--workers 2]

Makes ``--images`` COCO-like photos (tools/synth.py, ~480x640 JPEG) with 1..20 boxes each
(a category per box) and a uint8 label map painting them, writes them once as JPEG files +
``targets.json`` + ``.mask.png`` files (what the contender reads) and once packed with the
Writer (fields ``boxes``, ``categories``, ``mask``). Then, interleaved round by round
(medians of ``--repeats`` after a warm-up round), one epoch each of:

* Loader, image only: RandomResizedCrop(224) + RandomHorizontalFlip, batch 64;
* Loader, detection: the same + ``"boxes"``, ``"categories"``;
* Loader, segmentation: the same + ``"mask"``;
* DataLoader + PIL, detection and segmentation: per sample, open + RandomResizedCrop (the
  same boxes) + flip of the image, boxes mapped / clipped / sanitized in numpy, the mask
  resized NEAREST in PIL; a list-collate, as torchvision's detection references do;
* with ``--sized``: Resize(800, max_size=1333) + flip, ``pad=True, pad_multiple=32``
  (detection-sized batches of 8) for the Loader and the DataLoader.

Reports images/s (wall clock) and CPU-ms per image (this process and its children), and the
ratios the issue sets: detection >= 0.9x and segmentation >= 0.7x of the image-only epoch.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np
from dlpack_io.reader import Output

CROP = 224


def _targets(rng, h: int, w: int):
    n = int(rng.integers(1, 21))
    x0, y0 = rng.uniform(0, w - 8, n), rng.uniform(0, h - 8, n)
    x1 = np.minimum(x0 + rng.uniform(4, w / 2, n), w)
    y1 = np.minimum(y0 + rng.uniform(4, h / 2, n), h)
    boxes = np.stack([x0, y0, x1, y1], 1).astype(np.float32)
    cats = rng.integers(1, 91, n).astype(np.int64)
    mask = np.zeros((h, w), np.uint8)
    for (a, b, c, d), k in zip(boxes.astype(int), cats):
        mask[b:d, a:c] = k
    return boxes, cats, mask


def make(root: Path, images: int) -> None:
    """Source JPEGs + targets.json + mask PNGs, and the packed data set."""
    from PIL import Image

    from dlpack_io.packer import Writer
    from dlpack_io.tools.synth import make_image_folder

    rng = np.random.default_rng(0)
    paths = make_image_folder(root / "src", images, 10, size=(480, 640))
    table = {}
    with Writer(root / "packed") as w:
        for path in paths:
            with Image.open(path) as im:
                width, height = im.size
            boxes, cats, mask = _targets(rng, height, width)
            Image.fromarray(mask).save(path.with_suffix(".mask.png"))
            table[str(path)] = {"boxes": boxes.tolist(), "categories": cats.tolist()}
            w.write(image=str(path), label=0, boxes=boxes, categories=cats, mask=mask)
    (root / "targets.json").write_text(json.dumps(table))


class V2Style:
    """The contender's Dataset: one sample at a time, the way transforms.v2 moves targets."""

    def __init__(self, root: Path, mask: bool, sized: bool):
        self.table = json.loads((root / "targets.json").read_text())
        self.paths, self.mask, self.sized = sorted(self.table), mask, sized

    def __len__(self):
        return len(self.paths)

    def _geometry(self, i, h, w):
        from dlpack_io.reader.batch.plan import Draws
        from dlpack_io.reader.transforms.geometry import RandomResizedCrop, Resize

        if self.sized:
            nh, nw = Resize(800, max_size=1333).resized_shape(np.array([h]), np.array([w]))
            return (0, 0, h, w), (int(nh[0]), int(nw[0]))
        return RandomResizedCrop(CROP).boxes([h], [w], Draws(0, 0), [i])[0], (CROP, CROP)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        path = self.paths[i]
        img = Image.open(path).convert("RGB")
        (t, l, bh, bw), (oh, ow) = self._geometry(i, img.height, img.width)
        box = (int(l), int(t), int(l + bw), int(t + bh))
        img = img.crop(box).resize((ow, oh), Image.BILINEAR)
        flip = (i * 2654435761) % 2 == 1
        image = torch.from_numpy(np.asarray(img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                                            if flip else img).copy()).permute(2, 0, 1)
        target = {}
        if self.mask:
            m = Image.open(path[:-4] + ".mask.png").crop(box).resize((ow, oh), Image.NEAREST)
            m = np.asarray(m)[:, ::-1] if flip else np.asarray(m)
            target["mask"] = torch.from_numpy(m.copy())
        else:
            b = np.asarray(self.table[path]["boxes"], np.float64).reshape(-1, 4)
            b = (b - [l, t, l, t]) * [ow / bw, oh / bh, ow / bw, oh / bh]
            b = np.clip(b, 0, [ow, oh, ow, oh])
            if flip:
                b[:, [0, 2]] = ow - b[:, [2, 0]]
            keep = ((b[:, 2] - b[:, 0]) >= 1) & ((b[:, 3] - b[:, 1]) >= 1)
            target["boxes"] = torch.from_numpy(b[keep].astype(np.float32))
            target["labels"] = torch.tensor(self.table[path]["categories"])[keep]
        return image, target


def _collate_padded(batch):
    """torchvision detection's batching: images padded to a multiple of 32."""
    import torch

    images = [b[0] for b in batch]
    h = -(-max(x.shape[1] for x in images) // 32) * 32
    w = -(-max(x.shape[2] for x in images) // 32) * 32
    out = torch.zeros((len(images), 3, h, w), dtype=images[0].dtype)
    for k, x in enumerate(images):
        out[k, :, :x.shape[1], :x.shape[2]] = x
    return out, [b[1] for b in batch]


def contender(root: Path, workers: int, mask: bool, sized: bool = False):
    """One DataLoader epoch (process workers, as DataLoader users run it)."""
    from torch.utils.data import DataLoader

    collate = _collate_padded if sized else (lambda b: (
        __import__("torch").stack([x[0] for x in b]), [x[1] for x in b]))
    loader = DataLoader(V2Style(root, mask, sized), batch_size=8 if sized else 64,
                        num_workers=workers, collate_fn=collate, persistent_workers=False)
    return lambda: sum(len(b[0]) for b in loader)


def ours(root: Path, workers: int, fields=("image", "label"), sized: bool = False):
    """One Loader epoch, host transforms in ``workers`` threads."""
    from dlpack_io.reader import (Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop,
                                  Resize)

    geometry = Resize(800, max_size=1333) if sized else RandomResizedCrop(CROP)
    loader = Loader(Dataset(str(root / "packed")), batch_size=8 if sized else 64, seed=0,
                    num_workers=workers, fields=fields, output=Output(pad=sized, pad_multiple=32),
                    transforms=[geometry, RandomHorizontalFlip()])
    return lambda: sum(len(b[0]) for b in loader)


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def interleaved(runs: dict, repeats: int) -> dict:
    """name -> (median images/s, median CPU-ms/image); each round runs every contender
    once, in turn, so the shared machine's load changes hit them alike."""
    rate, cpu = {n: [] for n in runs}, {n: [] for n in runs}
    for round_ in range(repeats + 1):
        for name, run in runs.items():
            c0, t0 = _cpu(), time.perf_counter()
            n = run()
            if round_:
                rate[name].append(n / (time.perf_counter() - t0))
                cpu[name].append((_cpu() - c0) * 1000.0 / n)
        print(json.dumps({"round": round_}), flush=True)
    return {n: (round(statistics.median(rate[n]), 1), round(statistics.median(cpu[n]), 2))
            for n in runs}


def step_ms(root: Path, repeats: int = 30) -> dict:
    """CPU-ms per image of the consumer's targets step alone (read the fields of 64 random
    samples, draw their geometry, map the boxes / gather the masks), median of ``repeats``:
    what the epoch ratios cannot resolve on a busy machine."""
    import torch

    from dlpack_io.reader import Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop
    from dlpack_io.reader.batch.fields import Assembler

    ds = Dataset(str(root / "packed"))
    images = torch.zeros((64, 3, CROP, CROP), dtype=torch.uint8)
    labels = torch.zeros(64, dtype=torch.int64)
    out = {}
    for fields in (("image", "label"), ("image", "boxes", "categories"), ("image", "mask")):
        loader = Loader(ds, batch_size=64, num_workers=0, fields=fields,
                        transforms=[RandomResizedCrop(CROP), RandomHorizontalFlip()])
        step = Assembler(ds, fields, loader.spec, loader.options, False)  # what the Loader runs
        rng, times = np.random.default_rng(0), []
        for _ in range(repeats + 1):
            idx = np.sort(rng.choice(len(ds), 64, replace=False))
            t0 = time.process_time()  # CPU time: the step is one thread; load-proof
            step(images, labels, idx, 0)
            times.append((time.process_time() - t0) * 1000.0 / 64)
        out[", ".join(fields)] = round(statistics.median(times[1:]), 3)
    return out


def main(argv=None) -> None:
    """Make the data once, time every contender, print a JSON table with the ratios."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sized", action="store_true", help="also Resize(800, max_size=1333) + pad")
    p.add_argument("--step", action="store_true", help="only the consumer's targets step")
    a = p.parse_args(argv)
    root = Path(a.root)
    if not (root / "targets.json").exists():
        make(root, a.images)
    if a.step:
        print(json.dumps({"cpu_ms_per_image_of_the_targets_step": step_ms(root)}, indent=1))
        return
    w = a.workers
    runs = {"Loader image only": ours(root, w),
            "Loader detection (image, boxes, categories)":
                ours(root, w, ("image", "boxes", "categories")),
            "Loader segmentation (image, mask)": ours(root, w, ("image", "mask")),
            "DataLoader+PIL v2-style detection": contender(root, w, mask=False),
            "DataLoader+PIL v2-style segmentation": contender(root, w, mask=True)}
    if a.sized:
        runs["Loader detection-sized, pad 32"] = ours(root, w, ("image", "boxes", "categories"),
                                                      sized=True)
        runs["DataLoader+PIL detection-sized, pad 32"] = contender(root, w, False, sized=True)
    rows = interleaved(runs, a.repeats)
    base = rows["Loader image only"][0]
    ratios = {"detection / image only": round(rows[
        "Loader detection (image, boxes, categories)"][0] / base, 3),
        "segmentation / image only": round(rows["Loader segmentation (image, mask)"][0] / base, 3)}
    print(json.dumps({"images": len(V2Style(root, False, False)), "workers": w,
                      "cpus": os.cpu_count(), "images_per_s, cpu_ms_per_image": rows,
                      "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
