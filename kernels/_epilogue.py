"""The per-pixel tail every op shares: colour jitter, normalisation and the output cast.

Input is a float32 value ``v`` in 0..255 units (a copied pixel or a resampled one).

* jitter (only when brightness/contrast are given), per sample ``n``::

      u = min(v * (1/255) * brightness[n], 1)
      u = clamp(contrast[n] * u + (1 - contrast[n]) * contrast_mean[n], 0, 1)
      v = u * 255

  ``contrast_mean`` defaults to 0.5 (mid-grey) for every sample.
* uint8 output: ``clamp(floor(v + 0.5), 0, 255)``.
* float output: ``v * scale[c] + bias[c]`` with ``scale = 1 / (255 * std)`` and
  ``bias = -mean / std`` (mean 0, std 1 by default), i.e. ``(v / 255 - mean) / std``.

:class:`Epilogue` holds the validated device tensors; :func:`apply_torch` is the torch
reference and ``epilogue_tile`` the Triton helper the kernels call.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from dlpack_io.kernels._triton import lazy_jit
from dlpack_io.kernels._validate import OUT_DTYPES, DeferredChecks, check_vector, fail

tl = None  # bound to triton.language by lazy_jit on first launch

INV255 = 1.0 / 255.0
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class Epilogue:
    """Validated epilogue parameters, all on the device of the images."""

    out_dtype: torch.dtype
    scale: torch.Tensor  # (C,) float32
    bias: torch.Tensor  # (C,) float32
    brightness: Optional[torch.Tensor] = None  # (N,) float32, all three set or none
    contrast: Optional[torch.Tensor] = None
    contrast_mean: Optional[torch.Tensor] = None

    @property
    def has_jitter(self) -> bool:
        """True when brightness/contrast jitter is applied."""
        return self.brightness is not None


def make_epilogue(op: str, *, channels: int, n: int, device: torch.device, out_dtype: object,
                  mean, std, brightness, contrast, contrast_mean,
                  checks: DeferredChecks) -> Epilogue:
    """Validate the normalisation, jitter and dtype arguments of an op.

    Value checks on the jitter tensors are registered on ``checks`` (run by the caller).
    """
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
    scale, bias = _norm_tensors(mean_t, std_t, device)
    jitter = _jitter(op, n, device, brightness, contrast, contrast_mean, checks)
    return Epilogue(out_dtype, scale, bias, *jitter)


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


def _jitter(op: str, n: int, device: torch.device, brightness, contrast, contrast_mean,
            checks: DeferredChecks) -> tuple:
    """Validate the jitter tensors; fill the ones left out with their neutral value."""
    if brightness is None and contrast is None:
        if contrast_mean is not None:
            fail(op, "contrast_mean given without contrast")
        return None, None, None
    given = {"brightness": brightness, "contrast": contrast, "contrast_mean": contrast_mean}
    defaults = {"brightness": 1.0, "contrast": 1.0, "contrast_mean": 0.5}
    out = {}
    for name, value in given.items():
        if value is None:
            out[name] = torch.full((n,), defaults[name], dtype=torch.float32, device=device)
        else:
            out[name] = check_vector(op, name, value, n, device, FLOAT_DTYPES).float()
    for name in ("brightness", "contrast"):
        t = out[name]
        checks.add(lambda t=t: ~(t >= 0) | ~torch.isfinite(t),
                   lambda i, t=t, name=name: f"{name}[{i}] must be a finite factor >= 0, "
                                             f"got {float(t[i])}")
    m = out["contrast_mean"]
    checks.add(lambda: ~((m >= 0) & (m <= 1)),
               lambda i: f"contrast_mean[{i}] must be in [0, 1], got {float(m[i])}")
    return out["brightness"], out["contrast"], out["contrast_mean"]


def apply_torch(v: torch.Tensor, ep: Epilogue) -> torch.Tensor:
    """Torch reference of the epilogue on an (N, C, H, W) float32 tensor in 0..255."""
    if ep.has_jitter:
        b, c, m = (t.view(-1, 1, 1, 1) for t in (ep.brightness, ep.contrast, ep.contrast_mean))
        u = torch.clamp(v * INV255 * b, max=1.0)
        u = torch.clamp(c * u + (1.0 - c) * m, 0.0, 1.0)
        v = u * 255.0
    if ep.out_dtype == torch.uint8:
        return torch.clamp(torch.floor(v + 0.5), 0.0, 255.0).to(torch.uint8)
    out = v * ep.scale.view(1, -1, 1, 1) + ep.bias.view(1, -1, 1, 1)
    return out.to(ep.out_dtype)


def kernel_args(ep: Epilogue) -> tuple:
    """The epilogue pointers in kernel argument order (unused jitter slots get ``scale``)."""
    if ep.has_jitter:
        return ep.scale, ep.bias, ep.brightness, ep.contrast, ep.contrast_mean
    return ep.scale, ep.bias, ep.scale, ep.scale, ep.scale


@lazy_jit
def epilogue_tile(v, n, cols, scale_ptr, bias_ptr, bright_ptr, contrast_ptr, cmean_ptr,
                  C: tl.constexpr, HAS_JITTER: tl.constexpr, OUT_U8: tl.constexpr):
    """Triton twin of :func:`apply_torch` on a [BLOCK, CP] float32 tile of sample ``n``."""
    if HAS_JITTER:
        b = tl.load(bright_ptr + n)
        ct = tl.load(contrast_ptr + n)
        m = tl.load(cmean_ptr + n)
        u = tl.minimum(v * 0.00392156862745098 * b, 1.0)
        u = tl.minimum(tl.maximum(ct * u + (1.0 - ct) * m, 0.0), 1.0)
        v = u * 255.0
    if OUT_U8:
        out = tl.minimum(tl.maximum(tl.floor(v + 0.5), 0.0), 255.0).to(tl.uint8)
    else:
        cmask = cols < C
        scale = tl.load(scale_ptr + cols, mask=cmask, other=0.0)
        bias = tl.load(bias_ptr + cols, mask=cmask, other=0.0)
        out = v * scale[None, :] + bias[None, :]
    return out
