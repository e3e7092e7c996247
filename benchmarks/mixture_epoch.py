"""A Mixture of two local data sets against one data set of the same images (issue 29).

    python -m benchmarks.mixture_epoch make --root /tmp/mixb --images 2000
    python -m benchmarks.mixture_epoch run --root /tmp/mixb --repeats 5

``make`` writes two folders of ``--images / 2`` photo-like JPEGs each (tools/synth.py,
~375x500), packs each as a data set (``a``, ``b``) and both together as ``one`` (the same
files). ``run`` times Loader epochs in this one process, the two contenders alternated
round by round (medians of ``--repeats``): ``one`` read as a Dataset, and
``Mixture([a, b])`` with weights proportional to their sizes (``epoch="sum"``: the same
number of samples, each once). Each epoch: RandomResizedCrop(224) + flip on the host, batch
256, 2 thread workers, uint8, after one warm-up batch. Also the cost of the epoch order
alone for 1.28 million samples (order.epoch_order vs sources.mixture_order of two halves).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time


def make(root: str, images: int) -> None:
    """The folders ``src_a``, ``src_b`` and ``src_one`` (both), packed as a, b and one."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    for name, seed in (("a", 1), ("b", 2)):
        src = os.path.join(root, f"src_{name}")
        make_image_folder(src, images // 2, 10, seed=seed)
        for cls in os.listdir(src):   # the same files again, under one root
            shutil.copytree(os.path.join(src, cls), os.path.join(root, "src_one", cls),
                            dirs_exist_ok=True, copy_function=shutil.copy)
            for f in os.listdir(os.path.join(src, cls)):
                os.replace(os.path.join(root, "src_one", cls, f),
                           os.path.join(root, "src_one", cls, f"{name}_{f}"))
    for name in ("a", "b", "one"):
        convert(os.path.join(root, f"src_{name}"), os.path.join(root, name), progress=False,
                overwrite=True)


def epoch(source) -> float:
    """Images per second of one Loader epoch over ``source`` (after a warm-up batch)."""
    from dlpack_io.reader import Loader, RandomHorizontalFlip, RandomResizedCrop

    loader = Loader(source, batch_size=256, num_workers=2, seed=0, drop_last=True,
                    transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])
    it = iter(loader)
    next(it)
    start, n = time.perf_counter(), 0
    for images, _ in it:
        n += len(images)
    loader.close()
    return n / (time.perf_counter() - start)


def order_cost(n: int = 1_281_167, repeats: int = 5) -> dict:
    """Seconds to compute one epoch's order: one set of ``n`` vs two halves mixed."""
    import numpy as np

    from dlpack_io.reader.batch import sources
    from dlpack_io.reader.batch import order as order_mod

    half = n // 2
    sizes, offsets = [half, n - half], np.array([0, half])
    cases = {"one set: order.epoch_order": lambda e: order_mod.epoch_order(n, "global", 0, e),
             "two sets: sources.mixture_order": lambda e: sources.mixture_order(
                 sizes, sizes, offsets, n, shuffle="global", seed=0, epoch=e)}
    times = {k: [] for k in cases}
    for e in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn(e)
            times[name].append(time.perf_counter() - t0)
    return {k: round(statistics.median(v), 3) for k, v in times.items()}


def run(root: str, repeats: int) -> dict:
    """Alternated medians of the two contenders of the module docstring, and their ratio."""
    from dlpack_io.reader import Dataset, Mixture

    one = Dataset(os.path.join(root, "one"))
    mix = Mixture([Dataset(os.path.join(root, "a")), Dataset(os.path.join(root, "b"))])
    if len(mix) != len(one):
        raise SystemExit(f"{root}: the mixture has {len(mix)} samples, one {len(one)}: "
                         f"run make again")
    times = {"one data set": [], "Mixture of two": []}
    for _ in range(repeats):
        times["one data set"].append(epoch(one))
        times["Mixture of two"].append(epoch(mix))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"images_per_s": {k: {"median": round(med[k]), "all": [round(x) for x in v]}
                             for k, v in times.items()},
            "ratio_mixture_over_one": round(med["Mixture of two"] / med["one data set"], 3),
            "order_seconds": order_cost()}


def main() -> None:
    """The command line above."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["make", "run"])
    p.add_argument("--root", default="/tmp/mixture-bench")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    if a.what == "make":
        make(a.root, a.images)
    else:
        sys.stdout.write(json.dumps(run(a.root, a.repeats), indent=1) + "\n")


if __name__ == "__main__":
    main()
