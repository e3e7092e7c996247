"""The step benchmark's data: ImageNet-like JPEGs written in parallel and packed once."""
from __future__ import annotations

import os
from pathlib import Path


def _write_images(job) -> None:
    """(In a pool process) write images ``start..stop`` of the synthetic folder."""
    root, start, stop, size, classes = job
    import numpy as np
    from PIL import Image

    from dlpack_io.tools.synth import photo_like

    for i in range(start, stop):
        rng = np.random.default_rng(i)
        h, w = (int(s * rng.uniform(0.85, 1.15)) for s in size)
        folder = Path(root) / f"class_{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo_like(rng, h, w)).save(folder / f"img_{i:07d}.jpg", quality=90)


def prepare_data(args, count: int, size=(375, 500), classes: int = 100) -> str:
    """A packed data set of ``count`` ImageNet-like JPEGs under ``--work-dir`` (made once,
    in parallel; reused when present)."""
    from concurrent.futures import ProcessPoolExecutor

    from dlpack_io.packer import convert

    dst = Path(args.work_dir) / f"packed-{count}-{size[0]}x{size[1]}"
    if (dst / "manifest.json").exists():
        return str(dst)
    src = Path(args.work_dir) / f"src-{count}-{size[0]}x{size[1]}"
    procs = os.cpu_count() or 1
    chunk = -(-count // procs)
    jobs = [(str(src), a, min(count, a + chunk), size, classes) for a in range(0, count, chunk)]
    with ProcessPoolExecutor(procs) as pool:
        list(pool.map(_write_images, jobs))
    convert(src, dst, mode="jpeg", workers=0, progress=False, overwrite=True)
    return str(dst)
