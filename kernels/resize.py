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
from dlpack_io.kernels._args import Batch, check_resize, check_resize_packed
from dlpack_io.kernels._colour_tl import epilogue
from dlpack_io.kernels._epilogue import contrast_means, kernel_args
from dlpack_io.kernels._sampling import (
    aa_axis, aa_weight, bilinear_axis, clamp, load_box, sample_source, tap)
from dlpack_io.kernels._tiling import (
    BLOCK_H, BLOCK_W, NUM_WARPS, device_guard, tile_coords, tile_grid)
from dlpack_io.kernels._triton import LAUNCH_OPTIONS, lazy_jit, use_triton

tl = None  # bound to triton.language by lazy_jit on first launch

# Per-batch sizes are plain runtime ints (no recompiles for new image sizes or buffer
# lengths); OH/OW stay specialised so Triton can prove the stores' 16-byte alignment.
_RUNTIME_INTS = ("H", "W", "total")


@lazy_jit(do_not_specialize=_RUNTIME_INTS)
def _resized_crop_kernel(
        in_ptr, out_ptr, rec_ptr, scale_ptr, bias_ptr, cmean_ptr, stats_ptr,
        H, W, OH, OW, total, tiles_x, tiles_per_sample,
        C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, RAGGED: tl.constexpr,
        OPS: tl.constexpr, STATS: tl.constexpr, OUT_U8: tl.constexpr):
    n, oy, ox, pmask = tile_coords(OH, OW, tiles_x, tiles_per_sample, BLOCK_H, BLOCK_W)
    src, ih, iw = sample_source(in_ptr, rec_ptr, n, H, W, total, C, RAGGED)
    top, left, bh, bw, flip_h, flip_v = load_box(rec_ptr, n)
    y0, y1, ly = bilinear_axis(tl.where(flip_v, OH - 1 - oy, oy), OH, bh)  # [BLOCK_H, 1]
    x0, x1, lx = bilinear_axis(tl.where(flip_h, OW - 1 - ox, ox), OW, bw)  # [1, BLOCK_W]
    r0 = clamp(top + y0, 0, ih - 1) * (iw * C)
    r1 = clamp(top + y1, 0, ih - 1) * (iw * C)
    c0 = clamp(left + x0, 0, iw - 1) * C
    c1 = clamp(left + x1, 0, iw - 1) * C
    wx0 = 1.0 - lx
    z = tl.zeros([BLOCK_H, BLOCK_W], dtype=tl.float32)
    t0, t1, t2, t3 = tap(src + (r0 + c0), wx0, z, z, z, z, C)
    t0, t1, t2, t3 = tap(src + (r0 + c1), lx, t0, t1, t2, t3, C)
    b0, b1, b2, b3 = tap(src + (r1 + c0), wx0, z, z, z, z, C)
    b0, b1, b2, b3 = tap(src + (r1 + c1), lx, b0, b1, b2, b3, C)
    wy0 = 1.0 - ly
    epilogue(out_ptr, wy0 * t0 + ly * b0, wy0 * t1 + ly * b1, wy0 * t2 + ly * b2,
             wy0 * t3 + ly * b3, n, oy, ox, pmask, OH, OW, rec_ptr, scale_ptr, bias_ptr,
             cmean_ptr, stats_ptr, C, OPS, STATS, OUT_U8, False)


@lazy_jit(do_not_specialize=_RUNTIME_INTS)
def _resized_crop_aa_kernel(
        in_ptr, out_ptr, rec_ptr, scale_ptr, bias_ptr, cmean_ptr, stats_ptr,
        H, W, OH, OW, total, tiles_x, tiles_per_sample,
        C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, RAGGED: tl.constexpr,
        OPS: tl.constexpr, STATS: tl.constexpr, OUT_U8: tl.constexpr):
    n, oy, ox, pmask = tile_coords(OH, OW, tiles_x, tiles_per_sample, BLOCK_H, BLOCK_W)
    src, ih, iw = sample_source(in_ptr, rec_ptr, n, H, W, total, C, RAGGED)
    top, left, bh, bw, flip_h, flip_v = load_box(rec_ptr, n)
    # Filter windows: rows are [BLOCK_H, 1], columns [1, BLOCK_W]; ky/kx are scalars.
    dy, inv_y, y_lo, ny, ky = aa_axis(tl.where(flip_v, OH - 1 - oy, oy), OH, bh)
    dx, inv_x, x_lo, nx, kx = aa_axis(tl.where(flip_h, OW - 1 - ox, ox), OW, bw)
    row0 = top + y_lo  # [BLOCK_H, 1]: first source row of each output row's window
    col0 = left + x_lo  # [1, BLOCK_W]
    z = tl.zeros([BLOCK_H, BLOCK_W], dtype=tl.float32)
    a0, a1, a2, a3 = z, z, z, z
    # Columns outside, rows inside: a thread holds one row and several columns of the tile,
    # so the inner loop's row weight and offset cost one evaluation per thread and tap.
    # Weights are unnormalised here; the normalisation is one multiply after the loops, so
    # nothing computed outside the loops (in another register layout) is used inside.
    for tx in range(0, kx):
        wx = aa_weight(tx, tl.cast(tx, tl.float32), dx, inv_x, nx)
        cptrs = src + clamp(col0 + tx, 0, iw - 1) * C  # [1, BLOCK_W]
        v0, v1, v2, v3 = z, z, z, z
        for ty in range(0, ky):
            wy = aa_weight(ty, tl.cast(ty, tl.float32), dy, inv_y, ny)
            roff = clamp(row0 + ty, 0, ih - 1) * (iw * C)  # [BLOCK_H, 1]
            v0, v1, v2, v3 = tap(cptrs + roff, wy, v0, v1, v2, v3, C)
        a0 = tl.fma(wx, v0, a0)
        a1 = tl.fma(wx, v1, a1)
        a2 = tl.fma(wx, v2, a2)
        a3 = tl.fma(wx, v3, a3)
    sum_y = dy * 0.0
    for t in range(0, ky):
        sum_y += aa_weight(t, tl.cast(t, tl.float32), dy, inv_y, ny)
    sum_x = dx * 0.0
    for t in range(0, kx):
        sum_x += aa_weight(t, tl.cast(t, tl.float32), dx, inv_x, nx)
    # 1 / (sum_y * sum_x); the sums are 0 only for an empty box (validate=False).
    norm = tl.math.div_rn(1.0, tl.where(sum_y > 0.0, sum_y, 1.0) * tl.where(sum_x > 0.0, sum_x,
                                                                            1.0))
    epilogue(out_ptr, a0 * norm, a1 * norm, a2 * norm, a3 * norm, n, oy, ox, pmask, OH, OW,
             rec_ptr, scale_ptr, bias_ptr, cmean_ptr, stats_ptr, C, OPS, STATS, OUT_U8, False)


def resized_crop(images: torch.Tensor, boxes: torch.Tensor, out_size, flip_h, flip_v, *,
                 offsets=None, heights=None, widths=None, channels=None, mean=None,
                 std=None, out_dtype: torch.dtype = torch.uint8, antialias: bool = False,
                 brightness=None, contrast=None, saturation=None, hue=None, order=None,
                 contrast_mean=None, validate: bool = True) -> torch.Tensor:
    """Resample one box per sample to a fixed size, flip, permute, jitter, normalise, cast.

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
        mean, std, out_dtype, brightness, contrast, saturation, hue, order, contrast_mean,
            validate: as in :func:`dlpack_io.kernels.crop_flip_permute`.
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
                        brightness=brightness, contrast=contrast, saturation=saturation,
                        hue=hue, order=order, contrast_mean=contrast_mean, validate=validate)
    if not use_triton(args.images.device):
        return reference.resize_impl(args)
    return _launch(args)


def resized_crop_packed(images: torch.Tensor, records: torch.Tensor, out_size, *,
                        channels=None, mean=None, std=None,
                        out_dtype: torch.dtype = torch.uint8, antialias: bool = False,
                        jitter=(), contrast_mean=None, validate: bool = True) -> torch.Tensor:
    """:func:`resized_crop` with every per-sample value read from ``records``.

    Args:
        images: dense (N, H, W, C) uint8 batch, or a flat 1-D uint8 buffer (ragged: each
            record's offset, height and width locate its image; ``channels`` default 3).
        records: (N, 16) int32 tensor on the images' device, laid out as in
            :mod:`dlpack_io.kernels.records` (e.g. ``records_view(slot, offset, n)`` of
            the same copied buffer): box, flips, ragged geometry, jitter factors, order.
        jitter: names of the enabled colour-jitter ops (``records.JITTER_OPS``); the
            factors of the others are ignored.
        out_size, channels, mean, std, out_dtype, antialias, contrast_mean, validate: as
            in :func:`resized_crop` (validation reads the record columns).
    """
    args = check_resize_packed(images, records, out_size, channels=channels,
                               antialias=antialias, jitter=jitter, mean=mean, std=std,
                               out_dtype=out_dtype, contrast_mean=contrast_mean,
                               validate=validate)
    if not use_triton(args.images.device):
        return reference.resize_impl(args)
    return _launch(args)


def _launch(a: Batch) -> torch.Tensor:
    """Allocate the NCHW output; measure contrast means if needed; launch the kernel."""
    out = torch.empty((a.n, a.channels, a.out_h, a.out_w), dtype=a.ep.out_dtype,
                      device=a.images.device)
    if a.n == 0:
        return out
    grid, tiles_x, tiles = tile_grid("resized_crop", a.n, a.out_h, a.out_w)
    h, w = (0, 0) if a.ragged else (a.images.shape[1], a.images.shape[2])
    kernel = _resized_crop_aa_kernel if a.antialias else _resized_crop_kernel
    sizes = (h, w, a.out_h, a.out_w, a.images.numel(), tiles_x, tiles)
    consts = dict(C=a.channels, BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W, RAGGED=a.ragged,
                  OPS=a.ep.ops, OUT_U8=a.ep.out_dtype == torch.uint8, num_warps=NUM_WARPS,
                  **LAUNCH_OPTIONS)

    def run(means, stats):
        kernel[grid](a.images, out, *kernel_args(a.ep, a.records, means, stats), *sizes,
                     STATS=stats is not None, **consts)

    with device_guard(a.images.device):
        means = contrast_means(a.ep, n=a.n, tiles=tiles, pixels=a.out_h * a.out_w,
                               channels=a.channels, run_stats=lambda p: run(None, p))
        run(means, None)
    return out
