"""torchvision's batch-level MixUp and CutMix (transforms.v2), labels as soft targets.

They act on the delivered batch (after the host->device copy for CUDA batches, so the mix
and the (B, num_classes) float32 targets are made on the device), as torchvision's reference
script applies them after its DataLoader. Both listed: one of them per batch, chosen with
even odds (the reference script's ``RandomChoice``). The random draws (the choice, lambda
~ Beta(alpha, alpha), CutMix's centre) are a pure function of (seed, epoch, the batch's
first planned sample index), so they do not depend on workers, ranks or resumes. Recipe
ops: imported only by a Loader whose transforms hold one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_TRIES = 32  # Marsaglia-Tsang accepts > 95% of tries: 32 failures never happen in practice
STREAM = 7   # the uniforms of a batch's mix (its choice, lambda, CutMix's centre)


def _check(name: str, alpha, num_classes) -> tuple[float, int | None]:
    alpha = float(alpha)
    if not alpha > 0 or not math.isfinite(alpha):
        raise ValueError(f"{name}: alpha={alpha} must be a positive number")
    if num_classes is not None and (int(num_classes) < 1 or int(num_classes) != num_classes):
        raise ValueError(f"{name}: num_classes={num_classes!r} must be a positive int, or None "
                         f"for the data set's number of classes")
    return alpha, None if num_classes is None else int(num_classes)


@dataclass(frozen=True)
class MixUp:
    """``x = lam * x + (1 - lam) * x.roll(1, 0)``, labels mixed alike as one-hot vectors;
    ``lam ~ Beta(alpha, alpha)`` per batch. Needs a float dtype."""

    alpha: float = 1.0
    num_classes: int | None = None
    role, stage, stream = "mix", 5, STREAM

    def __post_init__(self):
        a, n = _check("MixUp", self.alpha, self.num_classes)
        object.__setattr__(self, "alpha", a)
        object.__setattr__(self, "num_classes", n)


@dataclass(frozen=True)
class CutMix:
    """A box of the batch rolled by one pasted into each image, lambda corrected to the
    box's true area, labels mixed as one-hot vectors; ``lam ~ Beta(alpha, alpha)``."""

    alpha: float = 1.0
    num_classes: int | None = None
    role, stage, stream = "mix", 5, STREAM

    def __post_init__(self):
        a, n = _check("CutMix", self.alpha, self.num_classes)
        object.__setattr__(self, "alpha", a)
        object.__setattr__(self, "num_classes", n)


def _gamma(shape: float, u: np.ndarray) -> float:
    """A Gamma(shape, 1) variate from uniforms ``u`` (Marsaglia-Tsang; shape < 1 boosted
    by ``u[0] ** (1 / shape)``); needs 1 + 3 * _TRIES uniforms."""
    boost = 1.0
    if shape < 1.0:
        boost = float(u[0]) ** (1.0 / shape)
        shape += 1.0
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    for t in range(_TRIES):
        u1, u2, u3 = (float(v) for v in u[1 + 3 * t:4 + 3 * t])
        x = math.sqrt(-2.0 * math.log1p(-u1)) * math.cos(2.0 * math.pi * u2)
        v = (1.0 + c * x) ** 3
        if v > 0 and math.log1p(-u3) < 0.5 * x * x + d - d * v + d * math.log(v):
            return d * v * boost
    return d * boost  # unreachable in practice (probability < 1e-40): the mode, not a hang


def beta(alpha: float, u: np.ndarray) -> float:
    """Beta(alpha, alpha) from ``2 * (1 + 3 * _TRIES)`` uniforms."""
    half = 1 + 3 * _TRIES
    x, y = _gamma(alpha, u[:half]), _gamma(alpha, u[half:2 * half])
    return x / (x + y) if x + y > 0 else 0.5


def draw(mixes, draws, key: int):
    """(the chosen MixUp or CutMix, lam, (u_y, u_x) for CutMix's centre) of one batch."""
    u = draws(STREAM, [key], 3 + 2 * (1 + 3 * _TRIES))[0]
    chosen = mixes[min(int(u[0] * len(mixes)), len(mixes) - 1)]
    return chosen, beta(chosen.alpha, u[3:]), (float(u[1]), float(u[2]))


def cutmix_box(lam: float, centre, height: int, width: int) -> tuple[int, int, int, int]:
    """torchvision's CutMix box (x1, y1, x2, y2) for ``lam`` and a centre drawn as
    ``randint(W), randint(H)`` (here ``floor(u * W)``, ``floor(u * H)``)."""
    r_y, r_x = int(centre[0] * height), int(centre[1] * width)
    r = 0.5 * math.sqrt(1.0 - lam)
    r_w_half, r_h_half = int(r * width), int(r * height)
    return (max(r_x - r_w_half, 0), max(r_y - r_h_half, 0), min(r_x + r_w_half, width),
            min(r_y + r_h_half, height))


def mix_batch(mixes, draws, key: int, images, labels, num_classes: int):
    """(images, soft labels (B, num_classes) float32) of one batch, on the batch's device;
    ``key``: the batch's first planned sample index (what its draw is a function of)."""
    import torch

    chosen, lam, centre = draw(mixes, draws, key)
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"{type(chosen).__name__}: label {int(labels.max())} (or "
                         f"{int(labels.min())}) is outside num_classes={num_classes}: pass "
                         f"the data set's number of classes")
    if isinstance(chosen, MixUp):
        if not images.dtype.is_floating_point:
            raise TypeError(f"MixUp blends pixels: it needs a float dtype, not {images.dtype} "
                            f"(pass dtype=torch.float16 / float32, or Normalize)")
        images = images.roll(1, 0).mul_(1.0 - lam).add_(images.mul(lam))
    else:
        x1, y1, x2, y2 = cutmix_box(lam, centre, images.shape[-2], images.shape[-1])
        images[..., y1:y2, x1:x2] = images.roll(1, 0)[..., y1:y2, x1:x2]
        lam = 1.0 - (x2 - x1) * (y2 - y1) / (images.shape[-1] * images.shape[-2])
    soft = torch.nn.functional.one_hot(labels, num_classes).to(torch.float32)
    soft = soft.roll(1, 0).mul_(1.0 - lam).add_(soft.mul(lam))
    return images, soft
