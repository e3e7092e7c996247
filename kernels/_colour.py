"""Torch reference of the shared epilogue: colour jitter (torchvision's ColorJitter maths on
float images in [0, 1]), normalisation and the output cast, vectorised over the batch.

Every formula here has a Triton twin in ``_colour_tl.py`` that performs the same float32
operations in the same order; docs/kernels.md states them. The batch is processed in
chunks of whole samples (about ``CHUNK_ELEMENTS`` floats) that stay in the CPU caches, with
samples grouped by their jitter order, so each chunk runs one op sequence in place.
"""

from __future__ import annotations

from typing import Optional

import torch

from dlpack_io.kernels.records import decode_order

INV255 = 1.0 / 255.0
GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
BRIGHTNESS, CONTRAST, SATURATION, HUE = 1, 2, 4, 8  # bits of ``ops``, by torchvision op id
CHUNK_ELEMENTS = 1 << 20  # ~4 MB of float32 per chunk: fits the L2/L3 caches


def finish(v: torch.Tensor, *, out_dtype: torch.dtype, scale: torch.Tensor, bias: torch.Tensor,
           ops: int = 0, factors: Optional[torch.Tensor] = None,
           order: Optional[torch.Tensor] = None, contrast_mean: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Epilogue of an ``(N, C, H, W)`` batch ``v`` (uint8, or float32 in 0..255 units).

    ``factors``: ``(N, 4)`` float32 brightness, contrast, saturation, hue (only the
    columns of the ops in ``ops`` are read); ``order``: ``(N,)`` order codes;
    ``contrast_mean``: ``(N,)`` float32 to use instead of the computed mean. Writes into
    ``out`` when given (same shape, ``out_dtype``), else into a new tensor.
    """
    n, c, h, w = v.shape
    if out is None:
        out = torch.empty((n, c, h, w), dtype=out_dtype, device=v.device)
    if n == 0:
        return out
    if not ops and v.dtype == torch.uint8 and out_dtype == torch.uint8:
        return out.copy_(v)
    per = max(1, CHUNK_ELEMENTS // (c * h * w))
    buf = torch.empty((min(per, n), c, h, w), dtype=torch.float32, device=v.device)
    scale4, bias4 = scale.view(1, -1, 1, 1), bias.view(1, -1, 1, 1)
    for idx, steps in _chunks(n, per, ops, order):
        x = buf[:_length(idx)]
        x.copy_(v[idx])
        if ops:
            x.mul_(INV255)
            for op in steps:
                _apply(op, x, factors[idx], None if contrast_mean is None else contrast_mean[idx])
            x.mul_(255.0)
        if out_dtype == torch.uint8:
            x.add_(0.5).floor_().clamp_(0.0, 255.0)
        else:
            x.mul_(scale4).add_(bias4)
        _put(out, idx, x)
    return out


def _length(idx) -> int:
    return idx.stop - idx.start if isinstance(idx, slice) else idx.numel()


def _put(out: torch.Tensor, idx, x: torch.Tensor) -> None:
    if isinstance(idx, slice):
        out[idx].copy_(x)
    else:
        out.index_copy_(0, idx, x.to(out.dtype))


def _chunks(n: int, per: int, ops: int, order: Optional[torch.Tensor]):
    """Yield ``(index, op sequence)``: slices of ``per`` samples when every sample has the
    same order, else runs of equal order codes (samples sorted by code), split by ``per``."""
    def enabled(code: int) -> list[int]:
        fields = decode_order(torch.tensor([code]))[0].tolist()
        return [1 << op for op in fields if ops & (1 << op)]

    codes = order.to(torch.int64).cpu() if (ops and order is not None) else None
    if codes is None or bool((codes == codes[0]).all()):
        steps = enabled(int(codes[0])) if codes is not None else enabled(0b11100100)
        for start in range(0, n, per):
            yield slice(start, min(start + per, n)), steps
        return
    sorted_codes, perm = torch.sort(codes, stable=True)
    values, counts = torch.unique_consecutive(sorted_codes, return_counts=True)
    start = 0
    for code, count in zip(values.tolist(), counts.tolist()):
        steps = enabled(code)
        for s in range(start, start + count, per):
            yield perm[s:min(s + per, start + count)].to(order.device), steps
        start += count


def _apply(op: int, x: torch.Tensor, f: torch.Tensor, mean: Optional[torch.Tensor]) -> None:
    """Apply one jitter op in place to a float chunk ``x`` in [0, 1]."""
    col = {BRIGHTNESS: 0, CONTRAST: 1, SATURATION: 2, HUE: 3}[op]
    factor = f[:, col].view(-1, 1, 1, 1)
    if op == BRIGHTNESS:  # adjust_brightness: clamp(b * x, 0, 1)
        x.mul_(factor).clamp_(0.0, 1.0)
    elif op == CONTRAST:  # adjust_contrast: blend with the mean grayscale of the sample
        m = gray_mean(x) if mean is None else mean.view(-1, 1, 1, 1)
        _blend_(x, m, factor)
    elif x.shape[1] == 3 and op == SATURATION:  # adjust_saturation: blend with grayscale
        _blend_(x, gray(x), factor)
    elif x.shape[1] == 3:  # HUE
        hue_(x, factor)


def _blend_(x: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor) -> None:
    """torchvision ``_blend``: ``clamp(x * ratio + other * (1 - ratio), 0, 1)``, in place."""
    x.mul_(ratio).add_(other * (1.0 - ratio)).clamp_(0.0, 1.0)


def gray(x: torch.Tensor) -> torch.Tensor:
    """``0.2989 R + 0.587 G + 0.114 B`` as ``(N, 1, H, W)`` (torchvision's weights)."""
    g = x[:, 0:1] * GRAY[0]
    g += x[:, 1:2] * GRAY[1]
    g += x[:, 2:3] * GRAY[2]
    return g


def gray_mean(x: torch.Tensor) -> torch.Tensor:
    """Per-sample contrast mean, ``(N, 1, 1, 1)``: mean of ``gray(x)`` for 3 channels,
    else the mean over all channels (torchvision ``adjust_contrast``)."""
    g = gray(x) if x.shape[1] == 3 else x
    return g.mean(dim=(1, 2, 3), keepdim=True)


def hue_(x: torch.Tensor, hue: torch.Tensor) -> None:
    """torchvision ``adjust_hue`` on float RGB in [0, 1]: RGB -> HSV, ``h = (h + hue) mod 1``,
    HSV -> RGB, in place (``hue``: ``(N, 1, 1, 1)``)."""
    h, s, v = _rgb_to_hsv(x)
    h.add_(hue.view(-1, 1, 1))
    h.sub_(torch.floor(h))  # remainder(h + hue, 1): exact for h + hue in [-0.5, 1.5)
    h6 = h.mul_(6.0)
    i = torch.floor(h6)
    f = h6.sub_(i)
    sxf = s * f
    oms = torch.sub(1.0, s)
    q = torch.sub(1.0, sxf).mul_(v).clamp_(0.0, 1.0)
    t = sxf.add_(oms).mul_(v).clamp_(0.0, 1.0)
    p = oms.mul_(v).clamp_(0.0, 1.0)
    i = torch.where(i >= 6.0, i - 6.0, i)  # h rounded up to 1.0 is sector 0
    e0, e1, e2, e3, e4 = (i == 0), (i == 1), (i == 2), (i == 3), (i == 4)
    # torchvision's table: r = v q p p t v, g = t v v q p p, b = p p t v v q (sector 0..5)
    x[:, 0] = torch.where(e0 | (i == 5), v, torch.where(e1, q, torch.where(e4, t, p)))
    x[:, 1] = torch.where(e1 | e2, v, torch.where(e0, t, torch.where(e3, q, p)))
    x[:, 2] = torch.where(e3 | e4, v, torch.where(e2, t, torch.where(i == 5, q, p)))


def _rgb_to_hsv(x: torch.Tensor) -> tuple:
    """torchvision ``_rgb_to_hsv``: ``(h, s, v)`` planes of ``(N, 3, H, W)`` float RGB."""
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    maxc = torch.maximum(torch.maximum(r, g), b)
    minc = torch.minimum(torch.minimum(r, g), b)
    eqc = maxc == minc
    cr = maxc - minc
    s = cr / torch.where(eqc, 1.0, maxc)
    crd = torch.where(eqc, 1.0, cr)
    rc, gc, bc = (maxc - r) / crd, (maxc - g) / crd, (maxc - b) / crd
    max_r, max_g = maxc == r, maxc == g
    h = torch.where(max_r, bc - gc,
                    torch.where(max_g, (rc + 2.0) - bc, (gc + 4.0) - rc))
    h = h.mul_(1.0 / 6.0).add_(1.0)
    h.sub_(torch.floor(h))  # fmod(h, 1) for h >= 0
    return h, s, maxc
