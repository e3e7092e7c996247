"""The validated arguments of each public op (:class:`Batch`), in both forms.

Keyword form (``crop_flip_permute``, ``resized_crop``): per-sample tensors, checked one by
one, then packed into an ``(N, 16)`` int32 records tensor on the device (``records.py``).
Packed form (``*_packed``): the caller hands that records tensor directly (one copy of one
pinned buffer carries the batch). Either way the kernels and the torch references read the
same records, and the data-dependent checks run on the record columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlpack_io.kernels.checks import (
    INDEX_DTYPES, INT32_MAX, DeferredChecks, check_boxes, check_flags, check_flat, check_images,
    check_int, check_out_size, check_records, check_tensor, check_vector, fail)
from dlpack_io.kernels.epilogue import (
    Epilogue, check_jitter_values, jitter_names, jitter_tensors, make_epilogue)
from dlpack_io.kernels.records import FLIP_H, FLIP_V, JITTER_OPS, RECORD_WORDS, WORD

_EP_KEYS = ("mean", "std", "out_dtype")


@dataclass(frozen=True)
class Batch:
    """A validated batch: images, per-sample records, output geometry and epilogue."""

    images: torch.Tensor  # (N, H, W, C) dense, or flat (B,) uint8 when ragged
    records: torch.Tensor  # (N, 16) int32 on the images' device
    out_h: int
    out_w: int
    n: int
    channels: int
    ep: Epilogue
    ragged: bool = False
    antialias: bool = False

    def column(self, name: str) -> torch.Tensor:
        """One int32 field of every record (int64 for offset/label, float32 for factors)."""
        word = WORD[name]
        if name in ("offset", "label"):
            return self.records.view(torch.int64)[:, word // 2]
        if word >= WORD["brightness"]:
            return self.records.view(torch.float32)[:, word]
        return self.records[:, word]

    @property
    def factors(self) -> torch.Tensor:
        """``(N, 4)`` float32 brightness, contrast, saturation, hue."""
        return self.records.view(torch.float32)[:, WORD["brightness"]:]


def check_crop(images, top, left, height, width, flip_h, flip_v, *, validate, contrast_mean,
               order, **kw) -> Batch:
    """Validate ``crop_flip_permute``'s keyword form and pack its records."""
    op = "crop_flip_permute"
    n, h, w, c = check_images(op, images)
    height, width = check_int(op, "height", height), check_int(op, "width", width)
    _check_out_elements(op, c, height, width)
    if height > h or width > w:
        fail(op, f"crop height x width = {height}x{width} is larger than the {h}x{w} images")
    dev = images.device
    top = check_vector(op, "top", top, n, dev, INDEX_DTYPES)
    left = check_vector(op, "left", left, n, dev, INDEX_DTYPES)
    fh, fv = check_flags(op, "flip_h", flip_h, n, dev), check_flags(op, "flip_v", flip_v, n, dev)
    ops, factors, order = _jitter(op, n, dev, kw, order)
    rec = _pack(n, dev, torch.stack([top, left], 1), fh, fv, factors, order)
    rec[:, WORD["box_height"]], rec[:, WORD["box_width"]] = height, width
    checks = DeferredChecks(op, validate and n > 0)
    _check_crop_fit(checks, top, left, height, width, h, w)
    ep = _epilogue(op, n, c, dev, kw, ops, contrast_mean, checks, (factors, order))
    checks.run()
    return Batch(images, rec, height, width, n, c, ep)


def check_crop_packed(images, records, height, width, *, jitter, contrast_mean, validate,
                      **kw) -> Batch:
    """Validate ``crop_flip_permute_packed``."""
    op = "crop_flip_permute_packed"
    n, h, w, c = check_images(op, images)
    height, width = check_int(op, "height", height), check_int(op, "width", width)
    _check_out_elements(op, c, height, width)
    if height > h or width > w:
        fail(op, f"crop height x width = {height}x{width} is larger than the {h}x{w} images")
    rec = check_records(op, records, n, images.device)
    b = Batch(images, rec, height, width, n, c, None)  # columns only, for the checks
    checks = DeferredChecks(op, validate and n > 0)
    if checks.enabled:  # reading columns costs host time: only when they are checked
        _check_crop_fit(checks, b.column("top"), b.column("left"), height, width, h, w)
    ep = _epilogue(op, n, c, images.device, kw, jitter_names(op, jitter), contrast_mean,
                   checks, b)
    checks.run()
    return Batch(images, rec, height, width, n, c, ep)


def check_resize(images, boxes, out_size, flip_h, flip_v, *, offsets, heights, widths,
                 channels, antialias, validate, contrast_mean, order, **kw) -> Batch:
    """Validate ``resized_crop``'s keyword form, dense or ragged (``offsets`` given)."""
    op = "resized_crop"
    if not isinstance(antialias, bool):
        fail(op, f"antialias must be a bool, got {antialias!r}", TypeError)
    ragged = offsets is not None
    if ragged:
        n, c, total, offsets, heights, widths = _ragged_inputs(op, images, offsets, heights,
                                                               widths, channels)
        img_h, img_w = heights, widths
    else:
        n, img_h, img_w, c = check_images(op, images)
        if heights is not None or widths is not None:
            fail(op, "heights/widths are only for the ragged form; pass offsets= as well "
                     "(with a flat 1-D images buffer)")
        if channels is not None and channels != c:
            fail(op, f"channels={channels!r} does not match images.shape[-1]={c}")
    dev = images.device
    out_h, out_w = check_out_size(op, out_size)
    _check_out_elements(op, c, out_h, out_w)
    boxes = check_boxes(op, boxes, n, dev)
    fh, fv = check_flags(op, "flip_h", flip_h, n, dev), check_flags(op, "flip_v", flip_v, n, dev)
    if ragged and n and total < c:
        fail(op, f"the flat buffer has {total} bytes, less than one {c}-channel pixel")
    ops, factors, order = _jitter(op, n, dev, kw, order)
    rec = _pack(n, dev, boxes, fh, fv, factors, order)
    checks = DeferredChecks(op, validate and n > 0)
    if ragged:
        rec[:, WORD["height"]], rec[:, WORD["width"]] = heights, widths
        rec.view(torch.int64)[:, WORD["offset"] // 2] = offsets
        _check_ragged_extents(checks, offsets, heights, widths, c, total)
    _check_boxes_fit(checks, "boxes", boxes, img_h, img_w)
    ep = _epilogue(op, n, c, dev, kw, ops, contrast_mean, checks, (factors, order))
    checks.run()
    return Batch(images, rec, out_h, out_w, n, c, ep, ragged, antialias)


def check_resize_packed(images, records, out_size, *, channels, antialias, jitter,
                        contrast_mean, validate, **kw) -> Batch:
    """Validate ``resized_crop_packed`` (ragged when ``images`` is 1-D)."""
    op = "resized_crop_packed"
    if not isinstance(antialias, bool):
        fail(op, f"antialias must be a bool, got {antialias!r}", TypeError)
    images = check_tensor(op, "images", images)
    ragged = images.dim() == 1
    if ragged:
        total = check_flat(op, images)
        c = check_int(op, "channels", 3 if channels is None else channels)
        if c > 4:
            fail(op, f"channels must be 1..4, got {c}")
        rec = check_records(op, records, None, images.device)
        n = rec.shape[0]
        if n and total < c:
            fail(op, f"the flat buffer has {total} bytes, less than one {c}-channel pixel")
    else:
        n, img_h, img_w, c = check_images(op, images)
        if channels is not None and channels != c:
            fail(op, f"channels={channels!r} does not match images.shape[-1]={c}")
        rec = check_records(op, records, n, images.device)
    out_h, out_w = check_out_size(op, out_size)
    _check_out_elements(op, c, out_h, out_w)
    b = Batch(images, rec, out_h, out_w, n, c, None, ragged, antialias)
    checks = DeferredChecks(op, validate and n > 0)
    if checks.enabled:  # reading columns costs host time: only when they are checked
        if ragged:
            img_h, img_w = b.column("height"), b.column("width")
            _check_ragged_extents(checks, b.column("offset"), img_h, img_w, c, total)
        boxes = b.records[:, WORD["top"]:WORD["box_width"] + 1]
        _check_boxes_fit(checks, "records", boxes, img_h, img_w)
    ep = _epilogue(op, n, c, images.device, kw, jitter_names(op, jitter), contrast_mean,
                   checks, b)
    checks.run()
    return Batch(images, rec, out_h, out_w, n, c, ep, ragged, antialias)


def _jitter(op, n, dev, kw, order):
    return jitter_tensors(op, n, dev, {k: kw.pop(k, None) for k in JITTER_OPS}, order)


def _epilogue(op, n, c, dev, kw, ops, contrast_mean, checks, source) -> Epilogue:
    """Validate the epilogue; ``source``: the records Batch, or (factors, order) tensors."""
    unknown = set(kw) - set(_EP_KEYS)
    if unknown:
        fail(op, f"unexpected keyword arguments {sorted(unknown)}", TypeError)
    ep = make_epilogue(op, channels=c, n=n, device=dev, ops=ops, contrast_mean=contrast_mean,
                       checks=checks, **kw)
    if ops and checks.enabled:
        factors, order = source if isinstance(source, tuple) else (source.factors,
                                                                   source.column("order"))
        check_jitter_values(checks, ops, factors, order)
    return ep


def _pack(n, dev, corner_or_box, fh, fv, factors, order) -> torch.Tensor:
    """Records of the keyword form: box (or crop corner), flags, jitter factors and order."""
    rec = torch.zeros((n, RECORD_WORDS), dtype=torch.int32, device=dev)
    rec[:, :corner_or_box.shape[1]] = corner_or_box
    rec[:, WORD["flags"]] = fh.to(torch.int32) * FLIP_H + fv.to(torch.int32) * FLIP_V
    if factors is not None:
        rec.view(torch.float32)[:, WORD["brightness"]:] = factors
        rec[:, WORD["order"]] = order
    return rec


def _check_out_elements(op, c, h, w) -> None:
    if c * h * w > INT32_MAX:
        fail(op, f"one output image ({c}x{h}x{w}) exceeds 2**31 - 1 elements")


def _ragged_inputs(op, data, offsets, heights, widths, channels):
    total = check_flat(op, data)
    c = check_int(op, "channels", 3 if channels is None else channels)
    if c > 4:
        fail(op, f"channels must be 1..4, got {c}")
    dev = data.device
    offsets = check_tensor(op, "offsets", offsets)
    if offsets.dim() != 1:
        fail(op, f"offsets must be 1-D (one byte offset per sample), got {tuple(offsets.shape)}")
    n = offsets.shape[0]
    offsets = check_vector(op, "offsets", offsets, n, dev, INDEX_DTYPES)
    if heights is None or widths is None:
        fail(op, "the ragged form needs offsets=, heights= and widths= (one per sample)")
    heights = check_vector(op, "heights", heights, n, dev, INDEX_DTYPES)
    widths = check_vector(op, "widths", widths, n, dev, INDEX_DTYPES)
    return n, c, total, offsets, heights, widths


def _check_crop_fit(checks, top, left, height, width, h, w) -> None:
    checks.add(lambda: (top < 0) | (left < 0) | (top > h - height) | (left > w - width),
               lambda i: (f"sample {i}: crop top={int(top[i])}, left={int(left[i])}, "
                          f"height={height}, width={width} does not fit in the {h}x{w} image; "
                          f"expected 0 <= top <= {h - height} and 0 <= left <= {w - width}"))


def _check_boxes_fit(checks: DeferredChecks, name: str, boxes: torch.Tensor, img_h,
                     img_w) -> None:
    """Register: every box has size >= 1 and lies inside its image."""
    if not checks.enabled:
        return
    top, left, bh, bw = (t.long() for t in boxes.unbind(1))

    def describe(i: int) -> str:
        size = f"{int(img_h[i])}x{int(img_w[i])}" if torch.is_tensor(img_h) else f"{img_h}x{img_w}"
        return (f"{name}[{i}] = (top={int(top[i])}, left={int(left[i])}, height={int(bh[i])}, "
                f"width={int(bw[i])}) does not fit in the {size} image; expected height, "
                f"width >= 1, top, left >= 0, top + height <= image height and "
                f"left + width <= image width")
    checks.add(lambda: (top < 0) | (left < 0) | (bh < 1) | (bw < 1) | (top + bh > img_h)
               | (left + bw > img_w), describe)


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
