"""Importing the peer libraries: version, the stubs they need here, and why one is missing."""
from __future__ import annotations

import importlib
import os
import sys
import types

# a family's ``needs`` -> (import name, distribution name)
PACKAGES = {
    "webdataset": ("webdataset", "webdataset"),
    "streaming": ("streaming", "mosaicml-streaming"),
    "litdata": ("litdata", "litdata"),
    "ffcv": ("ffcv", "ffcv"),
    "lmdb": ("lmdb", "lmdb"),
    "boto3": ("boto3", "boto3"),        # the remote and s3-client sections
    "obstore": ("obstore", "obstore"),
}


def import_streaming():
    """Import MosaicML Streaming with ``streaming.vision`` stubbed (it imports torchvision)."""
    if "streaming.vision" not in sys.modules:
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
    return importlib.import_module("streaming")


def _install_note(dist: str) -> str:
    """What scripts/bench.sh logged about installing ``dist`` (its failure reason), if any."""
    log = os.path.join(sys.prefix, "peer-install.log")
    if not os.path.exists(log):
        return ""
    with open(log) as f:
        notes = [ln.strip() for ln in f if ln.startswith(f"FAIL {dist}:")]
    return "; ".join(n.split(":", 1)[1].strip() for n in notes)


def peer_status(package: str) -> dict:
    """{"ok": True, "version": v} or {"ok": False, "reason": "not installed: <why>"}."""
    from importlib import metadata

    module, dist = PACKAGES[package]
    try:
        import_streaming() if module == "streaming" else importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        why = _install_note(dist) or f"import {module} failed: {type(exc).__name__}: {exc}"
        return {"ok": False, "reason": f"not installed: {why}"}
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = getattr(sys.modules.get(module), "__version__", "unknown")
    return {"ok": True, "version": version}


def ffcv_write(inputs, path: str, mode: str, raw_npy) -> None:
    """Write an FFCV .beton: jpg mode (re-encodes at q90) or raw 256x256 pixels."""
    import numpy as np
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    class _Images:
        def __len__(self):
            return len(inputs.labels)

        def __getitem__(self, i):
            if mode == "raw":
                return np.load(raw_npy, mmap_mode="r")[i], int(inputs.labels[i])
            from PIL import Image
            with Image.open(os.path.join(inputs.root, inputs.paths[i])) as img:
                return np.asarray(img.convert("RGB")), int(inputs.labels[i])

    field = RGBImageField(write_mode="jpg" if mode == "jpeg" else "raw", jpeg_quality=90)
    writer = DatasetWriter(path, {"image": field, "label": IntField()},
                           num_workers=os.cpu_count())
    writer.from_indexed_dataset(_Images())
