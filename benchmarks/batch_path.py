"""The batch path's own cost: images/s and CPU per image of steady-state epochs, for comparing
two checkouts of this repository side by side (the re-design's before/after).

    python -m benchmarks.batch_path prepare DIR [--count 512]    # ImageNet-like JPEGs, packed
    python -m benchmarks.batch_path epochs DIR [--rounds 5] [--kinds thread,process]
    python -m benchmarks.batch_path steps DIR --batches N       # N batches, for callgrind

``epochs`` reads each data set's files once (untimed: this machine evicts idle page cache),
then runs whole epochs of RandomResizedCrop(224) + flip + Normalize (float16) with 2 workers
of each kind, batch 64, and prints one JSON line per epoch: images/s and CPU-ms per image as
``loader.stats()`` measures them (every thread of this process and every worker process),
and the machine's load. ``steps`` runs N batches with num_workers=0 and exits: run it under
``valgrind --tool=callgrind`` for two values of N and divide the difference in instructions
by the difference in images to get the instructions per image of the whole batch path,
immune to the machine's noise. The script uses only keywords both checkouts accept.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks import warm_page_cache

SIZE = 224
BATCH = 64


def prepare(root: str, count: int) -> None:
    """``count`` photo-like 500x375 JPEGs (~110 KB) in 10 classes under ROOT/src, packed
    into ROOT/jpeg (restart markers, the default) and ROOT/planes (``--mode planes``)."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    make_image_folder(os.path.join(root, "src"), count, 10, seed=7, size=(375, 500))
    for mode in ("jpeg", "planes"):
        convert(os.path.join(root, "src"), os.path.join(root, mode), mode=mode, workers=2,
                progress=False, overwrite=True)


def _loader(root: str, kind: str, workers: int, seed: int = 0):
    import torch

    from dlpack_io.reader import (Dataset, Loader, Normalize, RandomHorizontalFlip,
                                  RandomResizedCrop)

    kw = {"worker_kind": kind} if workers else {}
    return Loader(Dataset(os.path.join(root, "jpeg")), batch_size=BATCH, num_workers=workers,
                  seed=seed, dtype=torch.float16, drop_last=True,
                  transforms=[RandomResizedCrop(SIZE), RandomHorizontalFlip(), Normalize()],
                  **kw)


def epochs(root: str, rounds: int, kinds: list[str]) -> None:
    """One JSON line per timed epoch: kind, images/s, CPU-ms per image, load."""
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)  # the same keywords on both sides
    loaders = {kind: _loader(root, kind, 2) for kind in kinds}
    for loader in loaders.values():  # the workers start and warm up: untimed
        for _ in loader:
            pass
    for r in range(rounds):
        for kind, loader in loaders.items():
            warm_page_cache(os.path.join(root, "jpeg"))
            for _ in loader:
                pass
            s = loader.stats()
            print(json.dumps({"round": r, "kind": kind, "images_per_s": round(s.images_per_s, 1),
                              "cpu_ms_per_image": round(s.cpu_ms_per_image, 3),
                              "load": os.getloadavg()[0]}), flush=True)
    for loader in loaders.values():
        loader.close()


def steps(root: str, batches: int) -> None:
    """Deliver ``batches`` batches in the calling thread (num_workers=0), then exit."""
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)
    loader = _loader(root, "thread", 0)
    it = iter(loader)
    t0 = time.process_time()
    for _ in range(batches):
        next(it)
    print(json.dumps({"batches": batches, "cpu_s": time.process_time() - t0}))


def main(argv=None) -> None:
    """The command line above."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("root")
    a.add_argument("--count", type=int, default=512)
    b = sub.add_parser("epochs")
    b.add_argument("root")
    b.add_argument("--rounds", type=int, default=5)
    b.add_argument("--kinds", default="thread,process")
    c = sub.add_parser("steps")
    c.add_argument("root")
    c.add_argument("--batches", type=int, required=True)
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.root, args.count)
    elif args.cmd == "epochs":
        epochs(args.root, args.rounds, args.kinds.split(","))
    else:
        steps(args.root, args.batches)


if __name__ == "__main__":
    main()
