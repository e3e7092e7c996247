"""dlpack_io.kernels: fused GPU batch transforms (Triton) with torch fallbacks.

Public functions (imported lazily, so ``import dlpack_io.kernels`` imports neither
triton nor the op modules):

* :func:`crop_flip_permute` - per-sample crop + flips + NHWC->NCHW + normalise + cast.
* :func:`resized_crop` - per-sample box resampled (bilinear, optional antialias) to a
  fixed size, fused with the same tail; dense or ragged (flat buffer + offsets) input.
* :mod:`reference` - the plain torch references of both.

CUDA tensors run the Triton kernels; CPU tensors run the torch reference unless
``TRITON_INTERPRET=1`` is set (then Triton's interpreter). See docs/kernels.md.
"""

from __future__ import annotations

import importlib

__all__ = ["crop_flip_permute", "resized_crop", "reference"]

_EXPORTS = {
    "crop_flip_permute": "dlpack_io.kernels.crop",
    "resized_crop": "dlpack_io.kernels.resize",
}


def __getattr__(name: str):
    if name == "reference":
        return importlib.import_module("dlpack_io.kernels.reference")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dlpack_io.kernels' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
