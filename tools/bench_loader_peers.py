"""The peers and side measurements of tools/bench_loader.py (torch DataLoader datasets doing
the same work as the Loader, memcpy vs gather, time to first batch, report writing)."""
from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

SIZE = 224


def _rrc_box(w: int, h: int, rnd: random.Random) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3): l, t, r, b."""
    import math

    area = w * h
    for _ in range(10):
        target = area * rnd.uniform(0.08, 1.0)
        aspect = math.exp(rnd.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            t, l = rnd.randint(0, h - ch), rnd.randint(0, w - cw)
            return l, t, l + cw, t + ch
    side = min(w, h)
    return (w - side) // 2, (h - side) // 2, (w - side) // 2 + side, (h - side) // 2 + side


def _pil_work(img, rnd: random.Random):
    """RRC 224 (crop, then BILINEAR resize, as torchvision does on PIL) + h-flip -> CHW."""
    import torch
    from PIL import Image

    if img.mode != "RGB":
        img = img.convert("RGB")
    img = img.crop(_rrc_box(img.width, img.height, rnd)).resize((SIZE, SIZE), Image.BILINEAR)
    if rnd.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous()


class JpegFiles:
    """The JPEG folder, read and transformed with PIL (torchvision's ImageFolder recipe)."""

    def __init__(self, root):
        self.files = sorted(str(p) for p in Path(root).rglob("*.jpg"))
        classes = sorted({os.path.basename(os.path.dirname(f)) for f in self.files})
        self.labels = [classes.index(os.path.basename(os.path.dirname(f))) for f in self.files]
        self.rnd = random.Random(0)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image

        with open(self.files[i], "rb") as f:
            img = Image.open(io.BytesIO(f.read()))
            return _pil_work(img, self.rnd), self.labels[i]


class OurDatasetRRC:
    """Our Dataset's zero-copy records, decoded and transformed with PIL in the workers."""

    def __init__(self, path):
        from dlpack_io.reader import Dataset

        self.ds = Dataset(path)
        self.rnd = random.Random(0)

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        from PIL import Image

        payload, entry = self.ds.record(i)
        return _pil_work(Image.open(io.BytesIO(payload)), self.rnd), int(entry["label"])


class NpyFiles:
    """One .npy file of 256x256x3 pixels per sample: random 224 crop + h-flip -> CHW."""

    def __init__(self, root):
        self.files = sorted(str(p) for p in Path(root).glob("*.npy"))
        self.rnd = random.Random(0)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import torch

        px = np.load(self.files[i])
        t, l = self.rnd.randint(0, px.shape[0] - SIZE), self.rnd.randint(0, px.shape[1] - SIZE)
        px = px[t:t + SIZE, l:l + SIZE]
        if self.rnd.random() < 0.5:
            px = px[:, ::-1]
        label = int(os.path.basename(self.files[i]).split("_")[1].split(".")[0])
        return torch.from_numpy(np.ascontiguousarray(px.transpose(2, 0, 1))), label


def _seed_worker(worker_id):
    import torch

    info = torch.utils.data.get_worker_info()
    info.dataset.rnd = random.Random(info.seed)


def dataloader(dataset, workers: int, batch: int = 256):
    """torch's DataLoader (shuffled, default collate, persistent workers), built once and
    iterated once per call of the returned function, as a training script does."""
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                         num_workers=workers, worker_init_fn=_seed_worker,
                                         persistent_workers=workers > 0)
    return lambda: loader


def write_npy_files(raw_path, dst) -> None:
    """One ``NNNNNN_LABEL.npy`` per sample of the raw data set."""
    from dlpack_io.reader import Dataset

    ds = Dataset(raw_path)
    os.makedirs(dst, exist_ok=True)
    for i in range(len(ds)):
        pixels, label = ds[i]
        np.save(os.path.join(dst, f"{i:06d}_{label}.npy"), pixels)


def repeat_dataset(src, dst, num_samples: int) -> None:
    """A data set of ``num_samples`` whose shards are hard links of ``src``'s shards."""
    from dlpack_io.reader import format as fmt

    manifest = json.loads((Path(src) / fmt.MANIFEST_NAME).read_text())
    os.makedirs(dst, exist_ok=True)
    shards, first, k = [], 0, 0
    while first < num_samples:
        for entry in manifest["shards"]:
            name = fmt.shard_name(k, manifest["format"])
            target = Path(dst) / name
            if not target.exists():
                os.link(Path(src) / entry["name"], target)
            shards.append(dict(entry, name=name, first_sample=first))
            first += entry["num_samples"]
            k += 1
    big = dict(manifest, shards=shards, num_samples=first,
               num_bytes=manifest["num_bytes"] * k // len(manifest["shards"]))
    big["checksum"] = fmt.manifest_checksum(big)
    (Path(dst) / fmt.MANIFEST_NAME).write_text(json.dumps(big))


def _memcpy_gbs(nbytes: int = 1 << 28, reps: int = 5) -> float:
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(reps))
    return nbytes / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def gather_vs_memcpy(raw_path, rounds: int = 3) -> dict:
    """Single-core memcpy GB/s vs one thread gathering random batches of whole records."""
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.batchplan import compile_spec, plan_batch
    from dlpack_io.reader.hostbuild import BuildContext, Scratch, gather_batch

    ds = Dataset(raw_path)
    spec = compile_spec([])
    ctx = BuildContext(ds, spec)
    order = np.random.default_rng(0).permutation(len(ds))
    batches = [order[i:i + 256] for i in range(0, len(order) - 255, 256)]
    buf = np.ones(256 * 256 * 256 * 3, np.uint8)  # pre-faulted, like a reused pinned slot
    scratch = Scratch()

    def gather(b):  # what a device-path worker does per batch: plan + gather
        return gather_batch(ctx, plan_batch(spec, ds, b, seed=0, epoch=0), 0, buf, scratch)
    gather(batches[0])  # open the shards, map the pages
    rates, memcpy = [], []
    for _ in range(rounds):
        memcpy.append(_memcpy_gbs())
        seconds = _timed(lambda: [gather(b) for b in batches])
        rates.append(sum(len(b) for b in batches) * 256 * 256 * 3 / seconds / 1e9)
    gather, copy = float(np.median(rates)), float(np.median(memcpy))
    return {"memcpy_GBps": copy, "gather_GBps": gather, "ratio": gather / copy,
            "images_per_s": gather * 1e9 / (256 * 256 * 3)}


def decode_breakdown(jpeg_path, count: int = 300, rounds: int = 5) -> dict:
    """Single-core microseconds per image (best of ``rounds``, the least disturbed by other
    load; torch on one thread as in a DataLoader worker): PIL full decode, the DataLoader
    peer's whole per-image work, our region decode, and our whole per-image work, on the
    same records and boxes."""
    import torch

    from dlpack_io.reader import Dataset, RandomHorizontalFlip, RandomResizedCrop
    from dlpack_io.reader.batchplan import compile_spec, plan_batch
    from dlpack_io.reader.hostbuild import BuildContext, Scratch

    ds = Dataset(jpeg_path)
    idx = np.arange(min(count, len(ds)))
    spec = compile_spec([RandomResizedCrop(SIZE), RandomHorizontalFlip()])
    pipe = BuildContext(ds, spec)
    ctx = {"payloads": [bytes(ds.record(int(i))[0]) for i in idx], "pipe": pipe,
           "prep": plan_batch(spec, ds, idx, seed=0, epoch=0), "scratch": Scratch(),
           "rnd": random.Random(0)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = [_breakdown(ctx) for _ in range(rounds)]
    finally:
        torch.set_num_threads(threads)
    return {k: float(min(r[k] for r in runs)) for k in runs[0]}


def _breakdown(ctx: dict) -> dict:
    from PIL import Image

    from dlpack_io.reader import jpegdecode
    from dlpack_io.reader.hostbuild import fill_range

    payloads, prep, pipe, scratch, rnd = (ctx[k] for k in ("payloads", "prep", "pipe",
                                                           "scratch", "rnd"))
    out = np.empty(prep.shape, np.uint8)
    buf = scratch.get(jpegdecode.scratch_bytes(600, 800))

    def per_image(fn) -> float:
        fn()
        return _timed(fn) / len(payloads) * 1e6
    return {
        "pil_full_decode_us": per_image(lambda: [Image.open(io.BytesIO(p)).load() for p in payloads]),
        "peer_work_us": per_image(lambda: [_pil_work(Image.open(io.BytesIO(p)), rnd) for p in payloads]),
        "region_decode_us": per_image(lambda: [jpegdecode.decode_region(
            p, prep.params.boxes[k], 8, buf, 4) for k, p in enumerate(payloads)]),
        "loader_work_us": per_image(lambda: fill_range(pipe, prep, 0, len(payloads), 0, out,
                                                       scratch)),
    }


_FIRST_BATCH = textwrap.dedent("""
    import time, sys
    t0 = time.perf_counter()
    import torch
    from dlpack_io.reader import Dataset, Loader, RandomCrop, RandomHorizontalFlip
    t1 = time.perf_counter()
    ds = Dataset(sys.argv[1])
    loader = Loader(ds, batch_size=256, transforms=[RandomCrop(224), RandomHorizontalFlip()],
                    num_workers=2)
    images, labels = next(iter(loader))
    t2 = time.perf_counter()
    print(len(ds), t2 - t1, t2 - t0)
""")


def first_batch(path, reps: int = 3) -> dict:
    """Seconds from Dataset(path) to the first batch, in fresh interpreters (median)."""
    runs = []
    for _ in range(reps):
        out = subprocess.run([sys.executable, "-c", _FIRST_BATCH, str(path)], check=True,
                             capture_output=True, text=True).stdout.split()
        runs.append((int(out[0]), float(out[1]), float(out[2])))
    return {"num_samples": runs[0][0], "seconds": float(np.median([r[1] for r in runs])),
            "seconds_with_imports": float(np.median([r[2] for r in runs]))}
