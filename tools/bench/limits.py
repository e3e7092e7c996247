"""Physical limits on this machine, single core: JPEG decode (PIL, draft on/off), the shared
work alone (no loader around it), memcpy bandwidth, and a random gather from a memmap."""
from __future__ import annotations

import io
import os
import random
import time

import numpy as np

from dlpack_io.tools.bench.work import jpeg_work, raw_work


def _rate(fn, items, min_seconds: float) -> float:
    """Calls per second of fn over items, cycling until min_seconds have passed."""
    done, start = 0, time.perf_counter()
    while True:
        for item in items:
            fn(item)
        done += len(items)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return done / elapsed


def _decode(data: bytes, draft: bool) -> None:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if draft:
            img.draft("RGB", (img.width // 2, img.height // 2))
        img.convert("RGB").load()


def jpeg_limits(paths, min_seconds: float = 2.0) -> dict:
    """images/s per core: full decode, draft (DCT-scaled 1/2) decode, W_jpeg alone."""
    blobs = []
    for p in paths[:200]:
        with open(p, "rb") as f:
            blobs.append(f.read())
    rng = random.Random(0)
    return {"decode_full_per_core": _rate(lambda b: _decode(b, False), blobs, min_seconds),
            "decode_draft_half_per_core": _rate(lambda b: _decode(b, True), blobs, min_seconds),
            "work_jpeg_per_core": _rate(lambda b: jpeg_work(b, rng), blobs, min_seconds)}


def raw_limits(raw_npy: str, min_seconds: float = 1.0) -> dict:
    """W_raw alone per core, and a random gather of 256-image batches from the memmap."""
    arr = np.load(raw_npy, mmap_mode="r")
    np.asarray(arr).sum(dtype=np.uint64)  # page it in
    rng = random.Random(0)
    rows = [np.asarray(arr[i]) for i in range(min(256, len(arr)))]
    work = _rate(lambda a: raw_work(a, rng), rows, min_seconds)
    batches = [np.sort(np.random.default_rng(i).choice(len(arr), min(256, len(arr)), replace=False))
               for i in range(8)]
    gather = _rate(lambda idx: arr[idx], batches, min_seconds) * len(batches[0])
    return {"work_raw_per_core": work, "gather_256_images_per_s": gather,
            "gather_gb_per_s": gather * arr[0].nbytes / 1e9}


def memcpy_gb_per_s(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Best-of-``repeats`` single-thread copy bandwidth (bytes copied / s)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def measure(paths, raw_npy: str | None, quick: bool) -> dict:
    """All limits as one dict (images/s, GB/s), with the core count."""
    seconds = 1.0 if quick else 3.0
    out = {"cores": os.cpu_count(), **jpeg_limits(paths, seconds),
           "memcpy_gb_per_s": memcpy_gb_per_s()}
    if raw_npy:
        out.update(raw_limits(raw_npy, seconds / 2))
    return out
