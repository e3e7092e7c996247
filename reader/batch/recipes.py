"""The steps that act on a delivered batch rather than on one sample: RandomErasing on the
device path (the host path erases in the workers, jobs.py) and MixUp / CutMix (always here,
on the batch's device, as torchvision's reference script mixes after its DataLoader).

Also where the Loader learns that a spec cannot run on the GPU kernels (an interpolation
the kernel lacks) and falls back to host transforms, saying so.
"""
from __future__ import annotations

import logging

import numpy as np

from dlpack_io.reader.batch.erasing import erase_rows
from dlpack_io.reader.batch.mixing import mix_batch

log = logging.getLogger(__name__)


def kernel_cannot(spec) -> str | None:
    """Why the GPU kernels cannot finish batches of ``spec`` (None when they can)."""
    if spec.augment is not None:
        return (f"{type(spec.augment).__name__} runs per sample on the host (the GPU kernels "
                f"do not have its ops)")
    if spec.pad:
        return "pad=True makes each image at its own size (the GPU kernels write one size)"
    mode, _ = spec.resample
    if mode != "bilinear":
        return (f"interpolation={mode!r}: the GPU kernel resamples bilinearly (with or "
                f"without antialias) only")
    return None


def place_transforms(spec, on_device: bool, asked) -> bool:
    """Whether the transforms run on the device: ``on_device`` unless the kernels cannot do
    ``spec``; then host transforms (logged), or an error when ``device_transforms=True``
    was asked for explicitly."""
    reason = kernel_cannot(spec) if on_device else None
    if reason is None:
        return on_device
    if asked:
        raise ValueError(f"device_transforms=True, but {reason}: pass device_transforms=None "
                         f"(host transforms, then one copy)")
    log.info("Loader: %s; transforming on the host and copying finished batches", reason)
    return False


class BatchFinish:
    """Erasing (device path only) and mixing of each delivered batch."""

    def __init__(self, spec, seed: int, num_classes: int, device_transforms: bool):
        self.spec, self.seed = spec, int(seed)
        self.erase_here = device_transforms and spec.erasing is not None
        self.num_classes = next((m.num_classes for m in spec.mixes
                                 if m.num_classes is not None), int(num_classes))
        if spec.mixes and self.num_classes < 1:
            raise ValueError("MixUp/CutMix: the data set lists no classes; pass "
                             "num_classes=N to MixUp / CutMix")

    @property
    def active(self) -> bool:
        """True when there is anything to do."""
        return self.erase_here or bool(self.spec.mixes)

    def __call__(self, images, labels, indices, epoch: int, key: int):
        """(images, labels) after erasing / mixing; ``key`` is the batch's first planned
        sample index (what its mixing draw is a function of, with seed and epoch)."""
        if self.erase_here:
            erase_rows(self.spec.erasing, self.seed, epoch, np.asarray(indices), images)
        if self.spec.mixes and len(labels):
            images, labels = mix_batch(self.spec.mixes, self.seed, epoch, key, images, labels,
                                       self.num_classes)
        return images, labels
