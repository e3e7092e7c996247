"""The epoch order of a ``Mixture``: which samples of each set, interleaved how. Pure functions.

Everything is a function of (seed, epoch, the sets' sizes and shard sizes, each set's share
``counts[s]`` of the epoch, shuffle, block_size, block_window): no state, no worker count,
no rank. The Loader then cuts the result across ranks and resumes it exactly as it does a
single data set's order (order.rank_part, resume.remaining), so ranks, elastic resume and
worker independence carry over unchanged.

Set ``s`` of ``n`` samples draws ``q = counts[s]`` samples an epoch:
  * ``q // n`` whole copies, each a fresh permutation of the set (a set smaller than its
    share is repeated, every sample ``q // n`` or ``q // n + 1`` times);
  * ``r = q % n`` more without replacement, from a *tour*: tour ``t`` is a permutation of
    the set, and its ``L = n // r`` epochs take the consecutive windows ``[j*r, (j+1)*r)``
    of it. So within an epoch nothing repeats (unless q > n), consecutive epochs read
    different samples, and a tour of L epochs reads ``L*r`` distinct samples (every one of
    them when r divides n; the few left over differ from tour to tour).
The permutations are ``shuffle``'s: "global" a uniform one, "block" the shard-block order of
order.py over the set's own shards. Without shuffle the copies are in storage order and the
``r`` more are the window ``[e*r, (e+1)*r)`` modulo n, rotating through the set.

Interleave (stratified): the i-th sample of set s gets the key ``(i + u) / q`` with ``u``
uniform in [0, 1) (0.5 without shuffle) and the epoch is all samples sorted by key, so every
stretch of the order holds each set close to its share (a batch of B holds ``B * w_s`` of set
s, give or take 2), while the order within each set stays its own (block reads stay local).

A sample is named by a *virtual index* ``copy * total + offset[s] + i`` (``total`` = all
sets' samples, ``offset`` the set's start in their concatenation, ``copy`` which repetition
of it this is), so every position of an epoch has a distinct index, and a repeated sample
gets its own random transform (transforms are a pure function of (seed, epoch, index)).
"""
from __future__ import annotations

import numpy as np

from dlpack_io.reader.batch import order as order_mod

_SALT_COPY, _SALT_TOUR, _SALT_MIX = 0x4D1, 0x4D2, 0x4D3


def _permutation(n: int, shuffle, seed: int, key: int, salt: int, s: int, c: int,
                 shard_sizes, block_size: int, window: int) -> np.ndarray:
    """A permutation of range(n) for set ``s``, repetition ``c``, keyed by ``key`` (an
    epoch or a tour number): the ``shuffle`` kind's (see the module doc)."""
    if shuffle == "global":
        return np.random.default_rng([seed, key, salt, s, c]).permutation(n).astype(np.int64)
    if shuffle == "block":
        derived = int(np.random.SeedSequence([seed, salt, s, c]).generate_state(1)[0])
        return order_mod.block_order(shard_sizes, derived, key, block_size, window)
    return np.arange(n, dtype=np.int64)


def set_draw(n: int, count: int, s: int, *, shuffle, seed: int, epoch: int, shard_sizes=None,
             block_size: int = order_mod.DEFAULT_BLOCK_SIZE,
             window: int = order_mod.DEFAULT_WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """(repetition numbers, indices within the set) of the ``count`` samples set ``s`` of
    ``n`` samples gives to ``epoch``, in the set's own order (see the module doc)."""
    if count and n < 1:
        raise ValueError(f"set {s} is empty but its share of the epoch is {count} samples")
    shuffle = order_mod.check_shuffle(shuffle)
    sizes = [n] if shard_sizes is None else list(shard_sizes)
    if sum(sizes) != n:
        raise ValueError(f"set {s}: shard sizes add up to {sum(sizes)}, not {n} samples")
    copies, rest = divmod(count, n) if n else (0, 0)
    parts = [_permutation(n, shuffle, seed, epoch, _SALT_COPY, s, c, sizes, block_size, window)
             for c in range(copies)]
    if rest and shuffle is None:  # storage order: a window rotating through the set
        parts.append((np.arange(rest, dtype=np.int64) + int(epoch) * rest % n) % n)
    elif rest:
        per_tour = n // rest
        tour, j = divmod(epoch, per_tour)
        perm = _permutation(n, shuffle, seed, tour, _SALT_TOUR, s, 0, sizes, block_size, window)
        parts.append(perm[j * rest:(j + 1) * rest])
    reps = np.repeat(np.arange(len(parts), dtype=np.int64), [len(p) for p in parts])
    local = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return reps, local


def interleave(counts, shuffle, seed: int, epoch: int) -> np.ndarray:
    """Set number of every position of the epoch (int64, ``sum(counts)`` long): the stratified
    interleave of the module doc; set s's k-th position is its k-th drawn sample."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    sets = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    rank_in_set = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    if order_mod.check_shuffle(shuffle) is None:
        jitter = np.full(total, 0.5)
    else:
        jitter = np.random.default_rng([seed, epoch, _SALT_MIX]).random(total)
    keys = (rank_in_set + jitter) / np.maximum(counts[sets], 1)
    return sets[np.argsort(keys, kind="stable")]


def mixture_order(sizes, counts, offsets, total: int, *, shuffle, seed: int, epoch: int,
                  shard_sizes=None, block_size: int = order_mod.DEFAULT_BLOCK_SIZE,
                  window: int = order_mod.DEFAULT_WINDOW) -> np.ndarray:
    """Virtual indices of the whole epoch in reading order (before the split across ranks):
    set s draws ``counts[s]`` of its ``sizes[s]`` samples (``set_draw``), interleaved
    (``interleave``); ``shard_sizes[s]`` lists set s's shard sizes (block shuffle)."""
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed {seed} and epoch {epoch} must be >= 0")
    labels = interleave(counts, shuffle, seed, epoch)
    out = np.empty(len(labels), dtype=np.int64)
    for s, (n, count) in enumerate(zip(sizes, counts)):
        if not count:
            continue
        reps, local = set_draw(int(n), int(count), s, shuffle=shuffle, seed=seed, epoch=epoch,
                               shard_sizes=None if shard_sizes is None else shard_sizes[s],
                               block_size=block_size, window=window)
        out[labels == s] = reps * int(total) + int(offsets[s]) + local
    return out

