"""Plain torch references of the kernels: what the tests compare against, the path the
public functions take when Triton cannot run (CPU tensors without ``TRITON_INTERPRET=1``,
other devices, or triton not installed), and, through :func:`epilogue`, the CPU
implementation of the shared tail (colour jitter, normalisation, cast) for host batches.

They take the same arguments, run the same checks and return the same tensors as the
launchers (float outputs up to the rounding tolerances in docs/kernels.md). Imports
torch only.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from dlpack_io.kernels.args import (
    Batch, check_crop, check_crop_packed, check_resize, check_resize_packed)
from dlpack_io.kernels.checks import INT32_MAX, DeferredChecks, check_tensor, fail
from dlpack_io.kernels.colour import SCRATCH_PLANES, apply_op
from dlpack_io.kernels.epilogue import (CHUNK_ELEMENTS, INV255, check_jitter_values,
                                        jitter_tensors, make_epilogue)
from dlpack_io.kernels.records import FLIP_H, FLIP_V, IDENTITY_ORDER, decode_order


def epilogue(images: torch.Tensor, *, mean=None, std=None,
             out_dtype: torch.dtype = torch.uint8, brightness=None, contrast=None,
             saturation=None, hue=None, order=None, contrast_mean=None,
             out: Optional[torch.Tensor] = None, validate: bool = True) -> torch.Tensor:
    """The kernels' tail on an already cropped/resized ``(N, C, H, W)`` uint8 batch.

    Colour jitter (per-sample factors and order, as in the kernels), then
    ``(x / 255 - mean) / std`` and the cast to ``out_dtype`` (uint8: rounded, half up).
    Vectorised over the batch (chunks of whole samples, grouped by order); ``out``
    (contiguous, ``out_dtype``, same shape) receives the result without an allocation,
    e.g. a pinned batch slot. Arguments and checks as in ``crop_flip_permute``.
    """
    op = "epilogue"
    images = check_tensor(op, "images", images)
    if images.dtype != torch.uint8 or images.dim() != 4 or not 1 <= images.shape[1] <= 4:
        fail(op, f"images must be an (N, C, H, W) uint8 batch with C in 1..4, got "
                 f"{images.dtype} {tuple(images.shape)}")
    n, c = images.shape[:2]
    dev = images.device
    factors = dict(brightness=brightness, contrast=contrast, saturation=saturation, hue=hue)
    ops, factors, order = jitter_tensors(op, n, dev, factors, order)
    checks = DeferredChecks(op, validate and n > 0)
    ep = make_epilogue(op, channels=c, n=n, device=dev, out_dtype=out_dtype, mean=mean, std=std,
                       ops=ops, contrast_mean=contrast_mean, checks=checks)
    if ops:
        check_jitter_values(checks, ops, factors, order)
    checks.run()
    if out is not None:
        out = check_tensor(op, "out", out)
        if out.shape != images.shape or out.dtype != out_dtype or not out.is_contiguous() \
                or out.device != dev:
            fail(op, f"out must be a contiguous {out_dtype} tensor of shape "
                     f"{tuple(images.shape)} on {dev}, got {out.dtype} {tuple(out.shape)} "
                     f"on {out.device}")
    return finish(images, out_dtype=ep.out_dtype, scale=ep.scale, bias=ep.bias, ops=ops,
                  factors=factors, order=order, contrast_mean=ep.contrast_mean, out=out)


def crop_flip_permute(images, top, left, height, width, flip_h, flip_v, *, mean=None,
                      std=None, out_dtype=torch.uint8, brightness=None, contrast=None,
                      saturation=None, hue=None, order=None, contrast_mean=None,
                      validate=True) -> torch.Tensor:
    """Torch reference of :func:`dlpack_io.kernels.crop_flip_permute` (same arguments)."""
    return crop_impl(check_crop(images, top, left, height, width, flip_h, flip_v, mean=mean,
                                std=std, out_dtype=out_dtype, brightness=brightness,
                                contrast=contrast, saturation=saturation, hue=hue, order=order,
                                contrast_mean=contrast_mean, validate=validate))


def crop_flip_permute_packed(images, records, height, width, *, mean=None, std=None,
                             out_dtype=torch.uint8, jitter=(), contrast_mean=None,
                             validate=True) -> torch.Tensor:
    """Torch reference of :func:`dlpack_io.kernels.crop_flip_permute_packed`."""
    return crop_impl(check_crop_packed(images, records, height, width, jitter=jitter, mean=mean,
                                       std=std, out_dtype=out_dtype,
                                       contrast_mean=contrast_mean, validate=validate))


def resized_crop(images, boxes, out_size, flip_h, flip_v, *, offsets=None, heights=None,
                 widths=None, channels=None, mean=None, std=None, out_dtype=torch.uint8,
                 antialias=False, brightness=None, contrast=None, saturation=None, hue=None,
                 order=None, contrast_mean=None, validate=True) -> torch.Tensor:
    """Torch reference of :func:`dlpack_io.kernels.resized_crop` (same arguments)."""
    return resize_impl(check_resize(images, boxes, out_size, flip_h, flip_v, offsets=offsets,
                                    heights=heights, widths=widths, channels=channels,
                                    antialias=antialias, mean=mean, std=std,
                                    out_dtype=out_dtype, brightness=brightness,
                                    contrast=contrast, saturation=saturation, hue=hue,
                                    order=order, contrast_mean=contrast_mean,
                                    validate=validate))


def resized_crop_packed(images, records, out_size, *, channels=None, mean=None, std=None,
                        out_dtype=torch.uint8, antialias=False, jitter=(), contrast_mean=None,
                        validate=True) -> torch.Tensor:
    """Torch reference of :func:`dlpack_io.kernels.resized_crop_packed`."""
    return resize_impl(check_resize_packed(images, records, out_size, channels=channels,
                                           antialias=antialias, jitter=jitter, mean=mean,
                                           std=std, out_dtype=out_dtype,
                                           contrast_mean=contrast_mean, validate=validate))


def _tail(v: torch.Tensor, a: Batch) -> torch.Tensor:
    """The epilogue of a cropped/resampled batch, reading factors and order from records."""
    ops = a.ep.ops
    return finish(v, out_dtype=a.ep.out_dtype, scale=a.ep.scale, bias=a.ep.bias, ops=ops,
                  factors=a.factors.float() if ops else None,
                  order=a.column("order") if ops else None, contrast_mean=a.ep.contrast_mean)


def _flags(a: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    flags = a.column("flags")
    return (flags & FLIP_H) != 0, (flags & FLIP_V) != 0


def crop_impl(a: Batch) -> torch.Tensor:
    """Crop by gathering clamped, flipped row/column indices for the whole batch."""
    n, h, w, _ = a.images.shape
    dev = a.images.device
    flip_h, flip_v = _flags(a)
    ys = torch.arange(a.out_h, device=dev).expand(n, -1)
    xs = torch.arange(a.out_w, device=dev).expand(n, -1)
    ys = torch.where(flip_v[:, None], a.out_h - 1 - ys, ys) + a.column("top").long()[:, None]
    xs = torch.where(flip_h[:, None], a.out_w - 1 - xs, xs) + a.column("left").long()[:, None]
    ys, xs = ys.clamp(0, h - 1), xs.clamp(0, w - 1)  # matters only with validate=False
    batch = torch.arange(n, device=dev)[:, None, None]
    planes = a.images[batch, ys[:, :, None], xs[:, None, :]].permute(0, 3, 1, 2)
    return _tail(planes, a)


def resize_impl(a: Batch) -> torch.Tensor:
    """Resample each box with ``F.interpolate`` (float32), flip, then the epilogue."""
    dev = a.images.device
    out = torch.empty((a.n, a.channels, a.out_h, a.out_w), dtype=torch.float32, device=dev)
    boxes = a.records[:, 0:4].tolist()
    flip_h, flip_v = (f.tolist() for f in _flags(a))
    for i in range(a.n):
        image = _sample(a, i)
        top, left, bh, bw = _clamp_box(boxes[i], image.shape[0], image.shape[1])
        crop = image[top:top + bh, left:left + bw].permute(2, 0, 1).unsqueeze(0).float()
        res = _interpolate(crop, a.out_h, a.out_w, a.antialias)[0]
        dims = [d for d, flip in ((2, flip_h[i]), (1, flip_v[i])) if flip]
        out[i] = res.flip(dims) if dims else res
    return _tail(out, a)


def _interpolate(crop: torch.Tensor, out_h: int, out_w: int, antialias: bool) -> torch.Tensor:
    """``F.interpolate`` bilinear, half-pixel, of a (1, C, h, w) float32 crop.

    torch's CPU antialias path returns the first row for every output row when input and
    output width are both 1 (torch 2.13); that case is computed transposed, which is the
    same separable filter.
    """
    if antialias and crop.shape[-1] == 1 and out_w == 1:
        res = F.interpolate(crop.transpose(2, 3), size=(1, out_h), mode="bilinear",
                            align_corners=False, antialias=True)
        return res.transpose(2, 3)
    return F.interpolate(crop, size=(out_h, out_w), mode="bilinear", align_corners=False,
                         antialias=antialias)


def _sample(a: Batch, i: int) -> torch.Tensor:
    """Image ``i`` of the batch as an (H, W, C) uint8 view (a bad ragged record, only
    possible with validate=False, reads byte 0 of the buffer as a 1x1 image, as the
    kernels do)."""
    if not a.ragged:
        return a.images[i]
    off, h, w = int(a.column("offset")[i]), int(a.column("height")[i]), int(a.column("width")[i])
    size = h * w * a.channels
    if h < 1 or w < 1 or off < 0 or size > INT32_MAX or off + size > a.images.numel():
        off, h, w, size = 0, 1, 1, a.channels
    return a.images[off:off + size].view(h, w, a.channels)


def _clamp_box(box, img_h: int, img_w: int) -> tuple[int, int, int, int]:
    """Clamp a box into the image (only reached with validate=False and a bad box)."""
    top, left, bh, bw = box
    top, left = min(max(top, 0), img_h - 1), min(max(left, 0), img_w - 1)
    return top, left, min(max(bh, 1), img_h - top), min(max(bw, 1), img_w - left)


def mask_gather(src: torch.Tensor, offsets: torch.Tensor, shapes: torch.Tensor,
                rows: torch.Tensor, cols: torch.Tensor, fill: int = 255) -> torch.Tensor:
    """Reference of ``kernels.masks.mask_gather``: ``out[n, y, x]`` is mask ``n``'s pixel
    ``(rows[n, y], cols[n, x])``, or ``fill`` where either is -1 (arguments checked there)."""
    n, oh, ow = rows.shape[0], rows.shape[1], cols.shape[1]
    # int32 inside: torch has no index_put for uint16
    out = torch.full((n, oh, ow), int(fill), dtype=torch.int32, device=src.device)
    for i in range(n):
        h, w = int(shapes[i, 0]), int(shapes[i, 1])
        mask = src[int(offsets[i]):int(offsets[i]) + h * w].view(h, w).to(torch.int32)
        r, c = rows[i].long(), cols[i].long()
        ry, cx = torch.nonzero(r >= 0)[:, 0], torch.nonzero(c >= 0)[:, 0]
        if len(ry) and len(cx):
            out[i, ry[:, None], cx[None, :]] = mask[r[ry][:, None], c[cx][None, :]]
    return out.to(src.dtype)


# ---- the epilogue's torch maths (the host path's, and the fallback's) -------------------
# The batch is processed in chunks of whole samples (about CHUNK_ELEMENTS floats) that stay
# in the CPU caches, with samples grouped by their jitter order, so each chunk runs one op
# sequence in place.
def finish(v: torch.Tensor, *, out_dtype: torch.dtype, scale: torch.Tensor, bias: torch.Tensor,
           ops: int = 0, factors: Optional[torch.Tensor] = None,
           order: Optional[torch.Tensor] = None, contrast_mean: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Epilogue of an ``(N, C, H, W)`` batch ``v`` (uint8, or float32 in 0..255 units).

    ``factors``: ``(N, 4)`` float32 brightness, contrast, saturation, hue (only the
    columns of the ops in ``ops`` are read); ``order``: ``(N,)`` order codes;
    ``contrast_mean``: ``(N,)`` float32 to use instead of the computed mean. Writes into
    ``out`` when given (same shape, ``out_dtype``), else into a new tensor.
    """
    n, c, h, w = v.shape
    if out is None:
        out = torch.empty((n, c, h, w), dtype=out_dtype, device=v.device)
    if n == 0:
        return out
    if not ops and v.dtype == torch.uint8 and out_dtype == torch.uint8:
        return out.copy_(v)
    per = min(n, max(1, CHUNK_ELEMENTS // (c * h * w)))
    buf = torch.empty((per, c, h, w), dtype=torch.float32, device=v.device)
    planes = torch.empty((SCRATCH_PLANES if ops else 0, per, h, w), dtype=torch.float32,
                         device=v.device)
    scale4, bias4 = scale.view(1, -1, 1, 1), bias.view(1, -1, 1, 1)
    for idx, steps in _chunks(n, per, ops, order):
        k = _length(idx)
        x = buf[:k]
        x.copy_(v[idx] if isinstance(idx, slice) else torch.index_select(v, 0, idx))
        if ops:
            sc = [p[:k] for p in planes]
            means = None if contrast_mean is None else contrast_mean[idx]
            x.mul_(INV255)
            for op in steps:
                apply_op(op, x, factors[idx], means, sc)
            x.mul_(255.0)
        if out_dtype == torch.uint8:
            x.add_(0.5).floor_().clamp_(0.0, 255.0)
        else:
            x.mul_(scale4).add_(bias4)
        _put(out, idx, x)
    return out


def _length(idx) -> int:
    return idx.stop - idx.start if isinstance(idx, slice) else idx.numel()


def _put(out: torch.Tensor, idx, x: torch.Tensor) -> None:
    if isinstance(idx, slice):
        out[idx].copy_(x)
    else:
        out.index_copy_(0, idx, x.to(out.dtype))


def _chunks(n: int, per: int, ops: int, order: Optional[torch.Tensor]):
    """Yield ``(index, op sequence)``: slices of ``per`` samples when every sample has the
    same order, else runs of equal order codes (samples sorted by code), split by ``per``."""
    def enabled(code: int) -> list[int]:
        fields = decode_order(torch.tensor([code]))[0].tolist()
        return [1 << op for op in fields if ops & (1 << op)]

    if not ops:  # normalise and cast only: whole slices, no op sequence to look up
        for start in range(0, n, per):
            yield slice(start, min(start + per, n)), []
        return
    codes = order.to(torch.int64).cpu() if order is not None else None
    if codes is None or bool((codes == codes[0]).all()):
        steps = enabled(int(codes[0])) if codes is not None else enabled(IDENTITY_ORDER)
        for start in range(0, n, per):
            yield slice(start, min(start + per, n)), steps
        return
    sorted_codes, perm = torch.sort(codes, stable=True)
    values, counts = torch.unique_consecutive(sorted_codes, return_counts=True)
    start = 0
    for code, count in zip(values.tolist(), counts.tolist()):
        steps = enabled(code)
        for s in range(start, start + count, per):
            yield perm[s:min(s + per, start + count)].to(order.device), steps
        start += count
