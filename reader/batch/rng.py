"""Counter-based random numbers: a pure, vectorized function of (seed, epoch, sample, draw).

The loader's random augmentation parameters must not depend on which worker (or how many)
handles a sample, nor on what was drawn before, so they are not taken from a stateful
generator: each value is a hash (SplitMix64's finaliser, applied in a chain) of the
seed, the epoch, a stream id, the global sample index and the draw number. The same
inputs give the same floats on every machine and numpy version.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1

# Stream ids: independent families of draws for the same sample.
STREAM_CROP = 1
STREAM_FLIP_H = 2
STREAM_FLIP_V = 3
STREAM_JITTER = 4   # ColorJitter: 4 factors, then 4 keys whose ranks give the op order
STREAM_ERASE = 5    # RandomErasing: apply?, then 10 tries of (area, ratio, top, left)
STREAM_ERASE_NOISE = 6  # RandomErasing(value="random"): the noise, per pixel
STREAM_MIX = 7      # MixUp / CutMix: per batch (keyed by its first sample)
STREAM_AUGMENT = 8  # AutoAugment, RandAugment, TrivialAugmentWide: op choices, magnitudes


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser of a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _key(seed: int, epoch: int, stream: int) -> np.ndarray:
    """One uint64 key for (seed, epoch, stream); any Python ints (taken modulo 2**64)."""
    k = np.array([int(seed) & _MASK64], dtype=np.uint64)
    for part in (epoch, stream):
        k = _mix(k + _GOLDEN) ^ np.uint64(int(part) & _MASK64)
    return _mix(k + _GOLDEN)


def uniforms(seed: int, epoch: int, stream: int, indices, count: int = 1) -> np.ndarray:
    """Floats in [0, 1), shape (len(indices), count): draw j of sample indices[i].

    A pure function of its arguments; 53 random bits per float.
    """
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    draws = np.arange(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = _mix(idx * _GOLDEN + _key(seed, epoch, stream))
        x = _mix(x[:, None] + (draws[None, :] + np.uint64(1)) * _M2)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
