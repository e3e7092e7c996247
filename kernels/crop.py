"""``crop_flip_permute``: per-sample crop + flips + NHWC->NCHW + normalise + cast, fused.

For sample ``n``, output pixel ``(y, x)`` of channel ``c`` is::

    sy = top[n]  + (height - 1 - y if flip_v[n] else y)
    sx = left[n] + (width  - 1 - x if flip_h[n] else x)
    out[n, c, y, x] = epilogue(images[n, sy, sx, c])

(see ``epilogue.py`` for jitter/normalise/cast). uint8 output without jitter is an exact
copy of the pixels.
"""

from __future__ import annotations

import torch

from dlpack_io.kernels import reference
from dlpack_io.kernels.args import Batch, check_crop, check_crop_packed
from dlpack_io.kernels.colour import epilogue
from dlpack_io.kernels.launch import (
    BLOCK_H, BLOCK_W, LAUNCH_OPTIONS, NUM_WARPS, clamp, contrast_means, device_guard,
    kernel_args, lazy_jit, load_box, tile_coords, tile_grid, use_triton)

tl = None  # bound to triton.language by lazy_jit on first launch


@lazy_jit(do_not_specialize=("H", "W"))
def _crop_flip_permute_kernel(
        in_ptr, out_ptr, rec_ptr, scale_ptr, bias_ptr, cmean_ptr, stats_ptr,
        H, W, OH, OW, tiles_x, tiles_per_sample,
        C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
        OPS: tl.constexpr, STATS: tl.constexpr, OUT_U8: tl.constexpr):
    n, oy, ox, pmask = tile_coords(OH, OW, tiles_x, tiles_per_sample, BLOCK_H, BLOCK_W)
    top, left, _, _, flip_h, flip_v = load_box(rec_ptr, n)
    # Source pixel, clamped into the image so even an unchecked bad box stays in memory.
    sy = clamp(top + tl.where(flip_v, OH - 1 - oy, oy), 0, H - 1)  # [BLOCK_H, 1]
    sx = clamp(left + tl.where(flip_h, OW - 1 - ox, ox), 0, W - 1)  # [1, BLOCK_W]
    ptrs = in_ptr + n.to(tl.int64) * (H * W * C) + (sy * (W * C) + sx * C)
    x0 = tl.load(ptrs)
    x1 = x0
    x2 = x0
    x3 = x0
    if C > 1:
        x1 = tl.load(ptrs + 1)
    if C > 2:
        x2 = tl.load(ptrs + 2)
    if C > 3:
        x3 = tl.load(ptrs + 3)
    if OUT_U8 and OPS == 0:  # an exact copy: store the bytes
        epilogue(out_ptr, x0, x1, x2, x3, n, oy, ox, pmask, OH, OW, rec_ptr, scale_ptr,
                 bias_ptr, cmean_ptr, stats_ptr, C, OPS, STATS, OUT_U8, True)
    else:
        epilogue(out_ptr, x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32),
                 x3.to(tl.float32), n, oy, ox, pmask, OH, OW, rec_ptr, scale_ptr, bias_ptr,
                 cmean_ptr, stats_ptr, C, OPS, STATS, OUT_U8, False)


def crop_flip_permute(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor,
                      height: int, width: int, flip_h, flip_v, *, mean=None, std=None,
                      out_dtype: torch.dtype = torch.uint8, brightness=None, contrast=None,
                      saturation=None, hue=None, order=None, contrast_mean=None,
                      validate: bool = True) -> torch.Tensor:
    """Crop, flip, permute to NCHW, jitter, normalise and cast a uint8 NHWC batch in one pass.

    Args:
        images: (N, H, W, C) uint8, contiguous, C in 1..4.
        top, left: (N,) int32/int64 tensors, the crop's top-left corner per sample.
        height, width: the crop size (one output size for the whole batch).
        flip_h, flip_v: (N,) bool/uint8 tensors (mirror left-right / upside-down per
            sample), or a Python bool for the whole batch.
        mean, std: per-channel sequences (length C) for float outputs; the output is
            ``(pixel / 255 - mean) / std``. Not allowed with uint8 output.
        out_dtype: torch.uint8 (exact copy without jitter), float16, bfloat16 or float32.
        brightness, contrast, saturation, hue: optional (N,) float tensors, per-sample
            factors of torchvision's ColorJitter ops (only the given ops run; saturation
            and hue need 1 or 3 channels); formulas in docs/kernels.md.
        order: optional (N,) int codes of the order the ops run in per sample
            (``dlpack_io.kernels.records.encode_order`` of torchvision's ``fn_idx``);
            default brightness, contrast, saturation, hue.
        contrast_mean: optional (N,) float means in [0, 1] to blend towards instead of
            the sample's grayscale mean (which otherwise costs one extra reading pass).
        validate: check data-dependent conditions (boxes inside images, jitter factors
            and orders valid). On CUDA that costs one device->host sync; with ``False`` a
            bad box gives unspecified pixels (reads are clamped into the image, never out
            of memory).

    Returns:
        (N, C, height, width) tensor of ``out_dtype`` on the device of ``images``.

    Raises:
        TypeError, ValueError: naming the bad argument, before anything is launched.
    """
    args = check_crop(images, top, left, height, width, flip_h, flip_v, mean=mean, std=std,
                      out_dtype=out_dtype, brightness=brightness, contrast=contrast,
                      saturation=saturation, hue=hue, order=order,
                      contrast_mean=contrast_mean, validate=validate)
    if not use_triton(args.images.device):
        return reference.crop_impl(args)
    return _launch(args)


def crop_flip_permute_packed(images: torch.Tensor, records: torch.Tensor, height: int,
                             width: int, *, mean=None, std=None,
                             out_dtype: torch.dtype = torch.uint8, jitter=(),
                             contrast_mean=None, validate: bool = True) -> torch.Tensor:
    """:func:`crop_flip_permute` with the per-sample values read from ``records``
    (:mod:`dlpack_io.kernels.records`: top, left, flags, jitter factors and order);
    ``jitter`` names the enabled ops."""
    args = check_crop_packed(images, records, height, width, jitter=jitter, mean=mean, std=std,
                             out_dtype=out_dtype, contrast_mean=contrast_mean,
                             validate=validate)
    if not use_triton(args.images.device):
        return reference.crop_impl(args)
    return _launch(args)


def _launch(a: Batch) -> torch.Tensor:
    """Allocate the NCHW output; measure contrast means if needed; launch the kernel."""
    n, h, w, c = a.images.shape
    out = torch.empty((n, c, a.out_h, a.out_w), dtype=a.ep.out_dtype, device=a.images.device)
    if n == 0:
        return out
    grid, tiles_x, tiles = tile_grid("crop_flip_permute", n, a.out_h, a.out_w)
    consts = dict(C=c, BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W, OPS=a.ep.ops,
                  OUT_U8=a.ep.out_dtype == torch.uint8, num_warps=NUM_WARPS, **LAUNCH_OPTIONS)

    def run(means, stats):
        _crop_flip_permute_kernel[grid](
            a.images, out, *kernel_args(a.ep, a.records, means, stats), h, w, a.out_h,
            a.out_w, tiles_x, tiles, STATS=stats is not None, **consts)

    with device_guard(a.images.device):
        means = contrast_means(a.ep, n=n, tiles=tiles, pixels=a.out_h * a.out_w, channels=c,
                               run_stats=lambda p: run(None, p))
        run(means, None)
    return out
