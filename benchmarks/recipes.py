"""What each ImageNet training recipe costs per image on the host (issue 27), beside a
torchvision-style DataLoader + PIL pipeline doing the same work.

    python -m benchmarks.recipes --root /tmp/recipes [--images 512] [--repeats 3]

Packs ``--images`` ImageNet-sized JPEGs (about 500x375) once, then for each recipe times
one epoch of the Loader with ``num_workers=0`` (every transform in the calling thread) and
reports CPU-ms per image (process CPU time / images; median of ``--repeats`` rounds, each
round timing every recipe once in turn, after one warm-up round). The contender reads the same JPEG files with a torch DataLoader
(``num_workers=0``) and a per-sample PIL pipeline written as torchvision's PIL path computes
it (torchvision does not install beside this CPU torch): open + convert("RGB"),
RandomResizedCrop (PIL crop + BILINEAR resize), flip, the augmentation (the same PIL ops),
ToTensor + Normalize in torch, RandomErasing, collate. It uses no draft-mode decoding.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def recipes():
    """name -> the Loader's transforms list (all 224 px, RandomResizedCrop + flip first)."""
    from dlpack_io.reader import (AutoAugment, CutMix, MixUp, Normalize, RandAugment,
                                  RandomErasing, RandomHorizontalFlip, RandomResizedCrop,
                                  TrivialAugmentWide)

    base = [RandomResizedCrop(224), RandomHorizontalFlip()]
    tail = [Normalize(MEAN, STD)]
    return {
        "baseline (RRC bilinear, flip, Normalize)": base + tail,
        "RRC bicubic": [RandomResizedCrop(224, interpolation="bicubic"),
                        RandomHorizontalFlip()] + tail,
        "RRC bilinear antialias=False": [RandomResizedCrop(224, antialias=False),
                                         RandomHorizontalFlip()] + tail,
        "+ RandomErasing(0.25)": base + tail + [RandomErasing(0.25)],
        "+ MixUp(0.2) / CutMix(1.0)": base + tail + [MixUp(0.2), CutMix(1.0)],
        "+ TrivialAugmentWide": base + [TrivialAugmentWide()] + tail,
        "+ RandAugment(2, 9)": base + [RandAugment()] + tail,
        "+ AutoAugment(imagenet)": base + [AutoAugment()] + tail,
        "torchvision reference (TA-wide, RE 0.1, mixup/cutmix)":
            base + [TrivialAugmentWide()] + tail + [RandomErasing(0.1), MixUp(0.2), CutMix(1.0)],
    }


def _interleaved(runs: dict, images: dict, repeats: int) -> dict:
    """name -> median CPU-ms per image; every round times each run once, in turn, so a
    change in the machine's load hits all of them alike (one warm-up round first)."""
    times = {name: [] for name in runs}
    for round_ in range(repeats + 1):
        for name, run in runs.items():
            t0 = time.process_time()
            run()
            if round_:
                times[name].append((time.process_time() - t0) * 1000.0 / images[name])
        print(json.dumps({"round": round_}), flush=True)
    return {name: statistics.median(v) for name, v in times.items()}


def loader_epoch(ds, transforms):
    """One Loader epoch, host transforms in the calling thread."""
    import torch

    from dlpack_io.reader import Loader

    loader = Loader(ds, batch_size=64, num_workers=0, transforms=transforms,
                    dtype=torch.float32, seed=0)
    return lambda: [None for _ in loader]


class _PilFolder:
    """The contender's Dataset: a torchvision-style ImageFolder + PIL transform."""

    def __init__(self, paths, augment, erase):
        self.paths, self.augment, self.erase = paths, augment, erase
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import torch
        from PIL import Image

        from dlpack_io.reader.batch.plan import Draws
        from dlpack_io.reader.transforms.geometry import RandomResizedCrop

        img = Image.open(self.paths[i]).convert("RGB")
        t, l, h, w = RandomResizedCrop(224).boxes([img.height], [img.width], Draws(0, 0), [i])[0]
        img = img.crop((int(l), int(t), int(l + w), int(t + h))).resize((224, 224),
                                                                        Image.BILINEAR)
        if self.rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if self.augment is not None:
            arr = self.augment.apply(np.asarray(img), self.augment.draw(Draws(0, 0), [i], (224, 224))[0])
            img = Image.fromarray(arr)
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div_(255)
        x = (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
        if self.erase is not None:
            self.erase.apply(Draws(0, 0), [i], x[None])
        return x, i % 10


def contender_epoch(paths, augment=None, erase=None):
    """One torch DataLoader epoch over the JPEG files with the PIL pipeline."""
    from torch.utils.data import DataLoader

    loader = DataLoader(_PilFolder(paths, augment, erase), batch_size=64, num_workers=0)
    return lambda: [None for _ in loader]


def main(argv=None) -> None:
    """Pack once, time every recipe and the contenders, print a JSON table."""
    from dlpack_io.packer import convert
    from dlpack_io.reader import Dataset, RandomErasing, TrivialAugmentWide
    from dlpack_io.tools.synth import make_image_folder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    root = Path(a.root)
    if not (root / "packed").exists():
        make_image_folder(root / "src", a.images, 10, seed=0)
        convert(root / "src", root / "packed", workers=1, progress=False, overwrite=True)
    ds = Dataset(str(root / "packed"))
    paths = sorted(str(q) for q in (root / "src").rglob("*.jpg"))
    runs, images = {}, {}
    for name, transforms in recipes().items():
        runs["Loader: " + name], images["Loader: " + name] = loader_epoch(ds, transforms), len(ds)
    for name, aug, erase in (("DataLoader+PIL: RRC, flip, Normalize", None, None),
                             ("DataLoader+PIL: + TrivialAugmentWide, RE 0.1",
                              TrivialAugmentWide(), RandomErasing(0.1))):
        runs[name], images[name] = contender_epoch(paths, aug, erase), len(paths)
    rows = _interleaved(runs, images, a.repeats)
    print(json.dumps({"images": len(ds), "cpu_ms_per_image": rows, "cpus": os.cpu_count()},
                     indent=1))


if __name__ == "__main__":
    main()
