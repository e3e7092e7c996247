"""Batch transforms: crop boxes, flips and normalisation, as vectorized pure functions.

Random parameters are drawn from :mod:`dlpack_io.reader.rng`, a pure function of
(seed, epoch, sample index), so a sample gets the same crop and flips whichever worker,
rank or batch position handles it. The CPU path and the GPU kernels consume the same
boxes and flags; only the pixel arithmetic differs (see docs/loader.md).

Crops (``size`` is an int or an (height, width) pair, the output size):
  * :class:`RandomResizedCrop`: torchvision's box sampling (10 tries of a random area
    fraction in ``scale`` and log-uniform aspect ratio in ``ratio``, then the
    central-crop fallback), resized to ``size`` with an antialiased bilinear filter.
  * :class:`RandomCrop`: a uniformly placed ``size`` box (no resize, no padding).
  * :class:`CenterCrop`: the centred ``size`` box (torchvision's rounding).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dlpack_io.reader import rng

_ATTEMPTS = 10


def _pair(size, name: str) -> tuple[int, int]:
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"{name}: size {size!r} must be an int or a (height, width) pair")
        h, w = int(size[0]), int(size[1])
    else:
        h = w = int(size)
    if h < 1 or w < 1:
        raise ValueError(f"{name}: size {size!r} must be >= 1 pixel")
    return h, w


class TransformError(ValueError):
    """A transform cannot apply to sample ``sample`` (e.g. the image is too small)."""

    def __init__(self, message: str, sample: int):
        super().__init__(message)
        self.sample = sample


def _check_fits(name, size, heights, widths, indices) -> None:
    bad = np.flatnonzero((heights < size[0]) | (widths < size[1]))
    if bad.size:
        i = int(bad[0])
        raise TransformError(f"{name}{size}: the image is only {int(heights[i])}x"
                             f"{int(widths[i])} pixels; crops do not pad: use "
                             f"RandomResizedCrop, a smaller size, or pack with a larger --size",
                             int(indices[i]))


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop box sampling, output ``size`` (antialiased resize)."""

    size: object = 224
    scale: tuple = (0.08, 1.0)
    ratio: tuple = (3.0 / 4.0, 4.0 / 3.0)
    resizes = True

    def __post_init__(self):
        object.__setattr__(self, "size", _pair(self.size, "RandomResizedCrop"))
        s0, s1 = map(float, self.scale)
        r0, r1 = map(float, self.ratio)
        if not (0 < s0 <= s1) or not (0 < r0 <= r1):
            raise ValueError(f"RandomResizedCrop: scale {self.scale} and ratio {self.ratio} "
                             f"must be increasing pairs of positive numbers")
        object.__setattr__(self, "scale", (s0, s1))
        object.__setattr__(self, "ratio", (r0, r1))

    def boxes(self, heights, widths, seed: int, epoch: int, indices) -> np.ndarray:
        """(N, 4) int64 boxes (top, left, height, width) for the given samples."""
        hs, ws = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        u = rng.uniforms(seed, epoch, rng.STREAM_CROP, indices, 4 * _ATTEMPTS)
        u = u.reshape(len(hs), _ATTEMPTS, 4)
        area = (hs * ws).astype(np.float64)[:, None]
        target = area * (self.scale[0] + u[..., 0] * (self.scale[1] - self.scale[0]))
        lr0, lr1 = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = np.exp(lr0 + u[..., 1] * (lr1 - lr0))
        cw = np.rint(np.sqrt(target * aspect)).astype(np.int64)
        ch = np.rint(np.sqrt(target / aspect)).astype(np.int64)
        ok = (cw > 0) & (cw <= ws[:, None]) & (ch > 0) & (ch <= hs[:, None])
        first = np.argmax(ok, axis=1)
        rows = np.arange(len(hs))
        found = ok[rows, first]
        bh, bw = ch[rows, first], cw[rows, first]
        top = np.floor(u[rows, first, 2] * (hs - bh + 1)).astype(np.int64)
        left = np.floor(u[rows, first, 3] * (ws - bw + 1)).astype(np.int64)
        fb = self._fallback(hs, ws)
        out = np.stack([top, left, bh, bw], axis=1)
        return np.where(found[:, None], out, fb)

    def _fallback(self, hs: np.ndarray, ws: np.ndarray) -> np.ndarray:
        """torchvision's central crop when 10 tries found no box."""
        in_ratio = ws / hs
        lo, hi = self.ratio
        w = np.where(in_ratio < lo, ws, np.where(in_ratio > hi, np.rint(hs * hi), ws))
        h = np.where(in_ratio < lo, np.rint(ws / lo), hs)
        w, h = w.astype(np.int64), h.astype(np.int64)
        return np.stack([(hs - h) // 2, (ws - w) // 2, h, w], axis=1)


@dataclass(frozen=True)
class RandomCrop:
    """A ``size`` box at a uniformly random position (the image must be at least ``size``)."""

    size: object = 224
    resizes = False

    def __post_init__(self):
        object.__setattr__(self, "size", _pair(self.size, "RandomCrop"))

    def boxes(self, heights, widths, seed: int, epoch: int, indices) -> np.ndarray:
        """(N, 4) int64 boxes (top, left, height, width)."""
        hs, ws = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        _check_fits("RandomCrop", self.size, hs, ws, indices)
        u = rng.uniforms(seed, epoch, rng.STREAM_CROP, indices, 2)
        top = np.floor(u[:, 0] * (hs - self.size[0] + 1)).astype(np.int64)
        left = np.floor(u[:, 1] * (ws - self.size[1] + 1)).astype(np.int64)
        return np.stack([top, left, np.full_like(hs, self.size[0]),
                         np.full_like(ws, self.size[1])], axis=1)


@dataclass(frozen=True)
class CenterCrop:
    """The centred ``size`` box, ``top = round((H - h) / 2)`` as torchvision rounds it."""

    size: object = 224
    resizes = False

    def __post_init__(self):
        object.__setattr__(self, "size", _pair(self.size, "CenterCrop"))

    def boxes(self, heights, widths, seed: int, epoch: int, indices) -> np.ndarray:
        """(N, 4) int64 boxes (top, left, height, width); no randomness."""
        hs, ws = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        _check_fits("CenterCrop", self.size, hs, ws, indices)
        top = np.rint((hs - self.size[0]) / 2.0).astype(np.int64)
        left = np.rint((ws - self.size[1]) / 2.0).astype(np.int64)
        return np.stack([top, left, np.full_like(hs, self.size[0]),
                         np.full_like(ws, self.size[1])], axis=1)


CROPS = (RandomResizedCrop, RandomCrop, CenterCrop)


@dataclass(frozen=True)
class BatchParams:
    """Per-sample transform parameters of one batch (numpy arrays, one row per sample)."""

    boxes: np.ndarray   # (N, 4) int64: top, left, height, width in the stored image
    flip_h: np.ndarray  # (N,) bool
    flip_v: np.ndarray  # (N,) bool
    out_size: tuple     # (height, width) of every output image
    resize: bool        # True: resample box -> out_size; False: box size == out_size


def full_image_boxes(heights, widths, indices) -> tuple[np.ndarray, tuple]:
    """Boxes covering whole images (crop=None); every image must have the same size."""
    hs, ws = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
    if len(hs) and (np.any(hs != hs[0]) or np.any(ws != ws[0])):
        i = int(np.flatnonzero((hs != hs[0]) | (ws != ws[0]))[0])
        raise TransformError(f"crop=None needs images of one size, but this one is "
                             f"{int(hs[i])}x{int(ws[i])} and sample {int(indices[0])} is "
                             f"{int(hs[0])}x{int(ws[0])}; pass a crop (e.g. "
                             f"RandomResizedCrop(224)) or pack with --mode raw --size",
                             int(indices[i]))
    zeros = np.zeros_like(hs)
    size = (int(hs[0]), int(ws[0])) if len(hs) else (0, 0)
    return np.stack([zeros, zeros, hs, ws], axis=1), size


def sample_params(crop, flip_h: float, flip_v: float, seed: int, epoch: int, indices,
                  heights, widths) -> BatchParams:
    """Crop boxes and flip flags of the samples ``indices`` (a pure function)."""
    indices = np.asarray(indices, dtype=np.int64)
    if crop is None:
        boxes, size = full_image_boxes(heights, widths, indices)
        resize = False
    else:
        boxes, size, resize = crop.boxes(heights, widths, seed, epoch, indices), crop.size, crop.resizes
    fh = rng.uniforms(seed, epoch, rng.STREAM_FLIP_H, indices)[:, 0] < flip_h
    fv = rng.uniforms(seed, epoch, rng.STREAM_FLIP_V, indices)[:, 0] < flip_v
    return BatchParams(boxes, fh, fv, tuple(size), resize)


def check_probability(name: str, p) -> float:
    """Validate a flip probability."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}={p}: a probability in [0, 1] was expected")
    return p


def _scale_bias(c: int, mean, std):
    import torch

    mean = (0.0,) * c if mean is None else tuple(float(m) for m in mean)
    std = (1.0,) * c if std is None else tuple(float(s) for s in std)
    if len(mean) != c or len(std) != c or any(s <= 0 for s in std):
        raise ValueError(f"mean {mean} and std {std} need {c} entries each, std > 0")
    scale = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float32)
    bias = torch.tensor([-m / s for m, s in zip(mean, std)], dtype=torch.float32)
    return scale.view(1, c, 1, 1), bias.view(1, c, 1, 1)


def normalize_into(images_u8, out, mean, std):
    """uint8 NCHW -> ``out`` (a float tensor of the same shape); returns ``out``.

    ``v * (1 / (255 * std)) + (-mean / std)`` computed in float32, the same formula as
    the GPU kernels' epilogue (``(v / 255 - mean) / std``); mean/std None give ``v / 255``.
    """
    import torch

    scale, bias = _scale_bias(images_u8.shape[1], mean, std)
    if out.dtype == torch.float32:
        torch.mul(images_u8, scale, out=out)
        return out.add_(bias)
    out.copy_(images_u8.to(torch.float32).mul_(scale).add_(bias))
    return out


def normalize_cpu(images_u8, mean, std, dtype):
    """uint8 NCHW -> a new tensor of ``dtype`` (see :func:`normalize_into`)."""
    import torch

    return normalize_into(images_u8, torch.empty(images_u8.shape, dtype=dtype), mean, std)
