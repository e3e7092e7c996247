"""Golden batches: what the Loader delivers today, pinned so that no re-design changes a pixel.

The data sets under tests/data/golden/ were packed once (``python tests/golden.py --pack``)
and are read-only inputs: photo-like JPEGs of many sizes (grey, EXIF-rotated, two PNGs kept
as raw records) with captions, boxes, per-box categories and masks, a raw set of one size
(the dense paths) and the photos again as LMDB. Every case below is a Loader over one of
them; its batches are hashed (every tensor's dtype, shape and bytes, every list and string)
and the digests are stored in tests/data/golden/digests.json, recorded from the code as it
was when they were pinned (``python tests/golden.py --record``). The tests
(tests/batch/test_golden.py, tests/remote/test_s3_golden.py) check that every worker kind,
a resumed run and a remote copy still give exactly those batches.

Never re-record to make a test pass: a digest that changes means a batch changed.
"""
from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "golden"
DIGESTS = DATA / "digests.json"
SETS = ("photos", "raw", "photos-lmdb")
EPOCHS = 2


# ---- the data sets (packed once; see --pack) ----------------------------------------------
def _photo(rng, h: int, w: int) -> np.ndarray:
    """A smooth, photo-like (h, w, 3) uint8 image: gradients, a blob and some noise."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack([x / w * 200, y / h * 180, (x + y) / (h + w) * 160], axis=2)
    cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(5, max(h, w) / 2)
    blob = ((y - cy) ** 2 + (x - cx) ** 2 < r * r)[..., None] * rng.uniform(-80, 80, 3)
    noise = rng.normal(0, 12, (h, w, 3))
    return np.clip(base + blob + noise + rng.uniform(0, 40, 3), 0, 255).astype(np.uint8)


def _encoded(rng, i: int):
    """(image bytes, stored (h, w)) of photo i: mostly JPEG RGB, some grey, one EXIF-rotated,
    two PNG (stored as raw records). Writer takes boxes and masks in the stored image's
    coordinates and turns them upright with it."""
    from PIL import Image

    h, w = int(rng.integers(36, 100)), int(rng.integers(36, 100))
    pixels = _photo(rng, h, w)
    out = io.BytesIO()
    if i in (5, 17):
        Image.fromarray(pixels).save(out, format="PNG")
    elif i in (3, 11, 29):
        Image.fromarray(pixels).convert("L").save(out, format="JPEG", quality=85)
    elif i == 8:  # orientation 6: upright, the image is w x h
        exif = Image.Exif()
        exif[0x0112] = 6
        Image.fromarray(pixels).save(out, format="JPEG", quality=85, exif=exif.tobytes())
    else:
        Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue(), (h, w)


def _targets(rng, h: int, w: int, i: int):
    """(boxes (k, 4) float32, categories (k,) int64, mask (h, w) uint8) of photo i."""
    k = 0 if i % 7 == 0 else int(rng.integers(1, 4))
    boxes, mask = [], np.zeros((h, w), np.uint8)
    for j in range(k):
        x0, y0 = rng.uniform(0, w - 6), rng.uniform(0, h - 6)
        x1, y1 = rng.uniform(x0 + 4, w), rng.uniform(y0 + 4, h)
        boxes.append((x0, y0, x1, y1))
        mask[int(y0):int(np.ceil(y1)), int(x0):int(np.ceil(x1))] = j + 1
    return (np.array(boxes, np.float32).reshape(-1, 4), np.arange(k, dtype=np.int64) + 10 * i,
            mask)


def pack(root: Path = DATA) -> None:
    """Write the three golden data sets under ``root`` (run once; they are committed)."""
    from dlpack_io.packer import Writer

    rng = np.random.default_rng(2026)
    photos = []
    for i in range(40):
        data, (h, w) = _encoded(rng, i)
        boxes, cats, mask = _targets(rng, h, w, i)
        photos.append(dict(image=data, label=i % 5, caption=f"photo {i} of {h}x{w}",
                           boxes=boxes, categories=cats, mask=mask))
    for name, fmt_ in (("photos", "record"), ("photos-lmdb", "lmdb")):
        with Writer(root / name, format=fmt_, shard_size="48KB", provenance=False) as w:
            for sample in photos:
                w.write(**sample)
    with Writer(root / "raw", mode="raw", shard_size="24KB", provenance=False) as w:
        for i in range(26):
            w.write(image=_photo(rng, 40, 44), label=i % 3)


# ---- the cases ----------------------------------------------------------------------------
def twice(pixels: np.ndarray) -> np.ndarray:
    """A sample_transform (module level: worker processes import it): the left half of the
    image mirrored onto the right, so its size and content both change."""
    half = pixels[:, : max(1, pixels.shape[1] // 2)]
    return np.ascontiguousarray(np.concatenate([half, half[:, ::-1]], axis=1))


def cases() -> dict:
    """name -> (data set name, Loader keyword options without the worker setting); the
    option groups as dicts (``options`` makes them Order / Workers / Output)."""
    import torch

    from dlpack_io.reader import (AspectBuckets, CenterCrop, ColorJitter, CutMix, MixUp,
                                  Normalize, RandAugment, RandomCrop, RandomErasing,
                                  RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip,
                                  Resize, TokenBudget, TrivialAugmentWide)

    rrc = [RandomResizedCrop(32), RandomHorizontalFlip(), Normalize()]
    targets = ("image", "label", "caption", "boxes", "categories", "mask")
    return {
        "rrc-flip-normalize": ("photos", dict(transforms=rrc, batch_size=8, seed=3)),
        "rrc-uint8-targets": ("photos", dict(
            transforms=[RandomResizedCrop((28, 36), scale=(0.3, 1.0)), RandomHorizontalFlip(),
                        RandomVerticalFlip(0.3)], batch_size=7, seed=5, fields=targets,
            output={"return_index": True})),
        "resize-center-jitter-fp16": ("photos", dict(
            transforms=[Resize(40), CenterCrop(32), ColorJitter(0.4, 0.4, 0.4, 0.1),
                        Normalize()], dtype=torch.float16, batch_size=9, seed=1)),
        "resize-random-bicubic": ("photos", dict(
            transforms=[Resize(38, interpolation="bicubic"), RandomCrop((30, 34)),
                        RandomHorizontalFlip()], batch_size=8, seed=2, workers={"reduced_decode": False})),
        "pad-detection": ("photos", dict(
            transforms=[Resize(30, max_size=50), RandomHorizontalFlip()],
            output={"pad": True, "pad_multiple": 8}, batch_size=6, seed=4,
            fields=("image", "label", "boxes", "categories", "mask"))),
        "recipe-augment-erase-mix": ("photos", dict(
            transforms=[RandomResizedCrop(24), RandomHorizontalFlip(), TrivialAugmentWide(),
                        Normalize(), RandomErasing(p=0.5), MixUp(alpha=0.2, num_classes=5),
                        CutMix(alpha=1.0, num_classes=5)], batch_size=8, seed=6)),
        "randaugment-jitter": ("photos", dict(
            transforms=[CenterCrop(30), RandAugment(), ColorJitter(brightness=0.3, hue=0.2),
                        Normalize()], dtype=torch.bfloat16, batch_size=8, seed=8)),
        "sample-transform": ("photos", dict(
            transforms=[RandomResizedCrop(26), RandomHorizontalFlip()],
            sample_transform=twice, batch_size=8, seed=9)),
        "block-drop-last-rank1": ("photos", dict(
            transforms=rrc, shuffle="block", order={"block_size": 4, "block_window": 2},
            drop_last=True,
            rank=1, world_size=2, batch_size=6, seed=10)),
        "ordered-rank0-of-3": ("photos", dict(
            transforms=[CenterCrop(32)], shuffle=False, rank=0, world_size=3, batch_size=5)),
        "raw-random-crop": ("raw", dict(
            transforms=[RandomCrop(32), RandomHorizontalFlip(), RandomVerticalFlip()],
            batch_size=8, seed=11)),
        "raw-whole": ("raw", dict(batch_size=8, seed=12)),
        "raw-rrc-normalize": ("raw", dict(transforms=rrc, batch_size=8, seed=13)),
        "lmdb-rrc": ("photos-lmdb", dict(transforms=rrc, batch_size=8, seed=3)),
        "device-transforms-rrc": ("photos", dict(
            transforms=[RandomResizedCrop(32), RandomHorizontalFlip(),
                        ColorJitter(0.2, 0.2, 0.2), Normalize()],
            workers={"device_transforms": True}, batch_size=8, seed=14)),
        "device-transforms-raw": ("raw", dict(
            transforms=[RandomCrop(30), RandomHorizontalFlip(), Normalize()],
            workers={"device_transforms": True}, batch_size=8, seed=15)),
        "subset-indices": ("photos", dict(
            transforms=rrc, order={"indices": list(range(3, 35, 2))}, batch_size=4, seed=16)),
        "mixture": ("mixture", dict(transforms=rrc, batch_size=8, seed=17)),
        # pinned when buckets came (later than the cases above)
        "aspect-buckets": ("photos", dict(
            buckets=AspectBuckets(area=40 * 40, multiple=8, max_ratio=2.5),
            transforms=[RandomHorizontalFlip(), Normalize()], batch_size=5, seed=18,
            fields=("image", "label", "boxes", "mask", "original_size", "crop_top_left",
                    "target_size"))),
        "token-budget": ("photos", dict(
            buckets=TokenBudget(tokens=100, patch=8, max_side=56),
            transforms=[RandomHorizontalFlip()], batch_size=16, seed=19,
            fields=("image", "label", "boxes", "mask"))),
    }


WORKERS = {"serial": dict(num_workers=0), "threads": dict(num_workers=2),
           "processes": dict(num_workers=2, workers={"kind": "process"})}
# Ray actors on the cluster at RAY_ADDRESS, for a few cases (RAY_CASES: they need a cluster)
RAY = {"ray": dict(num_workers=2, workers={"kind": "ray"})}
RAY_CASES = ("rrc-flip-normalize", "rrc-uint8-targets", "sample-transform", "mixture",
             "device-transforms-rrc")


def options(kwargs: dict, kind: str = "threads", **extra) -> dict:
    """Loader keywords of a case read with ``WORKERS[kind]`` (or ``RAY[kind]``) and
    ``extra``: the group dicts merged and made Order / Workers / Output."""
    from dlpack_io.reader import Order, Output, Workers

    out = dict(kwargs)
    for more in ({**WORKERS, **RAY}[kind], extra):
        for key, value in more.items():
            out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    for key, cls in (("order", Order), ("workers", Workers), ("output", Output)):
        if key in out:
            out[key] = cls(**out[key])
    return out


def dataset(name: str, root=DATA):
    """The golden data set ``name`` (``root``: a folder or an s3:// prefix holding them)."""
    from dlpack_io.reader import Dataset, Mixture

    if name == "mixture":
        return Mixture([dataset("photos", root), dataset("raw", root)], weights=[0.6, 0.4],
                       samples_per_epoch=30)
    return Dataset(f"{root}/{name}" if isinstance(root, str) else root / name)


# ---- digests ------------------------------------------------------------------------------
def _feed(h, x) -> None:
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(x, np.ndarray):
        a = np.ascontiguousarray(x)
        h.update(f"A{a.dtype}{a.shape}".encode() + a.tobytes())
    elif isinstance(x, (list, tuple)):
        h.update(f"L{len(x)}".encode())
        for y in x:
            _feed(h, y)
    else:
        h.update(f"S{type(x).__name__}:{x!r}".encode())


def digest(batch) -> str:
    """16 hex digits of sha256 over a batch: every tensor's dtype, shape and bytes."""
    h = hashlib.sha256()
    _feed(h, batch)
    return h.hexdigest()[:16]


def epochs(loader, count: int = EPOCHS) -> list[list[str]]:
    """The digests of ``count`` epochs of ``loader``, batch by batch."""
    return [[digest(b) for b in loader] for _ in range(count)]


def run_case(name: str, kind: str = "threads", root=DATA, **extra) -> list[list[str]]:
    """The digests of case ``name`` read with ``WORKERS[kind]`` (or ``RAY[kind]``)."""
    from dlpack_io.reader import Loader

    set_name, kwargs = cases()[name]
    with Loader(dataset(set_name, root), **options(kwargs, kind, **extra)) as loader:
        return epochs(loader)


RESUME_CASE, RESUME_AFTER = "rrc-flip-normalize", 2


def resume_states() -> dict:
    """State dicts of RESUME_CASE: after RESUME_AFTER batches of epoch 1 (one rank), and the
    same point reached by two ranks of batch 4 (what a later job of another size loads)."""
    from dlpack_io.reader import Loader

    set_name, kwargs = cases()[RESUME_CASE]
    out = {}
    with Loader(dataset(set_name), **options(kwargs, "serial")) as loader:
        for _ in loader:
            pass
        for k, _ in enumerate(loader):
            if k + 1 == RESUME_AFTER:
                out["one-rank"] = loader.state_dict()
                break
    two = dict(kwargs, batch_size=4, rank=0, world_size=2)
    with Loader(dataset(set_name), **options(two, "serial")) as loader:
        for k, _ in enumerate(loader):
            if k + 1 == 3:
                out["two-ranks"] = loader.state_dict()
                break
    return out


def resumed(state: dict, kind: str = "threads", **change) -> list[str]:
    """The digests of what is left of the epoch ``state`` points into, read by RESUME_CASE's
    loader with ``WORKERS[kind]`` (with ``change`` to its options: another world size, say)."""
    from dlpack_io.reader import Loader

    set_name, kwargs = cases()[RESUME_CASE]
    with Loader(dataset(set_name), **options(dict(kwargs, **change), kind)) as loader:
        loader.load_state_dict(state)
        return [digest(b) for b in loader]


def record() -> dict:
    """Every digest of today's code (threads), the resume states and what they resume to."""
    out = {"cases": {name: run_case(name) for name in cases()}, "states": resume_states()}
    out["resumed"] = {
        "one-rank": resumed(out["states"]["one-rank"]),
        "one-rank-as-rank1-of-2": resumed(out["states"]["one-rank"], rank=1, world_size=2),
        "two-ranks-as-one": resumed(out["states"]["two-ranks"]),
    }
    return out


def load() -> dict:
    """The pinned digests."""
    return json.loads(DIGESTS.read_text())


if __name__ == "__main__":
    if "--pack" in sys.argv:
        pack()
    if "--record" in sys.argv:
        DIGESTS.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
