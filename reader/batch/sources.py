"""What the Loader reads: a Dataset (or a Subset of one) or a Mixture of data sets, and the
epoch order of a Mixture.

The Loader asks these few questions of its source and nothing else about its kind: what
to read (``unwrap``), which fields it offers (``check_fields``), how many samples an epoch
has and in which order (``epoch_items``, ``epoch_positions``: order.py for one data set,
:func:`mixture_order` below for a Mixture), what a saved state must match (``identity``),
what ``return_index`` shows (``public_indices``) and what ``loader.stats()`` counts per
set (``set_counts``).
"""
from __future__ import annotations

import numpy as np

from dlpack_io.reader.batch import fields as fieldbatch
from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch import resume
from dlpack_io.reader.mixture import Mixture


def unwrap(dataset, indices):
    """(Dataset or Mixture, positions or None); a Mixture takes no ``indices``."""
    if isinstance(dataset, Mixture):
        if indices is not None:
            raise ValueError("Loader(indices=...) with a Mixture: choose the samples of each "
                             "set instead (a torch Subset is not a Dataset either: shrink a "
                             "set's weight, or pack the subset)")
        return dataset, None
    return unwrap_subset(dataset, indices)


def check_fields(dataset, names, buckets=None) -> tuple:
    """``fields.check_fields`` for every set of a Mixture: ValueError naming the set
    that lacks a field (or stores it with another schema than set 0)."""
    if not isinstance(dataset, Mixture):
        return fieldbatch.check_fields(dataset, names, buckets)
    for s, ds in enumerate(dataset.datasets):  # every set has them: else name the one without
        try:
            fieldbatch.check_fields(ds, names, buckets)
        except ValueError as exc:
            raise ValueError(f"Mixture set {s}: {exc}") from None
    first, made = dataset.datasets[0].fields, \
        fieldbatch.CONDITIONING if hasattr(buckets, "crops") else ()
    for s, ds in enumerate(dataset.datasets[1:], 1):
        for n in names:
            if n not in fieldbatch.DEFAULT_FIELDS + made and ds.fields[n] != first[n]:
                raise ValueError(f"Mixture set {s} ({ds.path}): field {n!r} is "
                                 f"{ds.fields[n]}, set 0 stores it as {first[n]}: a batch "
                                 f"needs one schema")
    return tuple(names)


def epoch_items(dataset, subset) -> int:
    """Samples in one epoch of the source."""
    return len(dataset) if subset is None else len(subset)


def epoch_positions(dataset, subset, o, epoch: int) -> np.ndarray:
    """The epoch's sample indices in reading order (order.py; mixture_order below for a Mixture)."""
    if isinstance(dataset, Mixture):
        return mixture_order(dataset.sizes, dataset.counts, dataset.offsets, dataset.total,
                             shuffle=o.shuffle, seed=o.seed, epoch=epoch,
                             shard_sizes=dataset.shard_sizes, block_size=o.order.block_size,
                             window=o.order.block_window)
    sizes = dataset.shard_sizes if subset is None else None
    positions = order_mod.epoch_order(epoch_items(dataset, subset), o.shuffle, o.seed, epoch,
                                      sizes, o.order.block_size, o.order.block_window)
    return positions if subset is None else subset[positions]


def identity(dataset, subset, o) -> dict:
    """The settings a saved state must share to continue this epoch order."""
    out = {"num_samples": len(dataset), "seed": o.seed, "shuffle": o.shuffle,
           "block_size": o.order.block_size, "block_window": o.order.block_window,
           "subset": resume.subset_digest(subset)}
    if o.buckets is not None:  # the batches' composition: a state continues only the same
        out["buckets"] = repr(o.buckets)
    if isinstance(dataset, Mixture):  # the sets' sizes and shares decide the order too
        out["mixture"] = [[int(n), int(q)] for n, q in zip(dataset.sizes, dataset.counts)]
    return out


def public_indices(dataset, indices):
    """What ``return_index=True`` yields: the global indices of a Dataset's batch; for a
    Mixture an (N, 2) int64 array of (set number, index in that set) rows."""
    if not isinstance(dataset, Mixture):
        return indices
    sets, local, _ = dataset.split(indices)
    return np.stack([sets, local], axis=1).astype(np.int64)


def set_counts(dataset, indices):
    """Images of each set in a batch of a Mixture (``loader.stats().images_per_set``);
    None for a Dataset."""
    if not isinstance(dataset, Mixture):
        return None
    return np.bincount(dataset.split(indices)[0], minlength=len(dataset.datasets))


def unwrap_subset(dataset, indices):
    """(our Dataset, positions or None): accepts torch's Subset (nested too) and ``indices``."""
    from torch.utils.data import Subset

    from dlpack_io.reader.dataset import Dataset

    positions = None
    while isinstance(dataset, Subset):
        inner = np.asarray(dataset.indices, dtype=np.int64).reshape(-1)
        positions = inner if positions is None else inner[positions]
        dataset = dataset.dataset
    if not isinstance(dataset, Dataset):
        raise TypeError(f"Loader reads a dlpack_io.reader.Dataset (or a torch Subset of one), "
                        f"not {type(dataset).__name__}")
    if indices is not None:
        chosen = np.asarray(indices, dtype=np.int64).reshape(-1)
        positions = chosen if positions is None else positions[chosen]
    if positions is not None:
        n = len(dataset)
        if positions.size and (positions.min() < 0 or positions.max() >= n):
            bad = int(positions[(positions < 0) | (positions >= n)][0])
            raise IndexError(f"indices: sample {bad} is out of range for {n} samples")
        if len(np.unique(positions)) != len(positions):
            raise ValueError("indices: a sample is listed twice; each sample is read once "
                             "per epoch")
    return dataset, positions


# ---- the epoch order of a Mixture: pure functions ---------------------------------------
# The epoch order of a ``Mixture``: which samples of each set, interleaved how. Pure functions.
#
# Everything is a function of (seed, epoch, the sets' sizes and shard sizes, each set's share
# ``counts[s]`` of the epoch, shuffle, block_size, block_window): no state, no worker count,
# no rank. The Loader then cuts the result across ranks and resumes it exactly as it does a
# single data set's order (order.rank_part, resume.remaining), so ranks, elastic resume and
# worker independence carry over unchanged.
#
# Set ``s`` of ``n`` samples draws ``q = counts[s]`` samples an epoch:
#   * ``q // n`` whole copies, each a fresh permutation of the set (a set smaller than its
#     share is repeated, every sample ``q // n`` or ``q // n + 1`` times);
#   * ``r = q % n`` more without replacement, from a *tour*: tour ``t`` is a permutation of
#     the set, and its ``L = n // r`` epochs take the consecutive windows ``[j*r, (j+1)*r)``
#     of it. So within an epoch nothing repeats (unless q > n), consecutive epochs read
#     different samples, and a tour of L epochs reads ``L*r`` distinct samples (every one of
#     them when r divides n; the few left over differ from tour to tour).
# The permutations are ``shuffle``'s: "global" a uniform one, "block" the shard-block order of
# order.py over the set's own shards. Without shuffle the copies are in storage order and the
# ``r`` more are the window ``[e*r, (e+1)*r)`` modulo n, rotating through the set.
#
# Interleave (stratified): the i-th sample of set s gets the key ``(i + u) / q`` with ``u``
# uniform in [0, 1) (0.5 without shuffle) and the epoch is all samples sorted by key, so every
# stretch of the order holds each set close to its share (a batch of B holds ``B * w_s`` of set
# s, give or take 2), while the order within each set stays its own (block reads stay local).
#
# A sample is named by a *virtual index* ``copy * total + offset[s] + i`` (``total`` = all
# sets' samples, ``offset`` the set's start in their concatenation, ``copy`` which repetition
# of it this is), so every position of an epoch has a distinct index, and a repeated sample
# gets its own random transform (transforms are a pure function of (seed, epoch, index)).
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

