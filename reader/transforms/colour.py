"""Colour transforms: torchvision's ColorJitter and Normalize, fused into the one epilogue
(colour jitter, normalisation, cast) that follows the pixels.

Each sample's jitter factors and the order of the four ops are drawn by the plan stage from
the op's own stream (:meth:`ColorJitter.draw`, a pure function of (seed, epoch, sample
index)). The maths lives once, in ``dlpack_io.kernels``: the Triton kernels' epilogue on the
device, its torch twin ``kernels.reference.finish`` on the host (the build stage calls it
per range of rows). :func:`epilogue_args` are the kernels' fixed arguments and
:func:`host_epilogue` the same validated once for the host; :meth:`ColorJitter.tensors` the
per-sample ones. Exact formulas: docs/kernels.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dlpack_io.kernels.records import JITTER_OPS, NEUTRAL_FACTORS, ORDER_SHIFTS


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
    role, stage, stream = "jitter", 2, 4

    def __post_init__(self):
        for name in ("brightness", "contrast", "saturation"):
            object.__setattr__(self, name, _jitter_range(name, getattr(self, name), 1.0,
                                                         (0.0, None)))
        object.__setattr__(self, "hue", _jitter_range("hue", self.hue, 0.0, (-0.5, 0.5)))

    @property
    def ranges(self) -> tuple:
        """(brightness, contrast, saturation, hue) ranges, None where the op is off."""
        return self.brightness, self.contrast, self.saturation, self.hue

    @property
    def names(self) -> tuple:
        """The enabled ops' names (the kernels' ``jitter=`` argument)."""
        return tuple(name for name, r in zip(JITTER_OPS, self.ranges) if r is not None)

    def draw(self, draws, indices) -> tuple[np.ndarray, np.ndarray]:
        """(factors (N, 4) float32, order (N, 4) int8) of torchvision's
        ColorJitter.get_params: each enabled factor uniform in its range, disabled ones
        neutral; a uniformly random order of the four ops (disabled ops are identities
        wherever they fall)."""
        u = draws(self.stream, indices, 8)
        factors = np.empty((len(u), 4), dtype=np.float32)
        for j, (rng_range, neutral) in enumerate(zip(self.ranges, NEUTRAL_FACTORS)):
            if rng_range is None:
                factors[:, j] = neutral
            else:
                factors[:, j] = rng_range[0] + u[:, j] * (rng_range[1] - rng_range[0])
        order = np.argsort(u[:, 4:8], axis=1, kind="stable").astype(np.int8)
        return factors, order

    @staticmethod
    def tensors(factors: np.ndarray, order: np.ndarray) -> dict:
        """``kernels.reference.finish``'s per-sample jitter arguments for drawn rows: the
        (n, 4) float32 factors (neutral where an op is off) and the (n,) int32 order codes
        ``sum(op << 2k)`` of the kernels' records."""
        import torch

        codes = (order.astype(np.int32) << np.array(ORDER_SHIFTS, np.int32)).sum(1)
        return {"factors": torch.from_numpy(np.ascontiguousarray(factors)),
                "order": torch.from_numpy(codes.astype(np.int32))}


@dataclass(frozen=True)
class Normalize:
    """``(x / 255 - mean) / std`` per channel (the Loader's float output)."""

    mean: tuple = (0.485, 0.456, 0.406)
    std: tuple = (0.229, 0.224, 0.225)
    role, stage, stream = "normalize", 3, None

    def __post_init__(self):
        mean, std = tuple(float(m) for m in self.mean), tuple(float(s) for s in self.std)
        if len(mean) != len(std) or not all(s > 0 and math.isfinite(s) for s in std) or \
                not all(math.isfinite(m) for m in mean):
            raise ValueError(f"Normalize: mean {mean} and std {std} need one finite entry per "
                             f"channel each, std > 0")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)


def epilogue_args(normalize: Normalize | None, dtype) -> dict:
    """The kernels' fixed epilogue arguments (the output dtype, and Normalize's mean and
    std), the same for every batch of a Loader: computed once, when the recipe is compiled."""
    kw = {"out_dtype": dtype}
    if normalize is not None:
        kw["mean"], kw["std"] = normalize.mean, normalize.std
    return kw


def host_epilogue(normalize: Normalize | None, jitter: ColorJitter | None, dtype):
    """The epilogue's parameters for the host path, validated once by the kernels' own
    checks (``kernels.epilogue.make_epilogue``: scale, bias, the enabled jitter ops), which
    ``kernels.reference.finish`` then applies to every range of rows without checking again."""
    import torch

    from dlpack_io.kernels.checks import DeferredChecks
    from dlpack_io.kernels.epilogue import OP_BITS, make_epilogue

    ops = sum(OP_BITS[name] for name in (jitter.names if jitter is not None else ()))
    kw = epilogue_args(normalize, dtype)
    return make_epilogue("epilogue", channels=3, n=0, device=torch.device("cpu"),
                         out_dtype=dtype, mean=kw.get("mean"), std=kw.get("std"), ops=ops,
                         contrast_mean=None, checks=DeferredChecks("epilogue", False))
