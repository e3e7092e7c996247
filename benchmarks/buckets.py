"""Batches of every shape, side by side: a bucketed epoch against a fixed-size one, against
trainer-side bucketing over a DataLoader (the kohya_ss way), and a token budget's fill and
padding.

    python -m benchmarks.buckets DIR [--count 512] [--rounds 3]

DIR/src gets ``count`` photo-like JPEGs of five aspect ratios (4:3, 3:4, 16:9, 9:16, 1:1,
about 500 px on the long side), packed into DIR/jpeg. Each round runs, one after the other
(files re-read untimed first; this machine evicts idle page cache):

* ``fixed``: Loader, RandomResizedCrop(224) + flip, batch 32, 2 threads (a crop of 8-100%
  of each image is decoded);
* ``fixed-resize``: Loader, Resize(224) + RandomCrop(224) + flip: the whole image resized,
  a square cut out of it (three quarters of a 4:3 image decoded);
* ``fixed-squash``: Loader, Resize((224, 224)) + flip: every image decoded whole and
  squashed to 224 x 224 (the work a bucket does, without the buckets);
* ``buckets``: Loader, AspectBuckets(area=224*224, multiple=32) + flip, batch 32, 2 threads
  (the same output area per image);
* ``dataloader-buckets``: torch's DataLoader, 2 worker processes, a batch sampler that groups
  each epoch's shuffled indices by bucket (the same buckets) and a dataset that opens the
  JPEG with PIL, resizes it to cover its bucket and crops it (what trainers write by hand);
* ``tokens``: Loader, TokenBudget(tokens=4096, patch=16, max_side=384) + flip, 2 threads.

It prints one JSON line per run (images/s, and for tokens the mean fill and the share of
padding in the padded batches) and a summary of the medians with the machine's load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from benchmarks import warm_page_cache

AREA, MULTIPLE, BATCH = 224 * 224, 32, 32
RATIOS = ((375, 500), (500, 375), (281, 500), (500, 281), (400, 400))


def prepare(root: str, count: int) -> str:
    """Photo-like JPEGs of five aspect ratios under ROOT/src, packed into ROOT/jpeg."""
    from PIL import Image

    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import photo_like

    src = os.path.join(root, "src", "c0")
    os.makedirs(src, exist_ok=True)
    rng = np.random.default_rng(3)
    for i in range(count):
        h, w = RATIOS[i % len(RATIOS)]
        Image.fromarray(photo_like(rng, h, w)).save(os.path.join(src, f"{i:05d}.jpg"),
                                                    quality=90)
    dst = os.path.join(root, "jpeg")
    if not os.path.exists(os.path.join(dst, "manifest.json")):
        convert(os.path.join(root, "src"), dst, workers=2, progress=False)
    return dst


def ours(path: str, kind: str):
    """A Loader of the ``kind`` contender."""
    from dlpack_io.reader import (AspectBuckets, Dataset, Loader, RandomCrop,
                                  RandomHorizontalFlip, RandomResizedCrop, Resize, TokenBudget)

    flip = [RandomHorizontalFlip()]
    if kind == "fixed":
        return Loader(Dataset(path), batch_size=BATCH, transforms=[RandomResizedCrop(224)] + flip)
    if kind == "fixed-resize":
        return Loader(Dataset(path), batch_size=BATCH,
                      transforms=[Resize(224), RandomCrop(224)] + flip)
    if kind == "fixed-squash":
        return Loader(Dataset(path), batch_size=BATCH, transforms=[Resize((224, 224))] + flip)
    buckets = AspectBuckets(area=AREA, multiple=MULTIPLE) if kind == "buckets" else \
        TokenBudget(tokens=4096, patch=16, max_side=384)
    return Loader(Dataset(path), batch_size=BATCH if kind == "buckets" else 256,
                  buckets=buckets, transforms=flip)


class BucketFiles:
    """A map-style dataset of JPEG files, each resized to cover its bucket and cropped (PIL)."""

    def __init__(self, files, buckets):
        self.files, self.buckets = files, buckets

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        path, bucket = self.files[i]
        bh, bw = self.buckets.sizes[bucket]
        img = Image.open(path).convert("RGB")
        scale = max(bh / img.height, bw / img.width)
        rw, rh = max(bw, round(img.width * scale)), max(bh, round(img.height * scale))
        img = img.resize((rw, rh), Image.BILINEAR)
        top, left = np.random.randint(0, rh - bh + 1), np.random.randint(0, rw - bw + 1)
        img = img.crop((left, top, left + bw, top + bh))
        if np.random.rand() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), 0


class BucketBatches:
    """Each epoch: the indices shuffled, grouped by bucket into batches, batches shuffled."""

    def __init__(self, buckets_of, batch_size):
        self.buckets_of, self.batch_size = np.asarray(buckets_of), batch_size

    def __iter__(self):
        order = np.random.permutation(len(self.buckets_of))
        batches = []
        for b in np.unique(self.buckets_of):
            mine = order[self.buckets_of[order] == b]
            batches += [mine[k:k + self.batch_size].tolist()
                        for k in range(0, len(mine), self.batch_size)]
        np.random.shuffle(batches)
        return iter(batches)

    def __len__(self):
        return sum(-(-int(c) // self.batch_size) for c in np.bincount(self.buckets_of))


def dataloader(src: str):
    """torch's DataLoader with trainer-side bucketing over the JPEG files."""
    from PIL import Image
    from torch.utils.data import DataLoader

    from dlpack_io.reader import AspectBuckets

    buckets = AspectBuckets(area=AREA, multiple=MULTIPLE)
    files = sorted(os.path.join(b, f) for b, _, fs in os.walk(src) for f in fs)
    sizes = [Image.open(f).size for f in files]
    which = buckets.bucket_of([h for _, h in sizes], [w for w, _ in sizes])
    ds = BucketFiles(list(zip(files, which.tolist())), buckets)
    return DataLoader(ds, batch_sampler=BucketBatches(which, BATCH), num_workers=2,
                      persistent_workers=True)


def epoch(loader, kind: str) -> dict:
    """Images/s of one epoch (and the token budget's fill and padding)."""
    t0, images, fill, pad = time.perf_counter(), 0, [], []
    for batch in loader:
        images += len(batch[0])
        if kind == "tokens":
            true = batch[2]
            tokens = ((true[:, 0] // 16) * (true[:, 1] // 16)).sum().item()
            fill.append(tokens / 4096)
            full = len(true) * batch[0].shape[-2] * batch[0].shape[-1]
            pad.append(1 - (true[:, 0] * true[:, 1]).sum().item() / full)
    out = {"images_per_s": images / (time.perf_counter() - t0)}
    if fill:
        out.update(mean_fill=float(np.mean(fill)), padding=float(np.mean(pad)))
    return out


def main(argv=None) -> None:
    """The command line above."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--count", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    path = prepare(args.root, args.count)
    kinds = ("fixed", "fixed-resize", "fixed-squash", "buckets", "dataloader-buckets", "tokens")
    loaders = {k: dataloader(os.path.join(args.root, "src")) if k.startswith("dataloader")
               else ours(path, k) for k in kinds}
    for k, loader in loaders.items():  # workers started, first epoch untimed
        epoch(loader, k)
    runs = {k: [] for k in kinds}
    for r in range(args.rounds):
        for k, loader in loaders.items():
            warm_page_cache(args.root)
            got = epoch(loader, k)
            runs[k].append(got)
            print(json.dumps({"round": r, "kind": k, **got, "load": os.getloadavg()[0]}),
                  flush=True)
    med = {k: statistics.median(g["images_per_s"] for g in v) for k, v in runs.items()}

    def in_round(other):  # the median of the rounds' own ratios: steadier than the medians'
        return statistics.median(b["images_per_s"] / o["images_per_s"]
                                 for b, o in zip(runs["buckets"], runs[other]))
    print(json.dumps({"median_images_per_s": med,
                      "in_round_buckets_over": {k: in_round(k) for k in kinds if k != "buckets"},
                      "buckets_over_fixed": med["buckets"] / med["fixed"],
                      "buckets_over_fixed_resize": med["buckets"] / med["fixed-resize"],
                      "buckets_over_dataloader": med["buckets"] / med["dataloader-buckets"],
                      "token_fill": statistics.median(g["mean_fill"] for g in runs["tokens"]),
                      "token_padding": statistics.median(g["padding"] for g in runs["tokens"]),
                      "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
