"""Resampling of a box of pixels with torchvision's ``interpolation`` / ``antialias`` meanings.

Two families, as torchvision has them:

* antialiased (``antialias=True``, and ``nearest`` always): PIL's filters (BILINEAR,
  BICUBIC, NEAREST), what torchvision's PIL path computes and what its tensor path with
  ``antialias=True`` matches to within rounding;
* plain (``antialias=False``, bilinear or bicubic): torch's ``interpolate(mode,
  align_corners=False, antialias=False)`` of the box, computed as a ``grid_sample`` at the
  same source coordinates (``src = x0 + (d + 0.5) * box_w / out_w - 0.5``, taps clamped to
  the image's edge), so a fractional box (Resize then crop) samples exactly where resizing
  the whole image and cropping would.
"""
from __future__ import annotations

import numpy as np

DEFAULT = ("bilinear", True)


def pil_filter(mode: str):
    """The PIL resampling filter of a torchvision interpolation name."""
    from PIL import Image

    filters = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
    if mode not in filters:
        raise ValueError(f"interpolation {mode!r}: expected one of {tuple(filters)}")
    return filters[mode]


def uses_pil(resample) -> bool:
    """True when ``resample`` (mode, antialias) is one of PIL's filters."""
    mode, antialias = resample
    return bool(antialias) or mode == "nearest"


def _grid(start: float, length: float, out: int, size: int):
    """Normalised grid_sample coordinates (align_corners=False) of ``out`` samples over
    [start, start + length) of an axis of ``size`` pixels."""
    import torch

    d = torch.arange(out, dtype=torch.float64)
    src = start + (d + 0.5) * (length / out) - 0.5
    return (2.0 * src + 1.0) / size - 1.0


def interpolate_box(pixels: np.ndarray, box, out_size, mode: str) -> np.ndarray:
    """Plain (non-antialiased) ``mode`` resample of the float ``box`` (x0, y0, x1, y1) of
    (h, w, c) uint8 ``pixels`` to ``out_size`` (oh, ow): (oh, ow, c) uint8, rounded half to
    even as torch rounds."""
    import torch
    import torch.nn.functional as F

    if mode not in ("bilinear", "bicubic"):
        raise ValueError(f"interpolate_box: mode {mode!r}: expected 'bilinear' or 'bicubic'")
    h, w, c = pixels.shape
    oh, ow = int(out_size[0]), int(out_size[1])
    x0, y0, x1, y1 = (float(v) for v in box)
    gy = _grid(y0, y1 - y0, oh, h)
    gx = _grid(x0, x1 - x0, ow, w)
    grid = torch.stack(torch.meshgrid(gy, gx, indexing="ij")[::-1], dim=-1)[None]
    src = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1)[None].double()
    out = F.grid_sample(src, grid, mode=mode, padding_mode="border", align_corners=False)
    out = out[0].round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)
    return np.ascontiguousarray(out.numpy())
