"""Triton helpers of the resampling kernels: per-sample geometry, pixel taps, weights.

Geometry of sample ``n`` comes from its record (``records.py``): dense batches use
``base = n * H * W * C`` and the batch's H, W; ragged ones the record's offset, height and
width. The sample is then addressed through one pointer ``in_ptr + base`` (int64 maths once
per program) plus int32 offsets inside the sample (an image is < 2**31 bytes, checked on the
host, and re-checked here for ragged records so that an unvalidated bad record cannot make
a read leave the buffer).
"""

from __future__ import annotations

from dlpack_io.kernels._triton import lazy_jit

tl = None  # bound to triton.language by lazy_jit on first launch


@lazy_jit
def sample_source(in_ptr, rec_ptr, n, H, W, total, C: tl.constexpr, RAGGED: tl.constexpr):
    """``(src, height, width)``: pointer to sample ``n``'s first byte and its int32 size.

    A ragged record that does not fit the buffer (only possible with validate=False)
    reads pixel 0 of the buffer as a 1x1 image instead.
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
def load_box(rec_ptr, n):
    """``(top, left, height, width, flip_h, flip_v)`` of sample ``n``'s record."""
    rec = rec_ptr + n * 16
    flags = tl.load(rec + 4)
    return (tl.load(rec), tl.load(rec + 1), tl.load(rec + 2), tl.load(rec + 3),
            (flags & 1) != 0, (flags & 2) != 0)


@lazy_jit
def u8_to_f32(x):
    """Exact uint8 -> float32 without a conversion instruction (those run at 1/8 of the
    FP32 rate on sm_80/sm_90): ``2**23 + x`` built from its bits, minus ``2**23``."""
    return (x.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@lazy_jit
def tap(ptrs, w, a0, a1, a2, a3, C: tl.constexpr):
    """``a += w * pixel`` (one fused multiply-add) for every channel of the pixels whose
    first byte is at ``ptrs``."""
    a0 = tl.fma(w, u8_to_f32(tl.load(ptrs)), a0)
    if C > 1:
        a1 = tl.fma(w, u8_to_f32(tl.load(ptrs + 1)), a1)
    if C > 2:
        a2 = tl.fma(w, u8_to_f32(tl.load(ptrs + 2)), a2)
    if C > 3:
        a3 = tl.fma(w, u8_to_f32(tl.load(ptrs + 3)), a3)
    return a0, a1, a2, a3


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
def aa_weight(t, tf, d0, inv, taps):
    """Unnormalised triangle weight of tap ``t`` (``tf``: ``t`` as float32) of each
    window: ``max(0, 1 - |(d0 + t) * inv|)``, and 0 from tap ``taps`` on."""
    w = tl.maximum(1.0 - tl.abs((d0 + tf) * inv), 0.0)
    return tl.where(t < taps, w, 0.0)
