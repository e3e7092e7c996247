"""Two builds of the C extension (``dlpack_io.reader._jpeg``) against each other on the bare
work of a batch: before/after figures for a change to the native decoder or resize.

    cp reader/_jpeg*.so /tmp/before.so      # before the change
    ...change, rebuild (python setup.py build_ext --inplace)...
    python -m benchmarks.native_ab DIR --before /tmp/before.so [--images 256] [--rounds 9]
    # DIR: benchmarks.batch_path's (its jpeg or, --set planes, planes data set)

Both builds are loaded into one process and do the same work in turns, before, after,
before, ... (``benchmarks.bare_decode``'s loop: the region decode + resize + flip into CHW
of the crops the Loader's RandomResizedCrop(224) + flip draws), each pass timed by this
thread's CPU clock; the after/before ratio of each pair, and its median over rounds, so
a slower or faster moment of the machine cancels out. Pixels of both builds are compared
too: a change that was meant to be faster only must leave them equal.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import statistics
import time

import numpy as np

SIZE = 224


def _load(path: str, name: str):
    """The extension module built at ``path``, imported under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"{name}._jpeg", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> None:
    """Time the bare loop with each build in turns; print one JSON line per round and the
    medians."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--before", required=True, help="the other build's .so file")
    p.add_argument("--after", default=None, help="default: the in-place build in reader/")
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--set", default="jpeg", choices=("jpeg", "planes"))
    args = p.parse_args(argv)
    from dlpack_io.reader import Dataset, RandomHorizontalFlip, RandomResizedCrop, jpegdecode
    from dlpack_io.reader.batch.plan import compile_spec, plan_batch

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    after = args.after or sorted(glob.glob(os.path.join(here, "reader", "_jpeg*.so")))[0]
    builds = {"before": _load(args.before, "before"), "after": _load(after, "after")}
    ds = Dataset(os.path.join(args.root, args.set))
    idx = np.arange(args.images) % len(ds)
    plan = plan_batch(compile_spec([RandomResizedCrop(SIZE), RandomHorizontalFlip()]), ds, idx,
                      seed=0, epoch=0)
    payloads = [bytes(ds.shards[plan.shard_ids[k]].payload(int(plan.local[k])))
                for k in range(len(idx))]
    buf = np.empty(jpegdecode.scratch_bytes(1000, 1000), np.uint8)
    plane = 3 * SIZE * SIZE
    outs = {k: np.empty(len(idx) * plane, np.uint8) for k in builds}

    def run(which: str) -> float:
        jpegdecode.native_decode_resized = builds[which].decode_resized
        out, prm = outs[which], plan.params
        t0 = time.thread_time()
        for k, payload in enumerate(payloads):
            jpegdecode.decode_resized(payload, prm.boxes[k], (SIZE, SIZE), buf, True,
                                      orientation=int(plan.entries[k]["orientation"]),
                                      into=(out, k * plane, prm.flip_h[k], prm.flip_v[k]))
        return (time.thread_time() - t0) / len(payloads) * 1e6

    run("before"), run("after")  # warm both: tables, caches, first-touch pages
    if not np.array_equal(outs["before"], outs["after"]):
        raise SystemExit("the two builds decode different pixels")
    ratios, times = [], {"before": [], "after": []}
    for r in range(args.rounds):
        b0, a, b1 = run("before"), run("after"), run("before")
        times["before"].append((b0 + b1) / 2)
        times["after"].append(a)
        ratios.append(a / ((b0 + b1) / 2))
        print(json.dumps({"round": r, "before_us": round((b0 + b1) / 2, 1), "after_us": round(a, 1),
                          "after_over_before": round(ratios[-1], 3),
                          "load": round(os.getloadavg()[0], 2)}), flush=True)
    print(json.dumps({"images": len(payloads), "pixels_equal": True,
                      "before_us": round(statistics.median(times["before"]), 1),
                      "after_us": round(statistics.median(times["after"]), 1),
                      "after_over_before": round(statistics.median(ratios), 3)}))


if __name__ == "__main__":
    main()
