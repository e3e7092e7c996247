"""The bare work of a batch, for instruction counts: the region decode + resize + flip into
CHW of the same records and boxes the Loader's RandomResizedCrop(224) + flip draws, with
nothing around it (no plan, no buffers, no workers, no epilogue).

    python -m benchmarks.bare_decode DIR --images N [--set planes]
    # DIR: benchmarks.batch_path's; --set: its jpeg (default) or planes data set

Run it under ``valgrind --tool=callgrind`` for two values of N (e.g. 128 and 384) and divide
the difference in instructions by the difference in images: the bare cost per image, to set
beside ``benchmarks.batch_path steps`` measured the same way (the Loader's whole batch path).
"""
from __future__ import annotations

import argparse
import os

import numpy as np


def main(argv=None) -> None:
    """Decode N records of DIR/jpeg (or DIR/planes) as the Loader would, and nothing else."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root")
    p.add_argument("--images", type=int, required=True)
    p.add_argument("--set", default="jpeg", choices=("jpeg", "planes"))
    args = p.parse_args(argv)
    from dlpack_io.reader import Dataset, RandomHorizontalFlip, RandomResizedCrop, jpegdecode
    from dlpack_io.reader.batch.plan import compile_spec, plan_batch

    ds = Dataset(os.path.join(args.root, args.set))
    idx = np.arange(args.images) % len(ds)
    spec = compile_spec([RandomResizedCrop(224), RandomHorizontalFlip()])
    plan = plan_batch(spec, ds, idx, seed=0, epoch=0)
    out = np.empty((len(idx), 3, 224, 224), np.uint8).reshape(-1)
    buf = np.empty(jpegdecode.scratch_bytes(1000, 1000), np.uint8)
    plane = 3 * 224 * 224
    p = plan.params
    for k in range(len(idx)):
        payload = ds.shards[plan.shard_ids[k]].payload(int(plan.local[k]))
        jpegdecode.decode_resized(payload, p.boxes[k], (224, 224), buf, True,
                                  orientation=int(plan.entries[k]["orientation"]),
                                  into=(out, k * plane, p.flip_h[k], p.flip_v[k]))


if __name__ == "__main__":
    main()
