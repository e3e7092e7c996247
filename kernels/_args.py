"""Validated argument bundles of the two public ops.

The launchers (``crop.py``, ``resize.py``) and the torch references (``reference.py``)
both start with these checks, so every backend rejects the same inputs with the same
message, before anything is launched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dlpack_io.kernels._epilogue import Epilogue, make_epilogue
from dlpack_io.kernels._validate import (
    INDEX_DTYPES, INT32_MAX, DeferredChecks, check_boxes, check_flags, check_flat, check_images,
    check_int, check_out_size, check_tensor, check_vector, fail)


@dataclass(frozen=True)
class CropArgs:
    """Validated arguments of ``crop_flip_permute``."""

    images: torch.Tensor  # (N, H, W, C) uint8, contiguous
    top: torch.Tensor  # (N,) int32/int64
    left: torch.Tensor
    height: int
    width: int
    flip_h: torch.Tensor  # (N,) uint8
    flip_v: torch.Tensor
    ep: Epilogue


@dataclass(frozen=True)
class ResizeArgs:
    """Validated arguments of ``resized_crop`` (dense or ragged input)."""

    images: torch.Tensor  # (N, H, W, C) dense, or flat (B,) uint8 when ragged
    boxes: torch.Tensor  # (N, 4) int32/int64: top, left, height, width
    out_h: int
    out_w: int
    flip_h: torch.Tensor
    flip_v: torch.Tensor
    n: int
    channels: int
    antialias: bool
    ep: Epilogue
    offsets: Optional[torch.Tensor] = None  # ragged only: (N,) int32/int64 byte offsets
    heights: Optional[torch.Tensor] = None  # ragged only: (N,) int32/int64
    widths: Optional[torch.Tensor] = None

    @property
    def ragged(self) -> bool:
        """True for the flat-buffer form."""
        return self.offsets is not None


def _epilogue(op: str, n: int, c: int, device: torch.device, kw: dict,
              checks: DeferredChecks) -> Epilogue:
    kw = {k: v for k, v in kw.items() if k != "validate"}
    return make_epilogue(op, channels=c, n=n, device=device, checks=checks, **kw)


def check_crop(images, top, left, height, width, flip_h, flip_v, **kw) -> CropArgs:
    """Validate ``crop_flip_permute`` arguments (``kw``: epilogue keywords and ``validate``)."""
    op = "crop_flip_permute"
    n, h, w, c = check_images(op, images)
    height, width = check_int(op, "height", height), check_int(op, "width", width)
    if c * height * width > INT32_MAX:
        fail(op, f"one output image ({c}x{height}x{width}) exceeds 2**31 - 1 elements")
    if height > h or width > w:
        fail(op, f"crop height x width = {height}x{width} is larger than the {h}x{w} images")
    dev = images.device
    top = check_vector(op, "top", top, n, dev, INDEX_DTYPES)
    left = check_vector(op, "left", left, n, dev, INDEX_DTYPES)
    fh, fv = check_flags(op, "flip_h", flip_h, n, dev), check_flags(op, "flip_v", flip_v, n, dev)
    checks = DeferredChecks(op, kw["validate"] and n > 0)
    checks.add(lambda: (top < 0) | (left < 0) | (top > h - height) | (left > w - width),
               lambda i: (f"sample {i}: crop top={int(top[i])}, left={int(left[i])}, "
                          f"height={height}, width={width} does not fit in the {h}x{w} image; "
                          f"expected 0 <= top <= {h - height} and 0 <= left <= {w - width}"))
    ep = _epilogue(op, n, c, dev, kw, checks)
    checks.run()
    return CropArgs(images, top, left, height, width, fh, fv, ep)


def check_resize(images, boxes, out_size, flip_h, flip_v, *, offsets, heights, widths,
                 channels, antialias, **kw) -> ResizeArgs:
    """Validate ``resized_crop`` arguments, dense or ragged (``offsets`` given)."""
    op = "resized_crop"
    if not isinstance(antialias, bool):
        fail(op, f"antialias must be a bool, got {antialias!r}", TypeError)
    if offsets is None:
        return _check_dense(op, images, boxes, out_size, flip_h, flip_v, heights, widths,
                            channels, antialias, kw)
    return _check_ragged(op, images, boxes, out_size, flip_h, flip_v, offsets, heights,
                         widths, channels, antialias, kw)


def _common(op, boxes, out_size, flip_h, flip_v, n, c, dev):
    out_h, out_w = check_out_size(op, out_size)
    if c * out_h * out_w > INT32_MAX:
        fail(op, f"one output image ({c}x{out_h}x{out_w}) exceeds 2**31 - 1 elements")
    boxes = check_boxes(op, boxes, n, dev)
    fh, fv = check_flags(op, "flip_h", flip_h, n, dev), check_flags(op, "flip_v", flip_v, n, dev)
    return boxes, out_h, out_w, fh, fv


def _check_boxes_fit(checks: DeferredChecks, boxes: torch.Tensor, img_h, img_w) -> None:
    """Register: every box has size >= 1 and lies inside its image."""
    top, left, bh, bw = boxes.unbind(1)

    def describe(i: int) -> str:
        size = f"{int(img_h[i])}x{int(img_w[i])}" if torch.is_tensor(img_h) else f"{img_h}x{img_w}"
        return (f"boxes[{i}] = (top={int(top[i])}, left={int(left[i])}, height={int(bh[i])}, "
                f"width={int(bw[i])}) does not fit in the {size} image; expected height, "
                f"width >= 1, top, left >= 0, top + height <= image height and "
                f"left + width <= image width")
    checks.add(lambda: (top < 0) | (left < 0) | (bh < 1) | (bw < 1) | (top + bh > img_h)
               | (left + bw > img_w), describe)


def _check_dense(op, images, boxes, out_size, flip_h, flip_v, heights, widths, channels,
                 antialias, kw) -> ResizeArgs:
    n, h, w, c = check_images(op, images)
    if heights is not None or widths is not None:
        fail(op, "heights/widths are only for the ragged form; pass offsets= as well "
                 "(with a flat 1-D images buffer)")
    if channels is not None and channels != c:
        fail(op, f"channels={channels!r} does not match images.shape[-1]={c}")
    boxes, out_h, out_w, fh, fv = _common(op, boxes, out_size, flip_h, flip_v, n, c,
                                          images.device)
    checks = DeferredChecks(op, kw["validate"] and n > 0)
    _check_boxes_fit(checks, boxes, h, w)
    ep = _epilogue(op, n, c, images.device, kw, checks)
    checks.run()
    return ResizeArgs(images, boxes, out_h, out_w, fh, fv, n, c, antialias, ep)


def _check_ragged(op, data, boxes, out_size, flip_h, flip_v, offsets, heights, widths,
                  channels, antialias, kw) -> ResizeArgs:
    total = check_flat(op, data)
    c = check_int(op, "channels", 3 if channels is None else channels)
    if c > 4:
        fail(op, f"channels must be 1..4, got {c}")
    dev = data.device
    offsets = check_tensor(op, "offsets", offsets)
    n = offsets.shape[0] if offsets.dim() == 1 else -1
    if n < 0:
        fail(op, f"offsets must be 1-D (one byte offset per sample), got {tuple(offsets.shape)}")
    offsets = check_vector(op, "offsets", offsets, n, dev, INDEX_DTYPES)
    if heights is None or widths is None:
        fail(op, "the ragged form needs offsets=, heights= and widths= (one per sample)")
    heights = check_vector(op, "heights", heights, n, dev, INDEX_DTYPES)
    widths = check_vector(op, "widths", widths, n, dev, INDEX_DTYPES)
    boxes, out_h, out_w, fh, fv = _common(op, boxes, out_size, flip_h, flip_v, n, c, dev)
    if n and total < c:
        fail(op, f"the flat buffer has {total} bytes, less than one {c}-channel pixel")
    checks = DeferredChecks(op, kw["validate"] and n > 0)
    _check_ragged_extents(checks, offsets, heights, widths, c, total)
    _check_boxes_fit(checks, boxes, heights, widths)
    ep = _epilogue(op, n, c, dev, kw, checks)
    checks.run()
    return ResizeArgs(data, boxes, out_h, out_w, fh, fv, n, c, antialias, ep,
                      offsets, heights, widths)


def _check_ragged_extents(checks: DeferredChecks, offsets, heights, widths, c, total) -> None:
    """Register: every sample is >= 1x1, < 2**31 bytes and inside the flat buffer."""
    def bad():
        size = heights.long() * widths.long() * c
        return (heights < 1) | (widths < 1) | (size > INT32_MAX) | (offsets < 0) | \
            (offsets.long() + size > total)
    checks.add(bad, lambda i: (
        f"sample {i}: offset={int(offsets[i])}, height={int(heights[i])}, "
        f"width={int(widths[i])}, channels={c} does not fit in the flat buffer of {total} "
        f"bytes; expected height, width >= 1 and 0 <= offset <= {total} - height*width*channels"))
