"""Transforms with torchvision's names and meanings, declared once, fused by the Loader.

    transforms=[RandomResizedCrop(224), RandomHorizontalFlip(),
                ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
                Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))]

The objects here only *describe* a transform; :func:`dlpack_io.reader.batch.plan.compile_spec`
checks the list once and turns it into a ``TransformSpec`` whose random parameters are
drawn per batch as a pure function of (seed, epoch, sample index). The pixels are then made
in one pass: a crop or resized crop with flips (C/PIL on the host, or one Triton kernel on the
GPU), followed by one shared epilogue (colour jitter, normalisation, cast) whose maths live
in ``dlpack_io.kernels`` only.

Geometry (geometry.py; at most one of each, in this order):
  * :class:`Resize`: shorter side to ``size`` (or an exact ``(h, w)``; ``max_size`` caps the
    longer side), antialiased bilinear; alone (int size) only with ``Loader(pad=True)``;
    followed by :class:`CenterCrop` or :class:`RandomCrop` it crops the resized image.
  * :class:`RandomResizedCrop`: torchvision's box sampling, resized to ``size``.
  * :class:`RandomCrop` / :class:`CenterCrop`: a ``size`` box (no padding).
Then, in any order (they commute): :class:`RandomHorizontalFlip`, :class:`RandomVerticalFlip`,
:class:`ColorJitter`; one of :class:`AutoAugment`, :class:`RandAugment`,
:class:`TrivialAugmentWide` (autoaugment.py; host only) after the flips and before
ColorJitter. Then :class:`Normalize`. After it (torchvision's recipe order):
:class:`RandomErasing` (erasing.py), then the batch-level :class:`MixUp` / :class:`CutMix`
(mixing.py; both listed: one per batch, even odds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dlpack_io.reader.batch.autoaugment import AutoAugment, RandAugment, TrivialAugmentWide
from dlpack_io.reader.batch.erasing import RandomErasing
from dlpack_io.reader.batch.geometry import (CenterCrop, RandomCrop, RandomResizedCrop, Resize,
                                             ResizeThenCrop, TransformError)
from dlpack_io.reader.batch.mixing import CutMix, MixUp

__all__ = ["Resize", "RandomResizedCrop", "RandomCrop", "CenterCrop", "RandomHorizontalFlip",
           "RandomVerticalFlip", "ColorJitter", "Normalize", "ResizeThenCrop", "TransformError",
           "RandomErasing", "MixUp", "CutMix", "AutoAugment", "RandAugment",
           "TrivialAugmentWide", "CROPS", "PUBLIC"]


def _probability(name: str, p) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}(p={p}): a probability in [0, 1] was expected")
    return p


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``."""

    p: float = 0.5

    def __post_init__(self):
        object.__setattr__(self, "p", _probability("RandomHorizontalFlip", self.p))


@dataclass(frozen=True)
class RandomVerticalFlip:
    """Mirror top-bottom with probability ``p``."""

    p: float = 0.5

    def __post_init__(self):
        object.__setattr__(self, "p", _probability("RandomVerticalFlip", self.p))


def _jitter_range(name: str, value, centre: float, bound: tuple) -> tuple[float, float] | None:
    """torchvision's ``_check_input``: v -> [centre - v, centre + v] (clipped), or a pair."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"ColorJitter: {name} {value!r} must be a number or a (min, max) pair")
        lo, hi = float(value[0]), float(value[1])
    else:
        v = float(value)
        if v < 0:
            raise ValueError(f"ColorJitter: {name}={v} must be non-negative")
        lo, hi = centre - v, centre + v
        if bound[0] is not None:
            lo = max(lo, bound[0])
    if not (bound[0] is None or bound[0] <= lo) or not lo <= hi or \
            not (bound[1] is None or hi <= bound[1]):
        raise ValueError(f"ColorJitter: {name} range ({lo}, {hi}) must be increasing and "
                         f"within {bound}")
    return None if lo == hi == centre else (lo, hi)


@dataclass(frozen=True)
class ColorJitter:
    """torchvision's ColorJitter: per sample, brightness/contrast/saturation factors drawn
    uniformly from [max(0, 1 - v), 1 + v] (or a given (min, max)), hue from [-v, v]
    (v <= 0.5), applied in a random order. Exact formulas: docs/kernels.md."""

    brightness: object = 0.0
    contrast: object = 0.0
    saturation: object = 0.0
    hue: object = 0.0

    def __post_init__(self):
        for name in ("brightness", "contrast", "saturation"):
            object.__setattr__(self, name, _jitter_range(name, getattr(self, name), 1.0,
                                                         (0.0, None)))
        object.__setattr__(self, "hue", _jitter_range("hue", self.hue, 0.0, (-0.5, 0.5)))

    @property
    def ranges(self) -> tuple:
        """(brightness, contrast, saturation, hue) ranges, None where the op is off."""
        return self.brightness, self.contrast, self.saturation, self.hue


@dataclass(frozen=True)
class Normalize:
    """``(x / 255 - mean) / std`` per channel (the Loader's float output)."""

    mean: tuple = (0.485, 0.456, 0.406)
    std: tuple = (0.229, 0.224, 0.225)

    def __post_init__(self):
        mean, std = tuple(float(m) for m in self.mean), tuple(float(s) for s in self.std)
        if len(mean) != len(std) or not all(s > 0 and math.isfinite(s) for s in std) or \
                not all(math.isfinite(m) for m in mean):
            raise ValueError(f"Normalize: mean {mean} and std {std} need one finite entry per "
                             f"channel each, std > 0")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)


CROPS = (RandomResizedCrop, RandomCrop, CenterCrop)
PUBLIC = (Resize, RandomResizedCrop, RandomCrop, CenterCrop, RandomHorizontalFlip,
          RandomVerticalFlip, ColorJitter, Normalize, RandomErasing, MixUp, CutMix,
          AutoAugment, RandAugment, TrivialAugmentWide)
