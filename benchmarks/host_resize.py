"""CPU per image of the host path with the C resize, with the PIL resize it replaced, and of
a DataLoader + PIL pipeline (issue 28, item 5), with whichever PIL is installed.

    python -m benchmarks.host_resize --root /tmp/hr [--images 512] [--repeats 5]

Packs ``--images`` ImageNet-sized JPEGs (about 500x375, ``tools/synth.py``) once, then
times in interleaved rounds (one warm-up round; every round runs each contender once, in
turn) one epoch of: the Loader (RandomResizedCrop 224 + flip + Normalize, ``num_workers=0``)
with the C resize; the same Loader with ``jpegdecode.native_resize = None`` (the PIL resize
of the previous release); and ``benchmarks.recipes``' DataLoader + PIL contender doing the
same work (open, convert, crop, BILINEAR resize, flip, ToTensor + Normalize). Reports CPU-ms
per image (process CPU time / images, torch limited to one intra-op thread; medians over
rounds) and the medians of the ratios measured within each round, with the load average.

    python -m benchmarks.host_resize --root /tmp/hr --work ours|ours-pil|pil --count 64

runs the per-image work alone (no torch, no Normalize: decode + RandomResizedCrop + flip
into CHW uint8) for ``--count`` images after a warm-up, between a call of ``os.getppid``
and one of ``os.getpgrp``, so ``valgrind --tool=callgrind --zero-before=getppid
--dump-before=getpgrp`` counts the instructions of exactly that work, free of noise.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

SIZE = 224


def prepare(root: Path, images: int):
    """(Dataset, sorted JPEG paths): packs ``images`` synthetic JPEGs once."""
    from dlpack_io.packer import convert
    from dlpack_io.reader import Dataset
    from dlpack_io.tools.synth import make_image_folder

    if not (root / "packed").exists():
        make_image_folder(root / "src", images, 10, seed=0)
        convert(root / "src", root / "packed", workers=1, progress=False, overwrite=True)
    return Dataset(str(root / "packed")), sorted(str(q) for q in (root / "src").rglob("*.jpg"))


def _box(h: int, w: int, i: int):
    from dlpack_io.reader.batch.plan import Draws
    from dlpack_io.reader.transforms.geometry import RandomResizedCrop

    return RandomResizedCrop(SIZE).boxes([h], [w], Draws(0, 0), [i])[0]


def work_ours(ds, count: int, out) -> None:
    """The host path's per-image work: region decode, resize into CHW, flip."""
    from dlpack_io.reader import jpegdecode

    for i in range(count):
        payload, entry = ds.record(i % len(ds))
        h, w = int(entry["height"]), int(entry["width"])
        scratch = np.empty(jpegdecode.scratch_bytes(h, w), np.uint8)
        jpegdecode.decode_resized(payload, _box(h, w, i), (SIZE, SIZE), scratch,
                                  orientation=int(entry["orientation"]),
                                  into=(out, 0, i % 2 == 0, False))


def work_pil(paths, count: int, out) -> None:
    """torchvision's PIL path per image: open, convert, crop, resize, flip, to CHW."""
    from PIL import Image

    for i in range(count):
        img = Image.open(paths[i % len(paths)]).convert("RGB")
        t, left, h, w = (int(v) for v in _box(img.height, img.width, i))
        img = img.crop((left, t, left + w, t + h)).resize((SIZE, SIZE), Image.BILINEAR)
        if i % 2 == 0:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out[:] = np.asarray(img).transpose(2, 0, 1).reshape(-1)


def callgrind_work(root: Path, images: int, kind: str, count: int) -> None:
    """Warm up, then run ``count`` images of ``kind`` between the two marker calls."""
    from dlpack_io.reader import jpegdecode

    ds, paths = prepare(root, images)
    out = np.empty(3 * SIZE * SIZE, np.uint8)
    if kind == "ours-pil":
        jpegdecode.native_resize = None
    run = (lambda n: work_pil(paths, n, out)) if kind == "pil" else \
        (lambda n: work_ours(ds, n, out))
    run(4)
    os.getppid()  # callgrind: --zero-before=getppid
    run(count)
    os.getpgrp()  # callgrind: --dump-before=getpgrp
    print(json.dumps({"work": kind, "images": count}))


def timed_rounds(root: Path, images: int, repeats: int) -> dict:
    """CPU-ms per image of each contender per round, interleaved."""
    import torch

    from benchmarks.recipes import MEAN, STD, contender_epoch
    from dlpack_io.reader import (Loader, Normalize, RandomHorizontalFlip, RandomResizedCrop,
                                  jpegdecode)

    torch.set_num_threads(1)  # idle intra-op threads spinning would count as CPU time
    ds, paths = prepare(root, images)
    loader = Loader(ds, batch_size=64, num_workers=0, dtype=torch.float32, seed=0,
                    transforms=[RandomResizedCrop(SIZE), RandomHorizontalFlip(),
                                Normalize(MEAN, STD)])
    native = jpegdecode.native_resize

    def ours(resize):
        def run():
            jpegdecode.native_resize = resize
            try:
                for _ in loader:
                    pass
            finally:
                jpegdecode.native_resize = native
        return run
    runs = {"Loader, C resize": (ours(native), len(ds)),
            "Loader, PIL resize (before)": (ours(None), len(ds)),
            "DataLoader + PIL": (contender_epoch(paths), len(paths))}
    times = {name: [] for name in runs}
    for round_ in range(repeats + 1):
        for name, (run, n) in runs.items():
            t0 = time.process_time()
            run()
            if round_:
                times[name].append((time.process_time() - t0) * 1000.0 / n)
    return times


def summary(times: dict) -> dict:
    """Medians per contender and medians of the within-round ratios to DataLoader + PIL."""
    base = times["DataLoader + PIL"]
    out = {"cpu_ms_per_image": {k: round(statistics.median(v), 3) for k, v in times.items()},
           "rounds": {k: [round(x, 3) for x in v] for k, v in times.items()}}
    out["ratio_to_dataloader"] = {
        k: round(statistics.median(a / b for a, b in zip(v, base)), 3)
        for k, v in times.items() if k != "DataLoader + PIL"}
    return out


def main(argv=None) -> None:
    """Command line: see the module docstring."""
    import PIL

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--work", choices=("ours", "ours-pil", "pil"))
    p.add_argument("--count", type=int, default=64)
    a = p.parse_args(argv)
    if a.work:
        return callgrind_work(Path(a.root), a.images, a.work, a.count)
    load_before = os.getloadavg()
    result = summary(timed_rounds(Path(a.root), a.images, a.repeats))
    result.update(pil=PIL.__version__, load_before=load_before, load_after=os.getloadavg(),
                  images=a.images, repeats=a.repeats)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
