"""Colour maths of the shared epilogue, the torch reference and its Triton twin side by side.

Torch (float chunks ``(k, C, H, W)`` in [0, 1], in place, vectorised over the batch):
:func:`apply_op` runs one of torchvision's ColorJitter ops (brightness, contrast, saturation,
hue); :func:`gray` and :func:`hue_` are its building blocks. The Triton twins (``clamp01``,
``gray3``, ``blend``, ``hue3``, ``jitter``, ``epilogue``) perform the same float32
operations in the same order; docs/kernels.md states the formulas. :mod:`epilogue` drives
the torch side over a whole batch, the kernels call :func:`epilogue` on each tile.

Hue on the torch side: RGB -> HSV performs torchvision's ``_rgb_to_hsv`` float32 operations
in order, but branch-free: each ``where`` / boolean mask becomes a 0/1 float mask built with
``sign`` (selections stay exact: products with 0 or 1, sums with zeros), because torch's CPU
``where`` and comparisons run many times slower than arithmetic. HSV -> RGB is the
sector-free formula in :func:`hue_`. Every intermediate lives in preallocated scratch planes
(``out=`` / in-place ops): fresh allocations of this size page-fault on every call.

Triton side: the kernels hold one ``[BLOCK_H, BLOCK_W]`` float32 tile per channel (``x0..x3``,
in 0..255 units; the unused ones are dead code for ``C < 4``), so channel-mixing ops
(grayscale, HSV) are element-wise and need no layout change. Per-sample factors and the
order code come from the sample's record (``records.py``); ``OPS`` (bits 1 brightness,
2 contrast, 4 saturation, 8 hue) selects the enabled ops at compile time and the order code
picks, at run time and uniformly per program, which op runs at each of the four steps.
Triton kernels read no plain module constants, so the twins spell the numbers out.
"""

from __future__ import annotations

from typing import Optional

import torch

from dlpack_io.kernels.launch import lazy_jit

tl = None  # bound to triton.language by lazy_jit on first launch

GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
BRIGHTNESS, CONTRAST, SATURATION, HUE = 1, 2, 4, 8  # bits of ``ops``, by torchvision op id
SCRATCH_PLANES = 10  # (k, H, W) float32 planes hue_ needs


def apply_op(op: int, x: torch.Tensor, f: torch.Tensor, mean: Optional[torch.Tensor],
           sc: list) -> None:
    """Apply one jitter op in place to a float chunk ``x`` in [0, 1] (``sc``: scratch)."""
    col = {BRIGHTNESS: 0, CONTRAST: 1, SATURATION: 2, HUE: 3}[op]
    factor = f[:, col].reshape(-1, 1, 1, 1)
    if op == BRIGHTNESS:  # adjust_brightness: clamp(b * x, 0, 1)
        x.mul_(factor).clamp_(0.0, 1.0)
    elif op == CONTRAST:  # adjust_contrast: blend with the mean grayscale of the sample
        if mean is None:
            g = gray(x, sc[0], sc[1]) if x.shape[1] == 3 else x
            mean = g.mean(dim=tuple(range(1, g.dim())))
        _blend_(x, (mean.reshape(-1, 1, 1, 1) * (1.0 - factor)), factor)
    elif x.shape[1] == 3 and op == SATURATION:  # adjust_saturation: blend with grayscale
        g = gray(x, sc[0], sc[1])
        _blend_(x, g.mul_((1.0 - factor).view(-1, 1, 1)).unsqueeze(1), factor)
    elif x.shape[1] == 3:  # HUE
        hue_(x, factor, sc)


def _blend_(x: torch.Tensor, other_part: torch.Tensor, ratio: torch.Tensor) -> None:
    """torchvision ``_blend``: ``clamp(x * ratio + other * (1 - ratio), 0, 1)``, in place;
    ``other_part`` is ``other * (1 - ratio)``, already multiplied."""
    x.mul_(ratio).add_(other_part).clamp_(0.0, 1.0)


def gray(x: torch.Tensor, out: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """``(0.2989 R + 0.587 G) + 0.114 B`` of a ``(k, 3, H, W)`` chunk into the plane ``out``
    (torchvision's weights; ``tmp``: a scratch plane)."""
    torch.mul(x[:, 0], GRAY[0], out=out)
    out.add_(torch.mul(x[:, 1], GRAY[1], out=tmp))
    return out.add_(torch.mul(x[:, 2], GRAY[2], out=tmp))


def hue_(x: torch.Tensor, hue: torch.Tensor, sc: list) -> None:
    """Shift the hue of an ``(k, 3, H, W)`` chunk in place; ``hue``: ``(k, 1, 1, 1)``;
    ``sc``: ``SCRATCH_PLANES`` contiguous ``(k, H, W)`` float32 planes.

    HSV -> RGB uses the sector-free form ``c_n = v * (1 - s * clamp(min(k, 4 - k), 0, 1))``
    with ``k = (n + 6 h) mod 6`` and ``n = 5, 3, 1`` for R, G, B: the same values as
    torchvision's sector table (``v, p = v (1 - s), q = v (1 - s f), t``) up to float
    rounding of ``f`` (<= 2.4e-7), with no selection at all.
    """
    v, mn, s, h, ar, ag, ab, mr, mg, t = sc
    _rgb_to_hsv(x, v, mn, s, h, ar, ag, ab, mr, mg, t)
    h.add_(hue.view(-1, 1, 1))
    h.sub_(torch.floor(h, out=t))  # remainder(h + hue, 1): exact for h + hue in [-0.5, 1.5)
    h.mul_(6.0)
    for channel, n in enumerate((5.0, 3.0, 1.0)):
        k = torch.add(h, n, out=ar)
        k.sub_(torch.floor(k, out=t).sub_(5.0).clamp_(0.0, 1.0).mul_(6.0))  # mod 6
        torch.minimum(k, torch.neg(k, out=t).add_(4.0), out=k).clamp_(0.0, 1.0)
        x[:, channel].copy_(k.mul_(s).neg_().add_(1.0).mul_(v))


def _rgb_to_hsv(x, v, mn, s, h, ar, ag, ab, mr, mg, t) -> None:
    """torchvision ``_rgb_to_hsv`` into ``h``, ``s``, ``v`` (the rest is scratch)."""
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    torch.maximum(torch.maximum(r, g, out=v), b, out=v)
    torch.minimum(torch.minimum(r, g, out=mn), b, out=mn)
    cr = mn.neg_().add_(v)  # max - min
    eqc = torch.sign(cr, out=t).neg_().add_(1.0)  # 1.0 where max == min (cr >= 0)
    torch.add(v, eqc, out=s)
    torch.div(cr, s, out=s)  # cr == 0 where eqc: any non-zero divisor gives torchvision's 0
    crd = cr.add_(eqc)
    rc, gc, bc = torch.sub(v, r, out=ar), torch.sub(v, g, out=ag), torch.sub(v, b, out=ab)
    is_r = torch.sign(rc, out=mr).neg_().add_(1.0)  # before the division: sign of max - r
    is_g = torch.sign(gc, out=mg).neg_().add_(1.0).mul_(torch.neg(is_r, out=t).add_(1.0))
    rc.div_(crd)
    gc.div_(crd)
    bc.div_(crd)
    is_b = t.sub_(is_g)  # 1 - is_r - is_g
    # h = is_r * (bc - gc) + is_g * ((rc + 2) - bc) + is_b * ((gc + 4) - rc)
    torch.sub(bc, gc, out=h).mul_(is_r)
    h.add_(torch.add(rc, 2.0, out=crd).sub_(bc).mul_(is_g))
    h.add_(gc.add_(4.0).sub_(rc).mul_(is_b))
    h.mul_(1.0 / 6.0).add_(1.0)
    h.sub_(torch.floor(h, out=t))  # fmod(h, 1) for h >= 0


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
    """``v * (1 - s * clamp(min(k, 4 - k), 0, 1))``, ``k = (n + h6) mod 6`` (see :func:`hue_`)."""
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
    return tile_sum(tl.where(pmask, g, 0.0))


@lazy_jit
def _add(a, b):
    return a + b


@lazy_jit
def tile_sum(x):
    """The sum of a 2-D tile, as a scalar.

    ``tl.reduce`` with our own combine function, not ``tl.sum`` (nor ``tl.zeros``): since
    triton 3.9 those are ``@jit`` functions of triton's standard library, made interpretable
    only when triton is first imported with TRITON_INTERPRET=1; a process that imported
    triton before setting it (the test suite, a notebook) could not run the kernels under
    the interpreter. Builtins such as ``tl.reduce`` and ``tl.full`` have no such condition.
    """
    return tl.reduce(tl.reduce(x, 1, _add), 0, _add)


@lazy_jit
def jitter(u0, u1, u2, u3, n, rec_ptr, cmean_ptr, pmask, C: tl.constexpr,
           OPS: tl.constexpr, STATS: tl.constexpr):
    """Apply the enabled ops in the sample's order to channel tiles in [0, 1].

    Returns the four tiles and, with ``STATS``, the tile's contrast-mean partial sum
    (of the image as it is when contrast comes in the order).
    """
    rec = rec_ptr + n * 16
    code = tl.load(rec + 5)
    gsum = tile_sum(tl.full(u0.shape, 0.0, tl.float32))  # builtins only: see tile_sum
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
