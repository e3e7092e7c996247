"""``python -m dlpack_io.tools.demo DST``: read one epoch of a packed data set, print throughput."""
from __future__ import annotations

import argparse
import time


def read_epoch(path, batch_size: int = 64) -> dict:
    """Decode every sample of ``path`` once in batches; return counts and rates."""
    import numpy as np

    from dlpack_io.reader import Dataset

    ds = Dataset(path)
    start = time.perf_counter()
    order = np.random.default_rng(0).permutation(len(ds))
    images = nbytes = 0
    for b in range(0, len(order), batch_size):
        batch = [ds[int(i)] for i in order[b:b + batch_size]]
        images += len(batch)
        nbytes += sum(x.nbytes for x, _ in batch)
    seconds = time.perf_counter() - start
    return {"images": images, "seconds": seconds, "images_per_s": images / seconds,
            "decoded_mb_per_s": nbytes / 1e6 / seconds}


def main(argv=None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("path", help="a packed data set folder")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    r = read_epoch(args.path, args.batch_size)
    print(f"epoch: {r['images']} images in {r['seconds']:.2f} s = {r['images_per_s']:.0f} images/s "
          f"({r['decoded_mb_per_s']:.0f} MB/s of decoded pixels), random order, 1 process")


if __name__ == "__main__":
    main()
