"""Triton helpers of the resampling kernels: per-sample geometry, pixel gathers, weights.

Geometry of sample ``n``: dense batches use ``base = n * H * W * C`` and the batch's H, W;
ragged ones load ``offsets[n]`` (byte offset in the flat buffer), ``heights[n]`` and
``widths[n]``. All in-sample offsets are int32 (an image is < 2**31 bytes, checked on
the host); the batch/buffer offset is int64.
"""

from __future__ import annotations

from dlpack_io.kernels._triton import lazy_jit

tl = None  # bound to triton.language by lazy_jit on first launch


@lazy_jit
def sample_geometry(n, off_ptr, h_ptr, w_ptr, H, W, C: tl.constexpr, RAGGED: tl.constexpr):
    """``(base, height, width)`` of sample ``n``: int64 byte offset and int32 sizes."""
    if RAGGED:
        base = tl.load(off_ptr + n).to(tl.int64)
        ih = tl.load(h_ptr + n).to(tl.int32)
        iw = tl.load(w_ptr + n).to(tl.int32)
    else:
        base = n.to(tl.int64) * (H * W * C)
        ih = H + 0 * n
        iw = W + 0 * n
    return base, ih, iw


@lazy_jit
def load_box(box_ptr, fh_ptr, fv_ptr, n):
    """``(top, left, height, width, flip_h, flip_v)`` of sample ``n``."""
    top = tl.load(box_ptr + n * 4).to(tl.int32)
    left = tl.load(box_ptr + n * 4 + 1).to(tl.int32)
    bh = tl.load(box_ptr + n * 4 + 2).to(tl.int32)
    bw = tl.load(box_ptr + n * 4 + 3).to(tl.int32)
    return top, left, bh, bw, tl.load(fh_ptr + n) != 0, tl.load(fv_ptr + n) != 0


@lazy_jit
def gather(in_ptr, base, row, col, iw, pmask, cols, total,
           C: tl.constexpr, RAGGED: tl.constexpr):
    """Load the [pixels, CP] float32 tile at absolute (row, col) of one sample.

    ``row``/``col`` are already clamped into the image. For ragged input the flat index
    is also clamped into the buffer, so unchecked offsets cannot read out of memory.
    """
    start = base + ((row * iw + col) * C)
    if RAGGED:
        start = tl.minimum(tl.maximum(start, 0), total - C)
    mask = pmask[:, None] & (cols < C)[None, :]
    px = tl.load(in_ptr + start[:, None] + cols[None, :], mask=mask, other=0)
    return px.to(tl.float32)


@lazy_jit
def clamp(v, lo, hi):
    """``min(max(v, lo), hi)``."""
    return tl.minimum(tl.maximum(v, lo), hi)


@lazy_jit
def bilinear_axis(o, out_len, length):
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
def aa_axis(o, out_len, length):
    """Antialiased (PIL / torch ``antialias=True``) triangle-filter window along one axis.

    ``scale = length / out_len``; ``support = max(scale, 1)``; ``inv = 1 / max(scale, 1)``;
    ``center = scale * (o + 0.5)``; taps ``lo <= j < hi`` with ``lo = max(int(center -
    support + 0.5), 0)``, ``hi = min(int(center + support + 0.5), length)``; returns also
    the per-sample tap-count bound ``k = ceil(2 * support) + 1``.
    """
    scale = tl.math.div_rn(tl.cast(length, tl.float32), tl.cast(out_len, tl.float32))
    support = tl.maximum(scale, 1.0)
    inv = tl.math.div_rn(1.0, support)
    center = scale * (o.to(tl.float32) + 0.5)
    lo = tl.maximum((center - support + 0.5).to(tl.int32), 0)
    hi = tl.minimum((center + support + 0.5).to(tl.int32), length)
    k = tl.ceil(2.0 * support).to(tl.int32) + 1
    return center, inv, lo, hi, k


@lazy_jit
def aa_weight(j, center, inv, hi):
    """Unnormalised triangle weight of tap ``j`` (zero at and beyond ``hi``)."""
    w = tl.maximum(1.0 - tl.abs((j.to(tl.float32) - center + 0.5) * inv), 0.0)
    return tl.where(j < hi, w, 0.0)
