"""Helpers shared by tests (imported by path: tests/ is not a package)."""
from __future__ import annotations

import json
import os

from dlpack_io.reader import format as fmt


def dataset_fingerprint(dst) -> dict:
    """Every file of a data set by name -> bytes, with the manifest's volatile keys dropped.

    Two conversions of the same input must have equal fingerprints.
    """
    out = {}
    for name in sorted(os.listdir(dst)):
        path = os.path.join(dst, name)
        with open(path, "rb") as f:
            data = f.read()
        if name == fmt.MANIFEST_NAME:
            manifest = json.loads(data)
            for key in fmt.VOLATILE_MANIFEST_KEYS:
                manifest.pop(key, None)
            data = json.dumps(manifest, sort_keys=True).encode()
        out[name] = data
    return out


def random_images(n, h, w, c=3, seed=0):
    """A reproducible (n, h, w, c) uint8 batch of random pixels, for kernel tests."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, h, w, c), dtype=torch.uint8, generator=g)


def pack_jpeg_and_raw(root, count: int, classes: int, seed: int, shard_size: str) -> dict:
    """Pack ``count`` small JPEGs (48x64) as a jpeg-mode and a raw (40x40) data set under
    ``root``; return {"jpeg": path, "raw": path}."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    make_image_folder(root / "src", count, classes, seed=seed, size=(48, 64))
    out = {}
    for mode, size in (("jpeg", None), ("raw", 40)):
        out[mode] = str(root / mode)
        convert(root / "src", out[mode], mode=mode, size=size, shard_size=shard_size, workers=1,
                progress=False, overwrite=True)
    return out
