"""Triton twin of ``_colour.py``: colour jitter, normalisation, cast and the NCHW stores.

The kernels hold one ``[BLOCK_H, BLOCK_W]`` float32 tile per channel (``x0..x3``, in 0..255
units; the unused ones are dead code for ``C < 4``), so channel-mixing ops (grayscale, HSV)
are element-wise and need no layout change. Per-sample factors and the order code come from
the sample's record (``records.py``); ``OPS`` (bits 1 brightness, 2 contrast, 4 saturation,
8 hue) selects the enabled ops at compile time and the order code picks, at run time and
uniformly per program, which op runs at each of the four steps.
"""

from __future__ import annotations

from dlpack_io.kernels._triton import lazy_jit

tl = None  # bound to triton.language by lazy_jit on first launch


@lazy_jit
def clamp01(x):
    """``min(max(x, 0), 1)``."""
    return tl.minimum(tl.maximum(x, 0.0), 1.0)


@lazy_jit
def gray3(r, g, b):
    """torchvision's grayscale ``0.2989 R + 0.587 G + 0.114 B`` (left to right)."""
    return (r * 0.2989 + g * 0.587) + b * 0.114


@lazy_jit
def blend(x, other, ratio):
    """torchvision ``_blend``: ``clamp(x * ratio + other * (1 - ratio), 0, 1)``."""
    return clamp01(x * ratio + other * (1.0 - ratio))


@lazy_jit
def hue3(r, g, b, hue):
    """torchvision ``adjust_hue`` of one pixel tile: RGB -> HSV, shift, HSV -> RGB."""
    maxc = tl.maximum(tl.maximum(r, g), b)
    minc = tl.minimum(tl.minimum(r, g), b)
    eqc = maxc == minc
    cr = maxc - minc
    s = tl.math.div_rn(cr, tl.where(eqc, 1.0, maxc))
    crd = tl.where(eqc, 1.0, cr)
    rc = tl.math.div_rn(maxc - r, crd)
    gc = tl.math.div_rn(maxc - g, crd)
    bc = tl.math.div_rn(maxc - b, crd)
    h = tl.where(maxc == r, bc - gc, tl.where(maxc == g, (rc + 2.0) - bc, (gc + 4.0) - rc))
    h = h * 0.16666666666666666 + 1.0
    h = h - tl.floor(h)  # fmod(h, 1), h >= 0
    h = h + hue
    h = h - tl.floor(h)  # remainder(h, 1)
    h6 = h * 6.0
    r = hsv_channel(h6, s, maxc, 5.0)
    g = hsv_channel(h6, s, maxc, 3.0)
    b = hsv_channel(h6, s, maxc, 1.0)
    return r, g, b


@lazy_jit
def hsv_channel(h6, s, v, n):
    """``v * (1 - s * clamp(min(k, 4 - k), 0, 1))``, ``k = (n + h6) mod 6`` (see ``_hue.py``)."""
    k = h6 + n
    k = k - tl.minimum(tl.maximum(tl.floor(k) - 5.0, 0.0), 1.0) * 6.0
    a = tl.minimum(tl.maximum(tl.minimum(k, 4.0 - k), 0.0), 1.0)
    return (1.0 - a * s) * v


@lazy_jit
def tile_gray_sum(u0, u1, u2, u3, pmask, C: tl.constexpr):
    """Sum over the in-bounds pixels of gray (3 channels) or of all channels (others)."""
    if C == 3:
        g = gray3(u0, u1, u2)
    else:
        g = u0
        if C > 1:
            g = g + u1
        if C > 2:
            g = g + u2
        if C > 3:
            g = g + u3
    return tl.sum(tl.sum(tl.where(pmask, g, 0.0), axis=1), axis=0)


@lazy_jit
def jitter(u0, u1, u2, u3, n, rec_ptr, cmean_ptr, pmask, C: tl.constexpr,
           OPS: tl.constexpr, STATS: tl.constexpr):
    """Apply the enabled ops in the sample's order to channel tiles in [0, 1].

    Returns the four tiles and, with ``STATS``, the tile's contrast-mean partial sum
    (of the image as it is when contrast comes in the order).
    """
    rec = rec_ptr + n * 16
    code = tl.load(rec + 5)
    gsum = tl.sum(tl.sum(tl.zeros_like(u0), axis=1), axis=0)
    for k in tl.static_range(4):
        op = (code >> (2 * k)) & 3
        if OPS & 1:
            if op == 0:
                fb = tl.load(rec + 12).to(tl.float32, bitcast=True)
                u0 = clamp01(u0 * fb)
                u1 = clamp01(u1 * fb)
                u2 = clamp01(u2 * fb)
                u3 = clamp01(u3 * fb)
        if OPS & 2:
            if op == 1:
                if STATS:
                    gsum = tile_gray_sum(u0, u1, u2, u3, pmask, C)
                else:
                    fc = tl.load(rec + 13).to(tl.float32, bitcast=True)
                    m = tl.load(cmean_ptr + n)
                    u0 = blend(u0, m, fc)
                    u1 = blend(u1, m, fc)
                    u2 = blend(u2, m, fc)
                    u3 = blend(u3, m, fc)
        if C == 3:
            if OPS & 4:
                if op == 2:
                    fs = tl.load(rec + 14).to(tl.float32, bitcast=True)
                    g = gray3(u0, u1, u2)
                    u0 = blend(u0, g, fs)
                    u1 = blend(u1, g, fs)
                    u2 = blend(u2, g, fs)
            if OPS & 8:
                if op == 3:
                    fh = tl.load(rec + 15).to(tl.float32, bitcast=True)
                    u0, u1, u2 = hue3(u0, u1, u2, fh)
    return u0, u1, u2, u3, gsum


@lazy_jit
def store_channel(out_ptr, v, ch: tl.constexpr, n, offs, pmask, plane, scale_ptr, bias_ptr,
                  C: tl.constexpr, OUT_U8: tl.constexpr, RAW: tl.constexpr):
    """Cast (or normalise) one channel tile and store it to plane ``ch`` of sample ``n``."""
    dst = out_ptr + n.to(tl.int64) * (C * plane) + ch * plane
    if RAW:
        val = v
    elif OUT_U8:
        val = tl.minimum(tl.maximum(tl.floor(v + 0.5), 0.0), 255.0)
    else:
        val = v * tl.load(scale_ptr + ch) + tl.load(bias_ptr + ch)
    tl.store(dst + offs, val.to(out_ptr.dtype.element_ty), mask=pmask)


@lazy_jit
def epilogue(out_ptr, x0, x1, x2, x3, n, oy, ox, pmask, OH, OW, rec_ptr, scale_ptr, bias_ptr,
             cmean_ptr, stats_ptr, C: tl.constexpr, OPS: tl.constexpr, STATS: tl.constexpr,
             OUT_U8: tl.constexpr, RAW: tl.constexpr):
    """Jitter, normalise/cast and store a tile (``STATS``: store its contrast partial sum).

    ``RAW``: the tiles are the loaded uint8 pixels and are stored unchanged.
    """
    if OPS != 0:
        u0, u1, u2, u3, gsum = jitter(x0 * 0.00392156862745098, x1 * 0.00392156862745098,
                                      x2 * 0.00392156862745098, x3 * 0.00392156862745098,
                                      n, rec_ptr, cmean_ptr, pmask, C, OPS, STATS)
        if STATS:
            tl.store(stats_ptr + tl.program_id(0), gsum)
        x0 = u0 * 255.0
        x1 = u1 * 255.0
        x2 = u2 * 255.0
        x3 = u3 * 255.0
    if not STATS:
        plane = OH * OW
        offs = oy * OW + ox
        store_channel(out_ptr, x0, 0, n, offs, pmask, plane, scale_ptr, bias_ptr, C, OUT_U8, RAW)
        if C > 1:
            store_channel(out_ptr, x1, 1, n, offs, pmask, plane, scale_ptr, bias_ptr, C, OUT_U8,
                          RAW)
        if C > 2:
            store_channel(out_ptr, x2, 2, n, offs, pmask, plane, scale_ptr, bias_ptr, C, OUT_U8,
                          RAW)
        if C > 3:
            store_channel(out_ptr, x3, 3, n, offs, pmask, plane, scale_ptr, bias_ptr, C, OUT_U8,
                          RAW)
