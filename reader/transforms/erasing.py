"""torchvision's RandomErasing, its random parameters a pure function of (seed, epoch, index).

A recipe op, imported only by a Loader whose transforms hold it. Applied to the finished
batch (after Normalize, as torchvision's recipes place it): on the host path by the worker
that built the rows, on the device path on the device after the kernel; both call
:meth:`RandomErasing.apply`, so the two paths agree exactly. ``draws(stream, indices,
count)`` is the plan stage's counter-based source of uniforms (reader/batch/plan.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_ATTEMPTS = 10


def _increasing(name: str, pair, positive: bool) -> tuple[float, float]:
    lo, hi = (float(v) for v in pair)
    if not lo <= hi or (positive and lo <= 0) or lo < 0:
        raise ValueError(f"RandomErasing: {name} {pair!r} must be an increasing pair of "
                         f"{'positive' if positive else 'non-negative'} numbers")
    return lo, hi


@dataclass(frozen=True)
class RandomErasing:
    """With probability ``p``, a box of area fraction in ``scale`` and log-uniform aspect
    ratio in ``ratio`` (10 tries, else nothing) is filled with ``value``: a number, one per
    channel, or "random" (standard normal noise). torchvision's names and defaults."""

    p: float = 0.5
    scale: tuple = (0.02, 0.33)
    ratio: tuple = (0.3, 3.3)
    value: object = 0
    inplace: bool = False   # accepted for torchvision compatibility: batches are ours anyway
    role, stage, stream, noise_stream = "erasing", 4, 5, 6

    def __post_init__(self):
        p = float(self.p)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomErasing(p={self.p}): a probability in [0, 1] was expected")
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "scale", _increasing("scale", self.scale, False))
        object.__setattr__(self, "ratio", _increasing("ratio", self.ratio, True))
        value = self.value
        if isinstance(value, str):
            if value != "random":
                raise ValueError(f"RandomErasing: value {value!r}: expected a number, one per "
                                 f"channel, or 'random'")
        elif isinstance(value, (tuple, list)):
            if len(value) not in (1, 3):
                raise ValueError(f"RandomErasing: value {value!r}: one number or 3 (per channel)")
            value = tuple(float(v) for v in value)
        else:
            value = (float(value),)
        object.__setattr__(self, "value", value)

    def boxes(self, draws, indices, size) -> np.ndarray:
        """(N, 4) int64 (top, left, height, width) boxes to erase; height 0: not erased."""
        img_h, img_w = int(size[0]), int(size[1])
        n = len(indices)
        u = draws(self.stream, indices, 1 + 4 * _ATTEMPTS)
        apply = u[:, 0] < self.p
        u = u[:, 1:].reshape(n, _ATTEMPTS, 4)
        area = img_h * img_w * (self.scale[0] + u[..., 0] * (self.scale[1] - self.scale[0]))
        lr0, lr1 = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = np.exp(lr0 + u[..., 1] * (lr1 - lr0))
        h = np.rint(np.sqrt(area * aspect)).astype(np.int64)
        w = np.rint(np.sqrt(area / aspect)).astype(np.int64)
        ok = (h < img_h) & (w < img_w)
        first = np.argmax(ok, axis=1)
        rows = np.arange(n)
        bh, bw = h[rows, first], w[rows, first]
        top = np.floor(u[rows, first, 2] * (img_h - bh + 1)).astype(np.int64)
        left = np.floor(u[rows, first, 3] * (img_w - bw + 1)).astype(np.int64)
        out = np.stack([top, left, bh, bw], axis=1)
        out[~(apply & ok[rows, first])] = 0
        return out

    def noise(self, draws, index: int, count: int) -> np.ndarray:
        """``count`` standard normal float32 values for sample ``index`` (Box-Muller of the
        counter-based uniforms: a pure function of its arguments)."""
        pairs = (count + 1) // 2
        u = draws(self.noise_stream, [index], 2 * pairs)[0]
        radius = np.sqrt(-2.0 * np.log1p(-u[:pairs]))  # 1 - u is in (0, 1]: log is finite
        angle = 2.0 * np.pi * u[pairs:]
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count] \
            .astype(np.float32)

    def apply(self, draws, indices, images) -> None:
        """Erase, in place, the boxes of the samples ``indices`` in ``images`` ((N, C, H, W)
        torch tensor, any device and dtype; one row per index)."""
        import torch

        if not len(indices):
            return
        channels, size = images.shape[1], images.shape[2:]
        boxes = self.boxes(draws, indices, size)
        for row in np.flatnonzero(boxes[:, 2] > 0):
            t, lf, h, w = (int(v) for v in boxes[row])
            if self.value == "random":
                fill = torch.from_numpy(self.noise(draws, int(indices[row]), channels * h * w))
                fill = fill.view(channels, h, w)
            else:
                fill = torch.tensor(self.value, dtype=torch.float32).view(-1, 1, 1)
            images[row, :, t:t + h, lf:lf + w] = fill.to(images.device, images.dtype)
