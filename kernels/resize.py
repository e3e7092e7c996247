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
from dlpack_io.kernels.args import Batch, check_resize, check_resize_packed
from dlpack_io.kernels.colour import epilogue
from dlpack_io.kernels.launch import (
    BLOCK_H, BLOCK_W, LAUNCH_OPTIONS, NUM_WARPS, clamp, contrast_means, device_guard,
    kernel_args, lazy_jit, load_box, tile_coords, tile_grid, use_triton)

tl = None  # bound to triton.language by lazy_jit on first launch

# Per-batch sizes are plain runtime ints (no recompiles for new image sizes or buffer
# lengths); OH/OW stay specialised so Triton can prove the stores' 16-byte alignment.
_RUNTIME_INTS = ("H", "W", "total")


@lazy_jit
def _sample_source(in_ptr, rec_ptr, n, H, W, total, C: tl.constexpr, RAGGED: tl.constexpr):
    """``(src, height, width)``: pointer to sample ``n``'s first byte and its int32 size.

    Dense: ``base = n * H * W * C`` and the batch's H, W; ragged: the record's offset,
    height and width. The kernel then adds int32 offsets to ``src`` (int64 maths once per
    program): an image is < 2**31 bytes, checked on the host and re-checked here, so a
    ragged record that does not fit the buffer (only possible with validate=False) reads
    pixel 0 of the buffer as a 1x1 image instead of leaving the buffer.
    """
    if RAGGED:
        rec = rec_ptr + n * 16
        lo = tl.load(rec + 8).to(tl.int64) & 0xFFFFFFFF
        base = (tl.load(rec + 9).to(tl.int64) << 32) | lo
        ih = tl.load(rec + 6)
        iw = tl.load(rec + 7)
        size = ih.to(tl.int64) * iw.to(tl.int64) * C
        bad = (ih < 1) | (iw < 1) | (base < 0) | (size > 2147483647) | (base > total - size)
        base = tl.where(bad, 0, base)
        ih = tl.where(bad, 1, ih)
        iw = tl.where(bad, 1, iw)
    else:
        base = n.to(tl.int64) * (H * W * C)
        ih = H + 0 * n
        iw = W + 0 * n
    return in_ptr + base, ih, iw


@lazy_jit
def _u8_to_f32(x):
    """Exact uint8 -> float32 without a conversion instruction (those run at 1/8 of the
    FP32 rate on sm_80/sm_90): ``2**23 + x`` built from its bits, minus ``2**23``."""
    return (x.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@lazy_jit
def _tap(ptrs, w, a0, a1, a2, a3, C: tl.constexpr):
    """``a += w * pixel`` (one fused multiply-add) for every channel of the pixels whose
    first byte is at ``ptrs``."""
    a0 = tl.fma(w, _u8_to_f32(tl.load(ptrs)), a0)
    if C > 1:
        a1 = tl.fma(w, _u8_to_f32(tl.load(ptrs + 1)), a1)
    if C > 2:
        a2 = tl.fma(w, _u8_to_f32(tl.load(ptrs + 2)), a2)
    if C > 3:
        a3 = tl.fma(w, _u8_to_f32(tl.load(ptrs + 3)), a3)
    return a0, a1, a2, a3


@lazy_jit
def _bilinear_axis(o, out_len, length):
    """Half-pixel bilinear source taps along one axis, relative to the box.

    ``src = max((o + 0.5) * length / out_len - 0.5, 0)``, ``i0 = min(floor(src),
    length - 1)``, ``i1 = min(i0 + 1, length - 1)``, ``lam = src - i0`` (exactly
    torch's ``interpolate(mode="bilinear", align_corners=False)``).
    """
    scale = tl.math.div_rn(tl.cast(length, tl.float32), tl.cast(out_len, tl.float32))
    src = tl.maximum((o.to(tl.float32) + 0.5) * scale - 0.5, 0.0)
    i0 = tl.minimum(src.to(tl.int32), length - 1)
    lam = tl.minimum(tl.maximum(src - i0.to(tl.float32), 0.0), 1.0)
    return i0, tl.minimum(i0 + 1, length - 1), lam


@lazy_jit
def _aa_axis(o, out_len, length):
    """Antialiased (PIL / torch ``antialias=True``) triangle-filter window along one axis.

    ``scale = length / out_len``; ``support = max(scale, 1)``; ``inv = 1 / max(scale, 1)``;
    ``center = scale * (o + 0.5)``; taps ``lo <= j < hi`` with ``lo = max(int(center -
    support + 0.5), 0)``, ``hi = min(int(center + support + 0.5), length)``. Returns
    ``(d0, inv, lo, taps, k)``: ``d0 = lo - center + 0.5`` (so tap ``t``'s filter argument
    is ``(d0 + t) * inv``), the tap count ``hi - lo`` and the per-sample bound
    ``k = ceil(2 * support) + 1`` on it.
    """
    scale = tl.math.div_rn(tl.cast(length, tl.float32), tl.cast(out_len, tl.float32))
    support = tl.maximum(scale, 1.0)
    inv = tl.math.div_rn(1.0, support)
    center = scale * (o.to(tl.float32) + 0.5)
    lo = tl.maximum((center - support + 0.5).to(tl.int32), 0)
    hi = tl.minimum((center + support + 0.5).to(tl.int32), length)
    k = tl.ceil(2.0 * support).to(tl.int32) + 1
    return (lo.to(tl.float32) - center) + 0.5, inv, lo, hi - lo, k


@lazy_jit
def _aa_weight(t, tf, d0, inv, taps):
    """Unnormalised triangle weight of tap ``t`` (``tf``: ``t`` as float32) of each
    window: ``max(0, 1 - |(d0 + t) * inv|)``, and 0 from tap ``taps`` on."""
    w = tl.maximum(1.0 - tl.abs((d0 + tf) * inv), 0.0)
    return tl.where(t < taps, w, 0.0)



@lazy_jit(do_not_specialize=_RUNTIME_INTS)
def _resized_crop_kernel(
        in_ptr, out_ptr, rec_ptr, scale_ptr, bias_ptr, cmean_ptr, stats_ptr,
        H, W, OH, OW, total, tiles_x, tiles_per_sample,
        C: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, RAGGED: tl.constexpr,
        OPS: tl.constexpr, STATS: tl.constexpr, OUT_U8: tl.constexpr):
    n, oy, ox, pmask = tile_coords(OH, OW, tiles_x, tiles_per_sample, BLOCK_H, BLOCK_W)
    src, ih, iw = _sample_source(in_ptr, rec_ptr, n, H, W, total, C, RAGGED)
    top, left, bh, bw, flip_h, flip_v = load_box(rec_ptr, n)
    y0, y1, ly = _bilinear_axis(tl.where(flip_v, OH - 1 - oy, oy), OH, bh)  # [BLOCK_H, 1]
    x0, x1, lx = _bilinear_axis(tl.where(flip_h, OW - 1 - ox, ox), OW, bw)  # [1, BLOCK_W]
    r0 = clamp(top + y0, 0, ih - 1) * (iw * C)
    r1 = clamp(top + y1, 0, ih - 1) * (iw * C)
    c0 = clamp(left + x0, 0, iw - 1) * C
    c1 = clamp(left + x1, 0, iw - 1) * C
    wx0 = 1.0 - lx
    z = tl.full([BLOCK_H, BLOCK_W], 0.0, tl.float32)  # a builtin: see colour.tile_sum
    t0, t1, t2, t3 = _tap(src + (r0 + c0), wx0, z, z, z, z, C)
    t0, t1, t2, t3 = _tap(src + (r0 + c1), lx, t0, t1, t2, t3, C)
    b0, b1, b2, b3 = _tap(src + (r1 + c0), wx0, z, z, z, z, C)
    b0, b1, b2, b3 = _tap(src + (r1 + c1), lx, b0, b1, b2, b3, C)
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
    src, ih, iw = _sample_source(in_ptr, rec_ptr, n, H, W, total, C, RAGGED)
    top, left, bh, bw, flip_h, flip_v = load_box(rec_ptr, n)
    # Filter windows: rows are [BLOCK_H, 1], columns [1, BLOCK_W]; ky/kx are scalars.
    dy, inv_y, y_lo, ny, ky = _aa_axis(tl.where(flip_v, OH - 1 - oy, oy), OH, bh)
    dx, inv_x, x_lo, nx, kx = _aa_axis(tl.where(flip_h, OW - 1 - ox, ox), OW, bw)
    row0 = top + y_lo  # [BLOCK_H, 1]: first source row of each output row's window
    col0 = left + x_lo  # [1, BLOCK_W]
    z = tl.full([BLOCK_H, BLOCK_W], 0.0, tl.float32)  # a builtin: see colour.tile_sum
    a0, a1, a2, a3 = z, z, z, z
    # Columns outside, rows inside: a thread holds one row and several columns of the tile,
    # so the inner loop's row weight and offset cost one evaluation per thread and tap.
    # Weights are unnormalised here; the normalisation is one multiply after the loops, so
    # nothing computed outside the loops (in another register layout) is used inside.
    for tx in range(0, kx):
        wx = _aa_weight(tx, tl.cast(tx, tl.float32), dx, inv_x, nx)
        cptrs = src + clamp(col0 + tx, 0, iw - 1) * C  # [1, BLOCK_W]
        v0, v1, v2, v3 = z, z, z, z
        for ty in range(0, ky):
            wy = _aa_weight(ty, tl.cast(ty, tl.float32), dy, inv_y, ny)
            roff = clamp(row0 + ty, 0, ih - 1) * (iw * C)  # [BLOCK_H, 1]
            v0, v1, v2, v3 = _tap(cptrs + roff, wy, v0, v1, v2, v3, C)
        a0 = tl.fma(wx, v0, a0)
        a1 = tl.fma(wx, v1, a1)
        a2 = tl.fma(wx, v2, a2)
        a3 = tl.fma(wx, v3, a3)
    sum_y = dy * 0.0
    for t in range(0, ky):
        sum_y += _aa_weight(t, tl.cast(t, tl.float32), dy, inv_y, ny)
    sum_x = dx * 0.0
    for t in range(0, kx):
        sum_x += _aa_weight(t, tl.cast(t, tl.float32), dx, inv_x, nx)
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
