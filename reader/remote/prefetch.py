"""The prefetch protocol of a remote Dataset (see docs/remote.md):

    prefetch = dataset.start_prefetch(batches)   # this rank's upcoming batches, in order
    prefetch.wait(k)      # every record of batch k is verified in the cache (or an error)
    prefetch.ready(k)     # the same question, without blocking
    prefetch.release(k)   # batch k delivered: what no later batch needs may be evicted
    prefetch.close()      # stop; idempotent (also when the handle is garbage collected)

The work is done by reader/remote/planner.py in the process that opened the data set.
"""
from __future__ import annotations

import os
import weakref

import numpy as np

from dlpack_io.reader.remote import fetchplan


def start(source, batches, *, mode=None) -> "Prefetch":
    """Plan ``batches`` for RemoteSource ``source`` and start fetching (see the module doc)."""
    from dlpack_io.reader.remote.planner import Planner

    if not source.session.owner or source.store.owner_pid not in (None, os.getpid()):
        raise RuntimeError(f"{source.url}: start_prefetch must be called in the process that "
                           f"opened the data set (pid {source.store.owner_pid}), not a worker")
    active = source.active_prefetch()
    if active is not None:
        active.close()
    batches = [np.asarray(b, dtype=np.int64) for b in batches]
    n = len(source.lengths)
    for b in batches:
        if b.size and (b.min() < 0 or b.max() >= n):
            raise IndexError(f"{source.url}: a batch holds sample {int(b.max())}, the data set "
                             f"has {n}")
    sizes = [e["bytes"] for e in source.manifest["shards"]]
    mode = mode or source.fetch_mode or fetchplan.auto_mode(batches, source.shard_of, sizes,
                                                            source.cache_limit)
    plan = fetchplan.make_plan(mode, batches, source.shard_of, source.lengths, sizes)
    fetchplan.check_limit(plan, source.cache_limit, source.url)
    if mode == "records":  # files found in the records folder are counted before keeping
        source.keeper.reconcile()
    handle = Prefetch(Planner(source, plan, source.shards, **source.fetch_options))
    source.set_active_prefetch(handle)
    return handle


class Prefetch:
    """Handle returned by ``Dataset.start_prefetch``; dropping it stops the planner."""

    def __init__(self, planner):
        self._planner = planner
        self._finalizer = weakref.finalize(self, planner.close)

    @property
    def mode(self) -> str:
        """"records" or "shards"."""
        return self._planner.plan.mode

    @property
    def stats(self) -> dict:
        """Requests made, bytes fetched, bytes held now and at most, items evicted."""
        return dict(self._planner.stats)

    def wait(self, k: int, timeout: float | None = None) -> None:
        """Block until every record of batch ``k`` is verified in the cache; raises the
        fetch error, or TimeoutError after ``timeout`` (default: the store's deadline)."""
        self._planner.wait(k, timeout)

    def ready(self, k: int) -> bool:
        """Non-blocking: True when every record of batch ``k`` is in the cache (raises the
        fetch error if there was one). Lets a loader keep submitting ready batches while
        waiting only for the one it must deliver next."""
        return self._planner.ready(k)

    def wait_record(self, shard: int, sample: int) -> bool:
        """For a record read outside the batch order: True once the planner has it in the
        cache (waiting while it is in flight), False when no planned batch holds it."""
        return self._planner.wait_record(shard, sample)

    def release(self, k: int) -> None:
        """Batch ``k`` was delivered: evict what no later batch needs."""
        self._planner.release(k)

    def close(self) -> None:
        """Stop the planner thread and drop what it holds in the cache; idempotent."""
        self._finalizer()
