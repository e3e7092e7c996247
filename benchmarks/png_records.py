"""A folder of PNGs, packed two ways: ``--non-jpeg keep`` (the default: each PNG stored as its
own file, decoded with PIL on read) and ``--non-jpeg raw`` (upright RGB pixels, no decode on
read). Bytes on disk against the PNGs', and what reading costs: one Loader epoch
(RandomResizedCrop(224) + flip, 2 thread workers), images/s and CPU-ms per image
(process CPU time over the epoch), interleaved, medians of repeats.

    python -m benchmarks.png_records [--images 400] [--repeats 5] [--noise 4]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def _pngs(folder: str, count: int, noise: float) -> int:
    """``count`` photo-like PNGs (375 x 500) in two class folders; their bytes."""
    import numpy as np
    from PIL import Image

    from dlpack_io.tools.synth import photo_like

    rng, total = np.random.default_rng(0), 0
    for k in range(count):
        os.makedirs(os.path.join(folder, f"c{k % 2}"), exist_ok=True)
        path = os.path.join(folder, f"c{k % 2}", f"{k:05d}.png")
        Image.fromarray(photo_like(rng, 375, 500, noise=noise)).save(path)
        total += os.path.getsize(path)
    return total


def _epoch(ds) -> tuple[float, float]:
    """(images/s, CPU-ms per image) of one epoch."""
    from dlpack_io.reader import Loader, RandomHorizontalFlip, RandomResizedCrop

    loader = Loader(ds, batch_size=64, num_workers=2, seed=0,
                    transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in loader:
        pass
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    loader.close()
    return len(ds) / wall, 1000 * cpu / len(ds)


def main() -> None:
    """Print the sizes and the medians of each way (JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--noise", type=float, default=4.0, help="photo_like's per-pixel noise")
    args = parser.parse_args()
    from dlpack_io.packer import convert
    from dlpack_io.reader import Dataset

    out = {"images": args.images, "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        out["png_mb"] = round(_pngs(os.path.join(tmp, "src"), args.images, args.noise) / 1e6, 1)
        sets = {}
        for way in ("keep", "raw"):
            result = convert(os.path.join(tmp, "src"), os.path.join(tmp, way), non_jpeg=way,
                             workers=2, progress=False)
            out[f"{way}_mb"] = round(result["num_bytes"] / 1e6, 1)
            sets[way] = Dataset(os.path.join(tmp, way))
        runs = {way: [] for way in sets}
        for ds in sets.values():
            _epoch(ds)  # warm: page cache, pools
        for _ in range(args.repeats):  # interleaved
            for way, ds in sets.items():
                runs[way].append(_epoch(ds))
    for way, rows in runs.items():
        out[f"{way}_images_per_s"] = round(statistics.median(r[0] for r in rows))
        out[f"{way}_cpu_ms_per_image"] = round(statistics.median(r[1] for r in rows), 2)
    out["keep_size_vs_png"] = round(out["keep_mb"] / out["png_mb"], 3)
    out["raw_size_vs_png"] = round(out["raw_mb"] / out["png_mb"], 3)
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
