"""Measurements that are not contenders: what this machine allows, and where our time goes.

Single core unless said: JPEG decode (PIL, draft on/off), the shared work alone (no loader
around it), memcpy bandwidth, a random gather from a memmap; on our stores: the device
path's CPU share (one thread gathering whole raw records into a reused batch buffer, against
memcpy), the per-image decode breakdown (PIL against our region decode, same records and
boxes), the region decode + resize alone in one thread per core (the ceiling of our JPEG
loader), and the time to the first batch on a 100,000-sample data set.
"""
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

from dlpack_io.tools.bench.work import jpeg_work, raw_work

SIZE = 224


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


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _decode(data: bytes, draft: bool) -> None:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if draft:
            img.draft("RGB", (img.width // 2, img.height // 2))
        img.convert("RGB").load()


def _pil_load(data: bytes) -> None:
    from PIL import Image

    Image.open(io.BytesIO(data)).load()


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
    dst = np.zeros_like(src)  # touched: the copy does not pay its page faults
    return nbytes / min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats)) / 1e9


def gather_vs_memcpy(raw_path, rounds: int = 3) -> dict:
    """Single-core memcpy GB/s vs one thread gathering random batches of whole raw records
    into a reused buffer (plan + gather: a device-path worker's CPU share), medians."""
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.batch.plan import compile_spec, plan_batch
    from dlpack_io.reader.batch.build import BuildContext, Scratch
    from dlpack_io.reader.batch.gather import gather_batch

    ds = Dataset(raw_path)
    spec, per_image = compile_spec([]), ds.record(0)[0].nbytes
    ctx, scratch = BuildContext(ds, spec), Scratch()
    order = np.random.default_rng(0).permutation(len(ds))
    batches = [order[i:i + 256] for i in range(0, max(1, len(order) - 255), 256)]
    # pre-faulted, like a reused pinned slot; sized as the Loader sizes its slots: the
    # pixels, then one 64-byte record per sample (GatherJob.slot_bytes)
    buf = np.ones(256 * (per_image + 64) + 64, np.uint8)

    def gather(b):
        return gather_batch(ctx, plan_batch(spec, ds, b, seed=0, epoch=0), 0, buf, scratch)
    gather(batches[0])  # open the shards, map the pages
    rates, copies = [], []
    for _ in range(rounds):
        copies.append(memcpy_gb_per_s(repeats=3))
        seconds = _timed(lambda: [gather(b) for b in batches])
        rates.append(sum(len(b) for b in batches) * per_image / seconds / 1e9)
    gb, copy = float(np.median(rates)), float(np.median(copies))
    return {"ours_gather_gb_per_s": gb, "ours_gather_images_per_s": gb * 1e9 / per_image,
            "ours_gather_vs_memcpy": gb / copy, "memcpy_gb_per_s_same_rounds": copy}


def decode_breakdown(jpeg_path, count: int = 300, rounds: int = 5) -> dict:
    """Single-core microseconds per image (best of ``rounds``, torch on one thread as in a
    DataLoader worker), same records and boxes: PIL full decode, the DataLoader's whole work
    (work.jpeg_work), our region decode, our whole per-image work."""
    import torch

    from dlpack_io.reader import Dataset, RandomHorizontalFlip, RandomResizedCrop, jpegdecode
    from dlpack_io.reader.batch.plan import compile_spec, plan_batch
    from dlpack_io.reader.batch.build import BuildContext, Scratch
    from dlpack_io.reader.batch.build import fill_range

    ds = Dataset(jpeg_path)
    idx = np.arange(min(count, len(ds)))
    spec = compile_spec([RandomResizedCrop(SIZE), RandomHorizontalFlip()])
    ctx, scratch, rng = BuildContext(ds, spec), Scratch(), random.Random(0)
    records = [ds.record(int(i)) for i in idx]
    payloads = [bytes(payload) for payload, _ in records]
    turns = [int(entry["orientation"]) for _, entry in records]
    plan = plan_batch(spec, ds, idx, seed=0, epoch=0)
    out = np.empty(plan.shape, np.uint8)
    buf = scratch.get(largest_scratch([entry for _, entry in records]))

    def per_image(fn) -> float:
        fn()
        return _timed(fn) / len(payloads) * 1e6
    steps = {
        "pil_full_decode_us": lambda: [_pil_load(p) for p in payloads],
        "peer_work_us": lambda: [jpeg_work(p, rng) for p in payloads],
        "region_decode_us": lambda: [jpegdecode.decode_region(
            p, plan.params.boxes[k], 8, buf, 4, turns[k]) for k, p in enumerate(payloads)],
        "loader_work_us": lambda: fill_range(ctx, plan, 0, len(payloads), 0, out, scratch)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {k: min(per_image(fn) for _ in range(rounds)) for k, fn in steps.items()}
    finally:
        torch.set_num_threads(threads)


def largest_scratch(entries) -> int:
    """Scratch bytes the largest of these records (index entries) needs: camera photos
    are far larger than the bench's synthetic images."""
    from dlpack_io.reader import jpegdecode

    sizes = [(int(e["height"]), int(e["width"])) for e in entries]
    return max((max(jpegdecode.scratch_bytes(h, w), jpegdecode.scratch_bytes(w, h))
                for h, w in sizes), default=0)  # either way round: EXIF-rotated records


def decode_limit(jpeg_path, threads: int | None = None) -> float:
    """images/s of our region decode + resize into CHW alone (no loader), same boxes as the Loader,
    in ``threads`` threads (default: one per core; the C decoder releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    from dlpack_io.reader import Dataset, RandomResizedCrop, jpegdecode
    from dlpack_io.reader.batch.plan import Draws

    ds, rrc, threads = Dataset(jpeg_path), RandomResizedCrop(SIZE), threads or os.cpu_count()
    jobs, entries = [], []
    for i in range(len(ds)):
        payload, entry = ds.record(i)
        box = rrc.boxes([int(entry["height"])], [int(entry["width"])], Draws(0, 0), [i])[0]
        jobs.append((bytes(payload), box, int(entry["orientation"])))
        entries.append(entry)
    nbytes = largest_scratch(entries)

    def work(part):
        buf = np.empty(nbytes, np.uint8)
        out = np.empty(3 * SIZE * SIZE, np.uint8)  # CHW, as the Loader's host path writes
        for payload, box, orientation in part:
            jpegdecode.decode_resized(payload, box, (SIZE, SIZE), buf, orientation=orientation,
                                      into=(out, 0, False, False))
    with ThreadPoolExecutor(threads) as pool:
        seconds = _timed(lambda: list(pool.map(work, [jobs[k::threads] for k in range(threads)])))
    return len(jobs) / seconds


def repeat_dataset(src, dst, num_samples: int, max_shards: int = 4096) -> None:
    """A data set of ``num_samples``+ whose shards are hard links of ``src``'s shards, or
    fewer samples where that would take more than ``max_shards`` shards (a tiny source:
    file systems cap the links of one file, ext4 at 65,000)."""
    import shutil

    from dlpack_io.reader import format as fmt

    shutil.rmtree(dst, ignore_errors=True)  # links of an earlier conversion would be stale
    manifest = json.loads((Path(src) / fmt.MANIFEST_NAME).read_text())
    os.makedirs(dst, exist_ok=True)
    shards, first, k = [], 0, 0
    while first < num_samples and k + len(manifest["shards"]) <= max(max_shards,
                                                                      len(manifest["shards"])):
        for entry in manifest["shards"]:
            name = fmt.shard_name(k, manifest["format"])
            os.link(Path(src) / entry["name"], Path(dst) / name)
            shards.append(dict(entry, name=name, first_sample=first))
            first, k = first + entry["num_samples"], k + 1
    copies = k // len(manifest["shards"])
    big = dict(manifest, shards=shards, num_samples=first, num_bytes=manifest["num_bytes"] * copies,
               class_counts=[c * copies for c in manifest["class_counts"]])
    big["checksum"] = fmt.manifest_checksum(big)
    (Path(dst) / fmt.MANIFEST_NAME).write_text(json.dumps(big))


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
    return {"first_batch_samples": runs[0][0],
            "first_batch_s": float(np.median([r[1] for r in runs])),
            "first_batch_s_with_imports": float(np.median([r[2] for r in runs]))}


def measure(paths, stores: dict, quick: bool, big_samples: int = 100_000) -> dict:
    """All limits as one dict (images/s, GB/s, us), with the core count. ``stores``: the
    converted stores by key ('numpy-raw', 'ours-record-jpeg', ...) -> folder; a limit
    whose store is missing is left out."""
    seconds, rounds = (1.0, 2) if quick else (3.0, 5)
    out = {"cores": os.cpu_count(), **jpeg_limits(paths, seconds),
           "memcpy_gb_per_s": memcpy_gb_per_s()}
    if "numpy-raw" in stores:
        out.update(raw_limits(os.path.join(stores["numpy-raw"], "raw.npy"), seconds / 2))
    if "ours-record-raw" in stores:
        out.update(gather_vs_memcpy(stores["ours-record-raw"], rounds=rounds))
        big = stores["ours-record-raw"] + f"-x{big_samples}"
        repeat_dataset(stores["ours-record-raw"], big, big_samples)
        out.update(first_batch(big, reps=rounds))
    if "ours-record-jpeg" in stores:
        out.update(decode_breakdown(stores["ours-record-jpeg"], rounds=rounds))
    for key in ("ours-record-jpeg", "ours-record-plain-jpeg"):
        if key in stores:
            out[f"decode_limit_{key}"] = decode_limit(stores[key])
    return out
