"""dlpack_io.kernels: fused GPU batch transforms (Triton) with torch fallbacks.

Public functions (imported lazily, so ``import dlpack_io.kernels`` imports neither
triton nor the op modules):

* :func:`crop_flip_permute` - per-sample crop + flips + NHWC->NCHW + normalise + cast.
* :func:`resized_crop` - per-sample box resampled (bilinear, optional antialias) to a
  fixed size, fused with the same tail; dense or ragged (flat buffer + offsets) input.
* :func:`crop_flip_permute_packed`, :func:`resized_crop_packed` - the same ops reading every
  per-sample value from one records tensor (:mod:`records`), so one copy carries a batch.
* :func:`mask_gather` - nearest-neighbour crop / resize / flip / pad of a batch of label
  maps (uint8 / uint16 masks), driven by per-sample source row and column tables.
* :mod:`records` - the per-sample record layout and its host/device helpers.
* :mod:`reference` - the plain torch references, and ``reference.epilogue``: the shared
  tail (colour jitter, normalise, cast) on a host uint8 NCHW batch.

CUDA tensors run the Triton kernels; CPU tensors run the torch reference unless
``TRITON_INTERPRET=1`` is set (then Triton's interpreter). See docs/kernels.md.
"""

from __future__ import annotations

import importlib

__all__ = ["crop_flip_permute", "crop_flip_permute_packed", "resized_crop",
           "resized_crop_packed", "mask_gather", "records", "reference"]

_EXPORTS = {
    "crop_flip_permute": "dlpack_io.kernels.crop",
    "crop_flip_permute_packed": "dlpack_io.kernels.crop",
    "resized_crop": "dlpack_io.kernels.resize",
    "resized_crop_packed": "dlpack_io.kernels.resize",
    "mask_gather": "dlpack_io.kernels.masks",
}


def __getattr__(name: str):
    if name in ("reference", "records"):
        return importlib.import_module(f"dlpack_io.kernels.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dlpack_io.kernels' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
