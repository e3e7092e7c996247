"""What it costs that nothing on disk vouches for an assembled shard: a process that did not
write (or verify) it checks every record's CRC once, reading the file with ``pread``
(reader/remote/assembled.py), before it maps it. Measured on a local data set
of photo-sized JPEGs (the assembled shard has exactly a local shard's layout), against one
Loader epoch over the same records (decode + RandomResizedCrop(224) + flip, 2 threads):
the one-time check as a share of one epoch.

    python -m benchmarks.assembled_verify [--images 1000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def _check_all(ds) -> float:
    """The work of assembled.py's check, on every shard: each record's span (image, field
    block) read with ``pread`` and its CRCs computed."""
    from dlpack_io.reader import format as fmt

    t0 = time.perf_counter()
    for shard in ds.shards:
        fd = os.open(shard.path, os.O_RDONLY)
        try:
            for j, e in enumerate(shard.index):
                flen, fcrc = shard.fields_entry(j)
                data = os.pread(fd, int(e["length"]) + flen, int(e["offset"]))
                if fmt.crc32(data[:int(e["length"])]) != int(e["crc"]) or \
                        (flen and fmt.crc32(data[int(e["length"]):]) != fcrc):
                    raise SystemExit(f"{shard.path}: record {j} fails its CRC")
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def _epoch(ds) -> float:
    from dlpack_io.reader import Loader, RandomHorizontalFlip, RandomResizedCrop

    loader = Loader(ds, batch_size=64, num_workers=2, seed=0,
                    transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])
    t0 = time.perf_counter()
    for _ in loader:
        pass
    seconds = time.perf_counter() - t0
    loader.close()
    return seconds


def main() -> None:
    """Print the medians (JSON): check seconds, MB/s, per 1000 images, share of an epoch."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from dlpack_io.packer import convert
    from dlpack_io.reader import Dataset
    from dlpack_io.tools.synth import make_image_folder

    with tempfile.TemporaryDirectory() as tmp:
        make_image_folder(os.path.join(tmp, "src"), args.images, 10, seed=0, size=(375, 500))
        convert(os.path.join(tmp, "src"), os.path.join(tmp, "ds"), shard_size="64MB",
                workers=2, progress=False)
        ds = Dataset(os.path.join(tmp, "ds"))
        nbytes = sum(s["bytes"] for s in ds.manifest["shards"])
        _check_all(ds), _epoch(ds)  # warm: page cache, thread pools
        checks, epochs = [], []
        for _ in range(args.repeats):  # interleaved
            checks.append(_check_all(ds))
            epochs.append(_epoch(ds))
    check, epoch = statistics.median(checks), statistics.median(epochs)
    print(json.dumps({
        "images": args.images, "mb": round(nbytes / 1e6, 1), "check_s": round(check, 4),
        "check_mb_per_s": round(nbytes / 1e6 / check), "check_ms_per_1000_images":
        round(1000 * check / args.images * 1000, 1), "epoch_s": round(epoch, 3),
        "epoch_images_per_s": round(args.images / epoch), "check_share_of_one_epoch":
        round(check / epoch, 4), "load": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
