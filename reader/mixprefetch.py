"""The remote prefetch of a ``Mixture``: one prefetch per s3:// set, one handle over them.

The Loader hands ``start_prefetch`` this rank's upcoming batches of virtual indices; each
remote set gets, per batch, the distinct records of that batch that are its own (an empty
list where the batch holds none of it), so batch ``k`` of the mixture is batch ``k`` of
every set's prefetch and ``wait``/``ready``/``release`` go to all of them. A worker's
remote shard finds its own set's prefetch as it does for a single data set.
"""
from __future__ import annotations

import time

import numpy as np


def start_sets(mixture, batches, mode=None):
    """A MixturePrefetch over the remote sets of ``mixture`` for ``batches``, or None."""
    remote = [s for s, ds in enumerate(mixture.datasets) if ds.is_remote]
    if not remote:
        return None
    split = [mixture.split(b)[:2] for b in batches]
    handles = []
    try:
        for s in remote:
            mine = [np.unique(local[sets == s]) for sets, local in split]
            handles.append(mixture.datasets[s].start_prefetch(mine, mode=mode))
    except BaseException:
        for h in handles:
            h.close()
        raise
    return MixturePrefetch(handles)


class MixturePrefetch:
    """``Prefetch``'s protocol (reader/remote/prefetch.py) over several sets' prefetches."""

    def __init__(self, handles):
        self.handles = list(handles)

    @property
    def stats(self) -> list[dict]:
        """Each remote set's prefetch statistics, in set order."""
        return [h.stats for h in self.handles]

    def wait(self, k: int, timeout: float | None = None) -> None:
        """Block until batch ``k``'s records of every remote set are in the cache;
        TimeoutError once ``timeout`` seconds have passed in all (one deadline shared by
        the sets, not ``timeout`` each); None: each set's own store deadline."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for h in self.handles:
            # a set reached with no time left still answers: ready now, or TimeoutError
            h.wait(k, None if deadline is None else max(0.0, deadline - time.monotonic()))

    def ready(self, k: int) -> bool:
        """Non-blocking: batch ``k``'s records of every remote set are in the cache."""
        return all(h.ready(k) for h in self.handles)

    def release(self, k: int) -> None:
        """Batch ``k`` was delivered: each set may evict what no later batch needs."""
        for h in self.handles:
            h.release(k)

    def close(self) -> None:
        """Stop every set's prefetch; idempotent."""
        for h in self.handles:
            h.close()
