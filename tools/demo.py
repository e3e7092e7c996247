"""``python -m dlpack_io.tools.demo DST``: read one epoch of a packed data set through the
Loader (random-resized-crop 224, horizontal flip, CHW batches) and print the throughput."""
from __future__ import annotations

import argparse
import time

from dlpack_io.tools.pagecache import warm


def read_epoch(path, *, batch_size: int = 64, num_workers: int = 2, device: str = "cpu") -> dict:
    """Iterate one shuffled epoch of ``path`` with the standard ImageNet training
    transforms; return counts, shapes and rates (the first batch timed separately)."""
    import torch

    from dlpack_io.reader import (Dataset, Loader, Normalize, RandomHorizontalFlip,
                                  RandomResizedCrop)

    warm(path)  # this machine evicts page cache left idle for ~30 s
    start = time.perf_counter()
    ds = Dataset(path)
    transforms = [RandomResizedCrop(224), RandomHorizontalFlip()]
    if device != "cpu":  # the usual training input on the GPU: normalised float16
        transforms.append(Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
    images = batches = 0
    first = shape = None
    with Loader(ds, batch_size=batch_size, shuffle="global", seed=0, num_workers=num_workers,
                transforms=transforms, device=device,
                dtype=torch.float16 if device != "cpu" else torch.uint8) as loader:
        loader.set_epoch(0)
        for x, y in loader:
            if first is None:
                first, shape = time.perf_counter() - start, tuple(x.shape)
            images += len(y)
            batches += 1
    seconds = time.perf_counter() - start
    return {"images": images, "batches": batches, "seconds": seconds, "first_batch_s": first,
            "batch_shape": shape, "images_per_s": images / seconds, "num_workers": num_workers}


def main(argv=None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a packed data set folder")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda to finish batches on the GPU")
    args = parser.parse_args(argv)
    r = read_epoch(args.path, batch_size=args.batch_size, num_workers=args.workers,
                   device=args.device)
    print(f"epoch: {r['images']} images in {r['batches']} batches of {r['batch_shape']} "
          f"in {r['seconds']:.2f} s = {r['images_per_s']:.0f} images/s "
          f"(first batch after {r['first_batch_s']:.2f} s; {r['num_workers']} worker threads; "
          f"decode -> random-resized-crop 224 -> flip -> CHW)")


if __name__ == "__main__":
    main()
