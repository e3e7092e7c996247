"""``crop_flip_permute``: per-sample crop + flips + NHWC->NCHW + normalise + cast, fused.

For sample ``n``, output pixel ``(y, x)`` of channel ``c`` is::

    sy = top[n]  + (height - 1 - y if flip_v[n] else y)
    sx = left[n] + (width  - 1 - x if flip_h[n] else x)
    out[n, c, y, x] = epilogue(images[n, sy, sx, c])

(see ``_epilogue.py`` for jitter/normalise/cast). uint8 output without jitter is an exact
copy of the pixels.
"""

from __future__ import annotations

import torch

from dlpack_io.kernels import reference
from dlpack_io.kernels._args import CropArgs, check_crop
from dlpack_io.kernels._epilogue import epilogue_tile, kernel_args
from dlpack_io.kernels._tiling import (
    BLOCK_H, BLOCK_W, NUM_WARPS, channel_pad, device_guard, store_planes, tile_coords, tile_grid)
from dlpack_io.kernels._triton import LAUNCH_OPTIONS, lazy_jit, use_triton

tl = None  # bound to triton.language by lazy_jit on first launch


@lazy_jit
def _crop_flip_permute_kernel(
        in_ptr, out_ptr, top_ptr, left_ptr, fh_ptr, fv_ptr,
        scale_ptr, bias_ptr, bright_ptr, contrast_ptr, cmean_ptr,
        H, W, OH, OW, tiles_x, tiles_per_sample,
        C: tl.constexpr, CP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
        HAS_JITTER: tl.constexpr, OUT_U8: tl.constexpr):
    n, oy, ox, pmask = tile_coords(OH, OW, tiles_x, tiles_per_sample, BLOCK_H, BLOCK_W)
    top = tl.load(top_ptr + n).to(tl.int32)
    left = tl.load(left_ptr + n).to(tl.int32)
    flip_h = tl.load(fh_ptr + n) != 0
    flip_v = tl.load(fv_ptr + n) != 0
    # Source pixel, clamped into the image so even an unchecked bad box stays in memory.
    sy = top + tl.where(flip_v, OH - 1 - oy, oy)
    sx = left + tl.where(flip_h, OW - 1 - ox, ox)
    sy = tl.minimum(tl.maximum(sy, 0), H - 1)
    sx = tl.minimum(tl.maximum(sx, 0), W - 1)
    cols = tl.arange(0, CP)
    src = in_ptr + n.to(tl.int64) * (H * W * C)
    mask = pmask[:, None] & (cols < C)[None, :]
    px = tl.load(src + ((sy * W + sx) * C)[:, None] + cols[None, :], mask=mask, other=0)
    if OUT_U8 and not HAS_JITTER:
        val = px
    else:
        val = epilogue_tile(px.to(tl.float32), n, cols, scale_ptr, bias_ptr, bright_ptr,
                            contrast_ptr, cmean_ptr, C, HAS_JITTER, OUT_U8)
    store_planes(out_ptr, val, n, oy, ox, pmask, cols, OH, OW, C)


def crop_flip_permute(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor,
                      height: int, width: int, flip_h, flip_v, *, mean=None, std=None,
                      out_dtype: torch.dtype = torch.uint8, brightness=None, contrast=None,
                      contrast_mean=None, validate: bool = True) -> torch.Tensor:
    """Crop, flip, permute to NCHW, normalise and cast a uint8 NHWC batch in one pass.

    Args:
        images: (N, H, W, C) uint8, contiguous, C in 1..4.
        top, left: (N,) int32/int64 tensors, the crop's top-left corner per sample.
        height, width: the crop size (one output size for the whole batch).
        flip_h, flip_v: (N,) bool/uint8 tensors (mirror left-right / upside-down per
            sample), or a Python bool for the whole batch.
        mean, std: per-channel sequences (length C) for float outputs; the output is
            ``(pixel / 255 - mean) / std``. Not allowed with uint8 output.
        out_dtype: torch.uint8 (exact copy), float16, bfloat16 or float32.
        brightness, contrast, contrast_mean: optional (N,) float tensors, per-sample
            jitter (formula in docs/kernels.md); contrast_mean defaults to 0.5.
        validate: check data-dependent conditions (boxes inside images, jitter factors
            >= 0). On CUDA that costs one device->host sync; with ``False`` a bad box gives
            unspecified pixels (reads are clamped into the image, never out of memory).

    Returns:
        (N, C, height, width) tensor of ``out_dtype`` on the device of ``images``.

    Raises:
        TypeError, ValueError: naming the bad argument, before anything is launched.
    """
    args = check_crop(images, top, left, height, width, flip_h, flip_v, mean=mean, std=std,
                      out_dtype=out_dtype, brightness=brightness, contrast=contrast,
                      contrast_mean=contrast_mean, validate=validate)
    if not use_triton(images.device):
        return reference.crop_impl(args)
    return _launch(args)


def _launch(a: CropArgs) -> torch.Tensor:
    """Allocate the NCHW output and launch the Triton kernel."""
    n, h, w, c = a.images.shape
    out = torch.empty((n, c, a.height, a.width), dtype=a.ep.out_dtype, device=a.images.device)
    if n == 0:
        return out
    grid, tiles_x, tiles = tile_grid("crop_flip_permute", n, a.height, a.width)
    with device_guard(a.images.device):
        _crop_flip_permute_kernel[grid](
            a.images, out, a.top, a.left, a.flip_h, a.flip_v, *kernel_args(a.ep),
            h, w, a.height, a.width, tiles_x, tiles,
            C=c, CP=channel_pad(c), BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W,
            HAS_JITTER=a.ep.has_jitter, OUT_U8=a.ep.out_dtype == torch.uint8,
            num_warps=NUM_WARPS, **LAUNCH_OPTIONS)
    return out
