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
