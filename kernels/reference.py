"""Plain torch references of the kernels: what the tests compare against, and the path
the public functions take when Triton cannot run (CPU tensors without
``TRITON_INTERPRET=1``, other devices, or triton not installed).

They take the same arguments, run the same checks and return the same tensors as the
launchers (float outputs up to the rounding tolerances in docs/kernels.md). Imports
torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlpack_io.kernels._args import CropArgs, ResizeArgs, check_crop, check_resize
from dlpack_io.kernels._epilogue import apply_torch


def crop_flip_permute(images, top, left, height, width, flip_h, flip_v, *, mean=None,
                      std=None, out_dtype=torch.uint8, brightness=None, contrast=None,
                      contrast_mean=None, validate=True) -> torch.Tensor:
    """Torch reference of :func:`dlpack_io.kernels.crop_flip_permute` (same arguments)."""
    return crop_impl(check_crop(images, top, left, height, width, flip_h, flip_v, mean=mean,
                                std=std, out_dtype=out_dtype, brightness=brightness,
                                contrast=contrast, contrast_mean=contrast_mean,
                                validate=validate))


def resized_crop(images, boxes, out_size, flip_h, flip_v, *, offsets=None, heights=None,
                 widths=None, channels=None, mean=None, std=None, out_dtype=torch.uint8,
                 antialias=False, brightness=None, contrast=None, contrast_mean=None,
                 validate=True) -> torch.Tensor:
    """Torch reference of :func:`dlpack_io.kernels.resized_crop` (same arguments)."""
    return resize_impl(check_resize(images, boxes, out_size, flip_h, flip_v, offsets=offsets,
                                    heights=heights, widths=widths, channels=channels,
                                    antialias=antialias, mean=mean, std=std,
                                    out_dtype=out_dtype, brightness=brightness,
                                    contrast=contrast, contrast_mean=contrast_mean,
                                    validate=validate))


def crop_impl(a: CropArgs) -> torch.Tensor:
    """Crop by gathering clamped, flipped row/column indices for the whole batch."""
    n, h, w, _ = a.images.shape
    dev = a.images.device
    ys = torch.arange(a.height, device=dev).expand(n, -1)
    xs = torch.arange(a.width, device=dev).expand(n, -1)
    ys = torch.where(a.flip_v.bool()[:, None], a.height - 1 - ys, ys) + a.top.long()[:, None]
    xs = torch.where(a.flip_h.bool()[:, None], a.width - 1 - xs, xs) + a.left.long()[:, None]
    ys, xs = ys.clamp(0, h - 1), xs.clamp(0, w - 1)  # matters only with validate=False
    batch = torch.arange(n, device=dev)[:, None, None]
    planes = a.images[batch, ys[:, :, None], xs[:, None, :]].permute(0, 3, 1, 2)
    if a.ep.out_dtype == torch.uint8 and not a.ep.has_jitter:
        return planes.contiguous()
    return apply_torch(planes.float(), a.ep).contiguous()


def resize_impl(a: ResizeArgs) -> torch.Tensor:
    """Resample each box with ``F.interpolate`` (float32), flip, then the epilogue."""
    dev = a.images.device
    out = torch.empty((a.n, a.channels, a.out_h, a.out_w), dtype=torch.float32, device=dev)
    boxes = a.boxes.tolist()
    flips = zip(a.flip_h.tolist(), a.flip_v.tolist())
    for i, (flip_h, flip_v) in enumerate(flips):
        image = _sample(a, i)
        top, left, bh, bw = _clamp_box(boxes[i], image.shape[0], image.shape[1])
        crop = image[top:top + bh, left:left + bw].permute(2, 0, 1).unsqueeze(0).float()
        res = _interpolate(crop, a.out_h, a.out_w, a.antialias)[0]
        dims = [d for d, flip in ((2, flip_h), (1, flip_v)) if flip]
        out[i] = res.flip(dims) if dims else res
    return apply_torch(out, a.ep).contiguous()


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


def _sample(a: ResizeArgs, i: int) -> torch.Tensor:
    """Image ``i`` of the batch as an (H, W, C) uint8 view."""
    if not a.ragged:
        return a.images[i]
    off, h, w = int(a.offsets[i]), int(a.heights[i]), int(a.widths[i])
    return a.images[off:off + h * w * a.channels].view(h, w, a.channels)


def _clamp_box(box, img_h: int, img_w: int) -> tuple[int, int, int, int]:
    """Clamp a box into the image (only reached with validate=False and a bad box)."""
    top, left, bh, bw = box
    top, left = min(max(top, 0), img_h - 1), min(max(left, 0), img_w - 1)
    return top, left, min(max(bh, 1), img_h - top), min(max(bw, 1), img_w - left)


def epilogue(images, *, out=None, mean=None, std=None, out_dtype=torch.uint8, **jitter):
    """(Interim, until the jitter epilogue lands) uint8 NCHW -> ``out_dtype`` with
    normalisation only: ``v * (1 / (255 * std)) + (-mean / std)`` in float32."""
    if any(v is not None for v in jitter.values()):
        raise NotImplementedError("colour jitter on the host is not implemented yet")
    c = images.shape[1]
    mean = (0.0,) * c if mean is None else tuple(mean)
    std = (1.0,) * c if std is None else tuple(std)
    scale = torch.tensor([1.0 / (255.0 * s) for s in std]).view(1, c, 1, 1)
    bias = torch.tensor([-m / s for m, s in zip(mean, std)]).view(1, c, 1, 1)
    if out is None:
        out = torch.empty(images.shape, dtype=out_dtype)
    if out_dtype == torch.uint8:
        return out.copy_(images)
    if out.dtype == torch.float32:
        torch.mul(images, scale, out=out)
        return out.add_(bias)
    return out.copy_(images.to(torch.float32).mul_(scale).add_(bias))
