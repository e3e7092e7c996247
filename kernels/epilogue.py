"""The per-pixel tail every op shares: colour jitter, normalisation and the output cast.

The exact formulas are in docs/kernels.md (and in ``colour.py``: the torch maths and its
Triton twin). This module validates the arguments once for both backends:
:func:`make_epilogue` (normalisation, dtype, which jitter ops, contrast mean),
:func:`jitter_tensors` (the per-sample factor / order tensors of the keyword form) and
:func:`check_jitter_values` (their values, deferred to one device read). The torch
epilogue over a batch (``reference.finish``) lives with the other torch references.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from dlpack_io.kernels.checks import OUT_DTYPES, DeferredChecks, check_vector, fail
from dlpack_io.kernels.colour import BRIGHTNESS, CONTRAST, HUE, SATURATION
from dlpack_io.kernels.records import (
    IDENTITY_ORDER, JITTER_OPS, NEUTRAL_FACTORS, ORDER_SHIFTS, valid_order)

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
ORDER_DTYPES = (torch.int32, torch.int64, torch.uint8)
OP_BITS = dict(zip(JITTER_OPS, (BRIGHTNESS, CONTRAST, SATURATION, HUE)))
INV255 = 1.0 / 255.0
CHUNK_ELEMENTS = 1 << 19  # 2 MB of float32 per chunk (+ scratch planes): stays in cache


@dataclass(frozen=True)
class Epilogue:
    """Validated epilogue parameters, all on the device of the images."""

    out_dtype: torch.dtype
    scale: torch.Tensor  # (C,) float32: 1 / (255 * std)
    bias: torch.Tensor  # (C,) float32: -mean / std
    ops: int = 0  # enabled jitter ops (bits BRIGHTNESS | CONTRAST | SATURATION | HUE)
    contrast_mean: Optional[torch.Tensor] = None  # (N,) float32 from the caller, or None

    @property
    def has_jitter(self) -> bool:
        """True when any colour-jitter op is enabled."""
        return self.ops != 0

    @property
    def needs_stats(self) -> bool:
        """True when the contrast mean must be measured (contrast on, no mean given)."""
        return bool(self.ops & CONTRAST) and self.contrast_mean is None


def make_epilogue(op: str, *, channels: int, n: int, device: torch.device, out_dtype: object,
                  mean, std, ops: int, contrast_mean, checks: DeferredChecks) -> Epilogue:
    """Validate normalisation, output dtype, the enabled jitter ops and ``contrast_mean``."""
    if out_dtype not in OUT_DTYPES:
        fail(op, f"out_dtype must be one of {[str(d) for d in OUT_DTYPES]}, got {out_dtype!r}",
             TypeError)
    if (mean is None) != (std is None):
        fail(op, f"give mean and std together (got mean={mean!r}, std={std!r})")
    if mean is not None and out_dtype == torch.uint8:
        fail(op, "mean/std normalisation needs a float out_dtype (float16, bfloat16 or "
                 "float32); uint8 output cannot hold normalised values")
    mean_t = _per_channel(op, "mean", mean, channels, 0.0)
    std_t = _per_channel(op, "std", std, channels, 1.0)
    if not all(s > 0 and math.isfinite(s) for s in std_t):
        fail(op, f"std entries must be finite and > 0, got {std_t}")
    if not all(math.isfinite(m) for m in mean_t):
        fail(op, f"mean entries must be finite, got {mean_t}")
    if ops & (SATURATION | HUE) and channels not in (1, 3):
        fail(op, f"saturation and hue need 1 or 3 channels (as torchvision), got {channels}")
    if contrast_mean is not None:
        if not ops & CONTRAST:
            fail(op, "contrast_mean given without contrast")
        contrast_mean = check_vector(op, "contrast_mean", contrast_mean, n, device,
                                     FLOAT_DTYPES).float()
        m = contrast_mean
        checks.add(lambda: ~((m >= 0) & (m <= 1)),
                   lambda i: f"contrast_mean[{i}] must be in [0, 1], got {float(m[i])}")
    scale, bias = _norm_tensors(mean_t, std_t, device)
    return Epilogue(out_dtype, scale, bias, ops, contrast_mean)


def _per_channel(op: str, name: str, value, channels: int, default: float) -> tuple:
    """Turn mean/std (sequence or tensor of length C) into a tuple of floats."""
    if value is None:
        return (default,) * channels
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().flatten().tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        fail(op, f"{name} must be a sequence of {channels} numbers, got {value!r}", TypeError)
    if len(value) != channels:
        fail(op, f"{name} must have one entry per channel ({channels}), got {len(value)}: "
                 f"{tuple(value)!r}")
    try:
        return tuple(float(v) for v in value)
    except (TypeError, ValueError):
        fail(op, f"{name} must contain numbers, got {tuple(value)!r}", TypeError)


@functools.lru_cache(maxsize=64)
def _norm_tensors(mean: tuple, std: tuple, device: torch.device) -> tuple:
    """scale = 1/(255*std), bias = -mean/std as float32 device tensors (cached)."""
    scale = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float32)
    bias = torch.tensor([-m / s for m, s in zip(mean, std)], dtype=torch.float32)
    return scale.to(device), bias.to(device)


def jitter_tensors(op: str, n: int, device: torch.device, factors: dict,
                   order) -> tuple[int, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Check the keyword form: ``factors`` maps op name -> (N,) float tensor or None.

    Returns ``(ops, factors, order)``: the enabled-op bits, an ``(N, 4)`` float32 tensor
    (neutral 1, 1, 1, 0 in the columns of disabled ops) and the ``(N,)`` order codes
    (torchvision's order, brightness-contrast-saturation-hue, when ``order`` is None).
    """
    ops = 0
    cols = []
    for name, neutral in zip(JITTER_OPS, NEUTRAL_FACTORS):
        value = factors.get(name)
        if value is None:
            cols.append(torch.full((n,), neutral, dtype=torch.float32, device=device))
        else:
            cols.append(check_vector(op, name, value, n, device, FLOAT_DTYPES).float())
            ops |= OP_BITS[name]
    if order is not None:
        if not ops:
            fail(op, "order given without any jitter op (brightness, contrast, saturation, hue)")
        order = _order_codes(op, order, n, device)
    if not ops:
        return 0, None, None
    if order is None:
        order = torch.full((n,), IDENTITY_ORDER, dtype=torch.int32, device=device)
    return ops, torch.stack(cols, 1), order


def _order_codes(op: str, order, n: int, device: torch.device) -> torch.Tensor:
    """(N,) order codes, or (N, 4) permutations of the op ids (torchvision's ``fn_idx`` per
    sample) encoded on their device; out-of-range ids give an invalid code (checked)."""
    if isinstance(order, torch.Tensor) and order.dim() == 2:
        if order.shape != (n, 4):
            fail(op, f"order must have shape ({n},) (codes) or ({n}, 4) (permutations of "
                     f"0..3), got {tuple(order.shape)}")
        perms = check_vector(op, "order", order.reshape(-1), 4 * n, device,
                             ORDER_DTYPES + (torch.int8, torch.int16)).view(n, 4).long()
        codes = (perms.clamp(0, 3) << torch.tensor(ORDER_SHIFTS, device=device)).sum(1)
        return torch.where((perms < 0).any(1) | (perms > 3).any(1), -1, codes).to(torch.int32)
    return check_vector(op, "order", order, n, device, ORDER_DTYPES).to(torch.int32)


def jitter_names(op: str, jitter) -> int:
    """Enabled-op bits of the packed form's ``jitter=`` (names from ``JITTER_OPS``)."""
    if isinstance(jitter, str) or not isinstance(jitter, (tuple, list, set, frozenset)):
        fail(op, f"jitter must be a tuple of op names from {JITTER_OPS}, got {jitter!r}",
             TypeError)
    unknown = [j for j in jitter if j not in OP_BITS]
    if unknown:
        fail(op, f"jitter has unknown op names {unknown}; expected names from {JITTER_OPS}")
    return functools.reduce(lambda acc, name: acc | OP_BITS[name], jitter, 0)


def check_jitter_values(checks: DeferredChecks, ops: int, factors: torch.Tensor,
                        order: torch.Tensor) -> None:
    """Register value checks: factors finite and >= 0 (hue in [-0.5, 0.5]), valid orders."""
    for col, name in enumerate(JITTER_OPS):
        if not ops & OP_BITS[name]:
            continue
        t = factors[:, col]
        if name == "hue":
            checks.add(lambda t=t: ~((t >= -0.5) & (t <= 0.5)),
                       lambda i, t=t: f"hue[{i}] must be in [-0.5, 0.5], got {float(t[i])}")
        else:
            checks.add(lambda t=t: ~(t >= 0) | ~torch.isfinite(t),
                       lambda i, t=t, name=name: f"{name}[{i}] must be a finite factor >= 0, "
                                                 f"got {float(t[i])}")
    checks.add(lambda: ~valid_order(order),
               lambda i: f"order[{i}] = {int(order[i])} is not an order code: expected "
                         f"sum(perm[k] << 2k) for a permutation perm of 0..3 (encode_order)")
