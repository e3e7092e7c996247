"""``resized_crop``: per-sample box -> fixed size resample + flips + NCHW + normalise + cast.

The random-resized-crop of ImageNet training, fused. Input is either a dense uint8 NHWC
batch or a ragged batch: one flat uint8 buffer plus per-sample ``offsets`` (bytes),
``heights`` and ``widths`` (each sample an HWC image of ``channels`` channels). For
sample ``n`` with box ``(top, left, bh, bw)`` and output size ``(OH, OW)``::

    y' = OH - 1 - y if flip_v[n] else y        x' = OW - 1 - x if flip_h[n] else x
    out[n, c, y, x] = epilogue(resample(box of image n, channel c)(y', x'))

``resample`` is torch's ``interpolate(mode="bilinear", align_corners=False)`` of the box
(half-pixel centres, source index clamped at 0 and at the box's last row/column; pixels
outside the box are never read), or with ``antialias=True`` torch's
``interpolate(..., antialias=True)`` (PIL's triangle filter widened by the downscale
factor). Both are computed in float32 without intermediate rounding.
"""

from __future__ import annotations

import torch

from dlpack_io.kernels import reference
from dlpack_io.kernels._args import ResizeArgs, check_resize
from dlpack_io.kernels._epilogue import epilogue_tile, kernel_args
from dlpack_io.kernels._sampling import (
    aa_axis, aa_weight, bilinear_axis, clamp, gather, load_box, sample_geometry)
from dlpack_io.kernels._tiling import (
    BLOCK_H, BLOCK_W, NUM_WARPS, channel_pad, device_guard, store_planes, tile_coords, tile_grid)
from dlpack_io.kernels._triton import LAUNCH_OPTIONS, lazy_jit, use_triton

tl = None  # bound to triton.language by lazy_jit on first launch


@lazy_jit
def _resized_crop_kernel(
        in_ptr, out_ptr, box_ptr, fh_ptr, fv_ptr, off_ptr, h_ptr, w_ptr,
        scale_ptr, bias_ptr, bright_ptr, contrast_ptr, cmean_ptr,
        H, W, OH, OW, total, tiles_x, tiles_per_sample,
        C: tl.constexpr, CP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
        RAGGED: tl.constexpr, HAS_JITTER: tl.constexpr, OUT_U8: tl.constexpr):
    n, oy, ox, pmask = tile_coords(OH, OW, tiles_x, tiles_per_sample, BLOCK_H, BLOCK_W)
    base, ih, iw = sample_geometry(n, off_ptr, h_ptr, w_ptr, H, W, C, RAGGED)
    top, left, bh, bw, flip_h, flip_v = load_box(box_ptr, fh_ptr, fv_ptr, n)
    y0, y1, ly = bilinear_axis(tl.where(flip_v, OH - 1 - oy, oy), OH, bh)
    x0, x1, lx = bilinear_axis(tl.where(flip_h, OW - 1 - ox, ox), OW, bw)
    r0 = clamp(top + y0, 0, ih - 1)
    r1 = clamp(top + y1, 0, ih - 1)
    c0 = clamp(left + x0, 0, iw - 1)
    c1 = clamp(left + x1, 0, iw - 1)
    cols = tl.arange(0, CP)
    p00 = gather(in_ptr, base, r0, c0, iw, pmask, cols, total, C, RAGGED)
    p01 = gather(in_ptr, base, r0, c1, iw, pmask, cols, total, C, RAGGED)
    p10 = gather(in_ptr, base, r1, c0, iw, pmask, cols, total, C, RAGGED)
    p11 = gather(in_ptr, base, r1, c1, iw, pmask, cols, total, C, RAGGED)
    wx1 = lx[:, None]
    wx0 = 1.0 - wx1
    wy1 = ly[:, None]
    v = (1.0 - wy1) * (wx0 * p00 + wx1 * p01) + wy1 * (wx0 * p10 + wx1 * p11)
    val = epilogue_tile(v, n, cols, scale_ptr, bias_ptr, bright_ptr, contrast_ptr, cmean_ptr,
                        C, HAS_JITTER, OUT_U8)
    store_planes(out_ptr, val, n, oy, ox, pmask, cols, OH, OW, C)


@lazy_jit
def _resized_crop_aa_kernel(
        in_ptr, out_ptr, box_ptr, fh_ptr, fv_ptr, off_ptr, h_ptr, w_ptr,
        scale_ptr, bias_ptr, bright_ptr, contrast_ptr, cmean_ptr,
        H, W, OH, OW, total, tiles_x, tiles_per_sample,
        C: tl.constexpr, CP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
        RAGGED: tl.constexpr, HAS_JITTER: tl.constexpr, OUT_U8: tl.constexpr):
    n, oy, ox, pmask = tile_coords(OH, OW, tiles_x, tiles_per_sample, BLOCK_H, BLOCK_W)
    base, ih, iw = sample_geometry(n, off_ptr, h_ptr, w_ptr, H, W, C, RAGGED)
    top, left, bh, bw, flip_h, flip_v = load_box(box_ptr, fh_ptr, fv_ptr, n)
    cy, inv_y, y_lo, y_hi, ky = aa_axis(tl.where(flip_v, OH - 1 - oy, oy), OH, bh)
    cx, inv_x, x_lo, x_hi, kx = aa_axis(tl.where(flip_h, OW - 1 - ox, ox), OW, bw)
    sum_y = tl.zeros_like(cy)
    for t in range(0, ky):
        sum_y += aa_weight(y_lo + t, cy, inv_y, y_hi)
    sum_x = tl.zeros_like(cx)
    for t in range(0, kx):
        sum_x += aa_weight(x_lo + t, cx, inv_x, x_hi)
    # Normalise by multiplying with 1 / sum (0 only on masked-off lanes).
    inv_sum_y = tl.math.div_rn(1.0, tl.where(sum_y > 0.0, sum_y, 1.0))
    inv_sum_x = tl.math.div_rn(1.0, tl.where(sum_x > 0.0, sum_x, 1.0))
    cols = tl.arange(0, CP)
    acc = tl.zeros([BLOCK_H * BLOCK_W, CP], dtype=tl.float32)
    for ty in range(0, ky):
        row = clamp(top + y_lo + ty, 0, ih - 1)
        line = tl.zeros([BLOCK_H * BLOCK_W, CP], dtype=tl.float32)
        for tx in range(0, kx):
            wx = aa_weight(x_lo + tx, cx, inv_x, x_hi) * inv_sum_x
            col = clamp(left + x_lo + tx, 0, iw - 1)
            line += wx[:, None] * gather(in_ptr, base, row, col, iw, pmask, cols, total, C,
                                         RAGGED)
        wy = aa_weight(y_lo + ty, cy, inv_y, y_hi) * inv_sum_y
        acc += wy[:, None] * line
    val = epilogue_tile(acc, n, cols, scale_ptr, bias_ptr, bright_ptr, contrast_ptr, cmean_ptr,
                        C, HAS_JITTER, OUT_U8)
    store_planes(out_ptr, val, n, oy, ox, pmask, cols, OH, OW, C)


def resized_crop(images: torch.Tensor, boxes: torch.Tensor, out_size, flip_h, flip_v, *,
                 offsets=None, heights=None, widths=None, channels=None, mean=None,
                 std=None, out_dtype: torch.dtype = torch.uint8, antialias: bool = False,
                 brightness=None, contrast=None, contrast_mean=None,
                 validate: bool = True) -> torch.Tensor:
    """Resample one box per sample to a fixed size, flip, permute, normalise and cast.

    Args:
        images: dense (N, H, W, C) uint8 contiguous batch (C in 1..4), or, with
            ``offsets``/``heights``/``widths``, one flat contiguous 1-D uint8 buffer
            holding N HWC images back to back (any order, gaps allowed).
        boxes: (N, 4) int32/int64 tensor of (top, left, height, width) in each image.
        out_size: int or (out_h, out_w), the same for the whole batch.
        flip_h, flip_v: (N,) bool/uint8 tensors or a Python bool for the whole batch.
        offsets, heights, widths: ragged form only, (N,) int32/int64 tensors: byte
            offset of sample n in ``images`` and its height and width.
        channels: ragged form: channels per pixel (default 3); dense: must match C.
        mean, std, out_dtype, brightness, contrast, contrast_mean, validate: as in
            :func:`dlpack_io.kernels.crop_flip_permute`.
        antialias: False: plain bilinear (torch ``interpolate(mode="bilinear",
            align_corners=False)``); True: triangle filter widened by the downscale
            factor (``antialias=True``, close to PIL's BILINEAR resize).

    Returns:
        (N, C, out_h, out_w) tensor of ``out_dtype`` on the device of ``images``.

    Raises:
        TypeError, ValueError: naming the bad argument, before anything is launched.
    """
    args = check_resize(images, boxes, out_size, flip_h, flip_v, offsets=offsets,
                        heights=heights, widths=widths, channels=channels,
                        antialias=antialias, mean=mean, std=std, out_dtype=out_dtype,
                        brightness=brightness, contrast=contrast,
                        contrast_mean=contrast_mean, validate=validate)
    if not use_triton(images.device):
        return reference.resize_impl(args)
    return _launch(args)


def _launch(a: ResizeArgs) -> torch.Tensor:
    """Allocate the NCHW output and launch the bilinear or antialiased kernel."""
    out = torch.empty((a.n, a.channels, a.out_h, a.out_w), dtype=a.ep.out_dtype,
                      device=a.images.device)
    if a.n == 0:
        return out
    grid, tiles_x, tiles = tile_grid("resized_crop", a.n, a.out_h, a.out_w)
    if a.ragged:
        h = w = 0
        geometry = (a.offsets, a.heights, a.widths)
    else:
        h, w = a.images.shape[1], a.images.shape[2]
        geometry = (a.boxes, a.boxes, a.boxes)  # unused placeholders
    kernel = _resized_crop_aa_kernel if a.antialias else _resized_crop_kernel
    with device_guard(a.images.device):
        kernel[grid](
            a.images, out, a.boxes, a.flip_h, a.flip_v, *geometry, *kernel_args(a.ep),
            h, w, a.out_h, a.out_w, a.images.numel(), tiles_x, tiles,
            C=a.channels, CP=channel_pad(a.channels), BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W,
            RAGGED=a.ragged, HAS_JITTER=a.ep.has_jitter, OUT_U8=a.ep.out_dtype == torch.uint8,
            num_warps=NUM_WARPS, **LAUNCH_OPTIONS)
    return out
