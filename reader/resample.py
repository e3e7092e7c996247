"""Resampling of a box of pixels with torchvision's ``interpolation`` / ``antialias`` meanings.

Two families, as torchvision has them:

* antialiased (``antialias=True``, and ``nearest`` always): PIL's filters (BILINEAR,
  BICUBIC, NEAREST), what torchvision's PIL path computes and what its tensor path with
  ``antialias=True`` matches to within rounding;
* plain (``antialias=False``, bilinear or bicubic): torch's ``interpolate(mode,
  align_corners=False, antialias=False)`` of the box, computed separably at the
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


def _taps(start: float, length: float, out: int, size: int, cubic: bool):
    """(indices (out, K), weights (out, K)) of torch's align_corners=False interpolation of
    ``out`` samples over [start, start + length) of an axis of ``size`` pixels: linear
    clamps the source coordinate at 0 and the taps at the edge, cubic (A = -0.75) clamps
    only the taps, as torch's ``upsample_bilinear2d`` / ``upsample_bicubic2d`` do."""
    src = start + (np.arange(out, dtype=np.float64) + 0.5) * (length / out) - 0.5
    if not cubic:
        src = np.maximum(src, 0.0)
        i0 = np.floor(src)
        t = src - i0
        idx = np.stack([i0, i0 + 1], axis=1)
        weights = np.stack([1.0 - t, t], axis=1)
    else:
        i0 = np.floor(src)
        t = (src - i0)[:, None]
        x = np.abs(np.array([-1.0, 0.0, 1.0, 2.0])[None, :] - t)
        a = -0.75
        near = ((a + 2) * x - (a + 3)) * x * x + 1
        far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        weights = np.where(x <= 1, near, far)
        idx = i0[:, None] + np.arange(-1, 3)[None, :]
    return np.clip(idx, 0, size - 1).astype(np.intp), weights


def interpolate_box(pixels: np.ndarray, box, out_size, mode: str) -> np.ndarray:
    """Plain (non-antialiased) ``mode`` resample of the float ``box`` (x0, y0, x1, y1) of
    (h, w, c) uint8 ``pixels`` to ``out_size`` (oh, ow): (oh, ow, c) uint8, rounded half to
    even as torch rounds. Separable: rows first, then columns (float64)."""
    if mode not in ("bilinear", "bicubic"):
        raise ValueError(f"interpolate_box: mode {mode!r}: expected 'bilinear' or 'bicubic'")
    h, w, _ = pixels.shape
    oh, ow = int(out_size[0]), int(out_size[1])
    x0, y0, x1, y1 = (float(v) for v in box)
    cubic = mode == "bicubic"
    ry, wy = _taps(y0, y1 - y0, oh, h, cubic)
    rx, wx = _taps(x0, x1 - x0, ow, w, cubic)
    rows = np.einsum("ok,okwc->owc", wy, pixels[ry].astype(np.float64))
    out = np.einsum("pk,opkc->opc", wx, rows[:, rx])
    return np.ascontiguousarray(np.clip(np.rint(out), 0, 255).astype(np.uint8))
