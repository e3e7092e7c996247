"""What the untrusted-input checks cost (issue 16, issue 13): opening a large data set, and
the per-batch shard identity check against the Loader's time per batch.

    python -m benchmarks.cost_of_checks open --root /tmp/big --samples 1300000 \
        [--before-python OTHER/python] [--repeats 5]
    python -m benchmarks.cost_of_checks batch --root /tmp/small [--repeats 5]

``open`` writes a data set of ``--samples`` ImageNet-like records (index, metadata and
manifest real; the data sections are sparse holes, so it takes no disk) and times, in
fresh processes, ``Dataset(path)`` and opening every shard's index, for this checkout
and, with ``--before-python``, for another install (e.g. the code before the checks),
interleaved round by round; medians. ``batch`` times ``Dataset.check_unchanged`` for a
batch of 256 samples spread over 256 opened shards (global shuffle's worst case) and a
Loader epoch over generated JPEGs and raw records on this machine; it prints the ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from dlpack_io.reader import format as fmt

SHARD_BYTES = 256 * 10**6
MEAN_RECORD = 110_000


def make_sparse_dataset(root: str, samples: int, seed: int = 0) -> dict:
    """A record data set of ``samples`` records whose data sections are sparse holes."""
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(np.log(MEAN_RECORD), 0.4, samples).astype(np.uint32).clip(1000, 2**24)
    os.makedirs(root, exist_ok=True)
    shards, start, k = [], 0, 0
    while start < samples:
        stop = start + int(np.searchsorted(np.cumsum(lengths[start:], dtype=np.int64),
                                           SHARD_BYTES)) + 1
        shards.append(_write_shard(root, k, start, lengths[start:stop], rng))
        start, k = stop, k + 1
    labels = np.concatenate([s.pop("labels") for s in shards])
    manifest = {"kind": fmt.MANIFEST_KIND, "version": fmt.FORMAT_VERSION, "format": "record",
                "mode": "jpeg", "num_samples": samples,
                "num_bytes": sum(s["bytes"] for s in shards),
                "classes": [f"n{i:08d}" for i in range(1000)],
                "class_counts": np.bincount(labels, minlength=1000).tolist(), "shards": shards,
                "options": {}, "source": {"root": None, "list": None, "num_inputs": samples},
                "rejects": [], "reencoded": {}, "lossless": {}, "created": {}}
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    with open(os.path.join(root, fmt.MANIFEST_NAME), "wb") as f:
        f.write(fmt.encode_meta(manifest))
    return {"samples": samples, "shards": len(shards)}


def _write_shard(root, k, first, lengths, rng) -> dict:
    n = len(lengths)
    starts, end = fmt.record_offsets(lengths)
    index = np.zeros(n, fmt.INDEX_DTYPE)
    index["offset"], index["length"] = starts, lengths
    index["label"] = rng.integers(0, 1000, n)
    index["crc"] = rng.integers(0, 2**32, n, dtype=np.uint64)
    index["height"], index["width"] = rng.integers(200, 500, n), rng.integers(200, 500, n)
    index["channels"], index["kind"], index["orientation"] = 3, fmt.KIND_JPEG, 1
    meta = fmt.encode_meta({"shard": k, "first_sample": first,
                            "paths": [f"n{int(lab):08d}/img_{first + i:08d}.JPEG"
                                      for i, lab in enumerate(index["label"])]})
    data_size = end - fmt.HEADER_SIZE
    page, header = fmt.pack_header(n, data_size, len(meta), fmt.crc32(index.tobytes()),
                                   fmt.crc32(meta))
    name = fmt.shard_name(k, "record")
    with open(os.path.join(root, name), "wb") as f:
        f.write(page)
        f.seek(end)  # the data section stays a hole
        f.write(index.tobytes())
        f.write(meta)
    return {"name": name, "num_samples": n, "first_sample": first,
            "bytes": header.meta_offset + len(meta), "crc": header.header_crc,
            "labels": index["label"].astype(np.int64)}


OPEN_CHILD = """
import sys, time, json
t0 = time.perf_counter()
from dlpack_io.reader import Dataset
t1 = time.perf_counter()
ds = Dataset(sys.argv[1])
t2 = time.perf_counter()
n = sum(len(s.index) for s in ds.shards)
t3 = time.perf_counter()
print(json.dumps({"dataset": t2 - t1, "indexes": t3 - t2, "total": t3 - t1, "n": n}))
"""


def _warm(root: str) -> None:
    """Read every non-hole byte once so both contenders see a warm page cache."""
    for name in os.listdir(root):
        with open(os.path.join(root, name), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if name.endswith(".rec"):
                f.read(fmt.HEADER_SIZE)
                h = fmt.unpack_header(open(os.path.join(root, name), "rb").read(fmt.HEADER_SIZE),
                                      size, name)
                f.seek(h.index_offset)
            f.read()


def time_open(root: str, pythons: dict, repeats: int) -> dict:
    """{contender: median seconds of each phase} over ``repeats`` interleaved rounds."""
    runs = {name: [] for name in pythons}
    for _ in range(repeats):
        _warm(root)
        for name, python in pythons.items():
            out = subprocess.run([python, "-c", OPEN_CHILD, root], capture_output=True,
                                 text=True, check=True).stdout
            runs[name].append(json.loads(out))
    return {name: {k: statistics.median(r[k] for r in rs) for k in ("dataset", "indexes", "total")}
            for name, rs in runs.items()}


def time_batch(root: str, repeats: int) -> dict:
    """check_unchanged of 256 opened shards vs. Loader seconds per batch of 256."""
    from dlpack_io.packer import convert
    from dlpack_io.reader import Dataset, Loader, RandomResizedCrop
    from dlpack_io.tools.synth import make_image_folder

    src = os.path.join(root, "src")
    if not os.path.isdir(src):
        make_image_folder(src, 1024, 8, seed=0)
    out = {}
    for mode, kw in (("jpeg", {}), ("raw", {"mode": "raw", "size": 256})):
        dst = os.path.join(root, mode)
        if not os.path.exists(os.path.join(dst, fmt.MANIFEST_NAME)):
            convert(src, dst, workers=2, progress=False, shard_size="4MB", **kw)
        ds = Dataset(dst)
        loader = Loader(ds, batch_size=256, num_workers=2, transforms=[RandomResizedCrop(224)])
        epochs = []
        for _ in range(repeats):
            t = time.perf_counter()
            batches = sum(1 for _ in loader)
            epochs.append((time.perf_counter() - t) / batches)
        out[mode] = {"loader_s_per_batch": statistics.median(epochs), "shards": len(ds.shards)}
    ids = np.arange(256) % len(ds.shards)
    for k in np.unique(ids):
        ds.shards[int(k)].index  # opened, as a worker would have
    calls = []
    for _ in range(repeats * 20):
        t = time.perf_counter()
        ds.check_unchanged(ids)
        calls.append(time.perf_counter() - t)
    check = statistics.median(calls) * 256 / len(np.unique(ids))  # scaled to 256 shards
    for mode in out:
        out[mode]["check_s_per_batch_256_shards"] = check
        out[mode]["ratio"] = check / out[mode]["loader_s_per_batch"]
    return out


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["open", "batch"])
    parser.add_argument("--root", required=True)
    parser.add_argument("--samples", type=int, default=1_300_000)
    parser.add_argument("--before-python", help="python of the install to compare against")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.what == "open":
        if not os.path.exists(os.path.join(args.root, fmt.MANIFEST_NAME)):
            print(json.dumps(make_sparse_dataset(args.root, args.samples)))
        pythons = {"this checkout": sys.executable}
        if args.before_python:
            pythons["before"] = args.before_python
        print(json.dumps(time_open(args.root, pythons, args.repeats), indent=1))
    else:
        print(json.dumps(time_batch(args.root, args.repeats), indent=1))


if __name__ == "__main__":
    main()
