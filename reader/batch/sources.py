"""What the Loader reads: a Dataset (or a Subset of one) or a Mixture of data sets.

The Loader asks these few questions of its source and nothing else about its kind: what
to read (``unwrap``), which fields it offers (``check_fields``), how many samples an epoch
has and in which order (``epoch_items``, ``epoch_positions``), what a saved state must
match (``identity``), what ``return_index`` shows (``public_indices``) and what
``loader.stats()`` counts per set (``set_counts``).
"""
from __future__ import annotations

import numpy as np

from dlpack_io.reader.batch import fieldbatch, mixorder, resume
from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch.options import unwrap_subset
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


def check_fields(dataset, names) -> tuple:
    """``fieldbatch.check_fields`` for every set of a Mixture: ValueError naming the set
    that lacks a field (or stores it with another schema than set 0)."""
    if not isinstance(dataset, Mixture):
        return fieldbatch.check_fields(dataset, names)
    for s, ds in enumerate(dataset.datasets):  # every set has them: else name the one without
        try:
            fieldbatch.check_fields(ds, names)
        except ValueError as exc:
            raise ValueError(f"Mixture set {s}: {exc}") from None
    first = dataset.datasets[0].fields
    for s, ds in enumerate(dataset.datasets[1:], 1):
        for n in names:
            if n not in fieldbatch.DEFAULT_FIELDS and ds.fields[n] != first[n]:
                raise ValueError(f"Mixture set {s} ({ds.path}): field {n!r} is "
                                 f"{ds.fields[n]}, set 0 stores it as {first[n]}: a batch "
                                 f"needs one schema")
    return tuple(names)


def epoch_items(dataset, subset) -> int:
    """Samples in one epoch of the source."""
    return len(dataset) if subset is None else len(subset)


def epoch_positions(dataset, subset, o, epoch: int) -> np.ndarray:
    """The epoch's sample indices in reading order (order.py; mixorder.py for a Mixture)."""
    if isinstance(dataset, Mixture):
        return mixorder.mixture_order(dataset.sizes, dataset.counts, dataset.offsets,
                                      dataset.total, shuffle=o.shuffle, seed=o.seed,
                                      epoch=epoch, shard_sizes=dataset.shard_sizes,
                                      block_size=o.block_size, window=o.block_window)
    sizes = dataset.shard_sizes if subset is None else None
    positions = order_mod.epoch_order(epoch_items(dataset, subset), o.shuffle, o.seed, epoch,
                                      sizes, o.block_size, o.block_window)
    return positions if subset is None else subset[positions]


def identity(dataset, subset, o) -> dict:
    """The settings a saved state must share to continue this epoch order."""
    out = {"num_samples": len(dataset), "seed": o.seed, "shuffle": o.shuffle,
           "block_size": o.block_size, "block_window": o.block_window,
           "subset": resume.subset_digest(subset)}
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
