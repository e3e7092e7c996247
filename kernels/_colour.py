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

from dlpack_io.kernels._hue import SCRATCH_PLANES, hue_
from dlpack_io.kernels.records import decode_order

INV255 = 1.0 / 255.0
GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
BRIGHTNESS, CONTRAST, SATURATION, HUE = 1, 2, 4, 8  # bits of ``ops``, by torchvision op id
CHUNK_ELEMENTS = 1 << 19  # 2 MB of float32 per chunk (+ scratch planes): stays in cache


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
    per = min(n, max(1, CHUNK_ELEMENTS // (c * h * w)))
    buf = torch.empty((per, c, h, w), dtype=torch.float32, device=v.device)
    planes = torch.empty((SCRATCH_PLANES if ops else 0, per, h, w), dtype=torch.float32,
                         device=v.device)
    scale4, bias4 = scale.view(1, -1, 1, 1), bias.view(1, -1, 1, 1)
    for idx, steps in _chunks(n, per, ops, order):
        k = _length(idx)
        x = buf[:k]
        x.copy_(v[idx] if isinstance(idx, slice) else torch.index_select(v, 0, idx))
        if ops:
            sc = [p[:k] for p in planes]
            means = None if contrast_mean is None else contrast_mean[idx]
            x.mul_(INV255)
            for op in steps:
                _apply(op, x, factors[idx], means, sc)
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


def _apply(op: int, x: torch.Tensor, f: torch.Tensor, mean: Optional[torch.Tensor],
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
