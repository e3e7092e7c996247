"""The consumer side of the prefetch planner (reader/remote/planner.py): what the
``Prefetch`` handle and the readers of this process call, from their own threads, on the
state the planner's thread fills (wait for a batch, ask if it is ready, wait for one record,
release a batch, close), and the messages a late batch or a failed fetch raises there."""
from __future__ import annotations

import copy
import logging
import os
import threading
import time

import numpy as np

from dlpack_io.reader.remote.fetchplan import ABSENT, PRESENT

# Messages of the prefetch planner: a batch not ready in time, an error re-raised in the
# waiting thread (kept apart from planner.py so the planner stays one screenful per job).

log = logging.getLogger("dlpack_io.reader.remote.planner")


def warn_overcommit(url: str, limit: int, need: int) -> None:
    """A consumer blocks on a batch while the batches before it (not yet released) fill
    cache_limit: the planner holds ``need`` bytes anyway (beats a deadlock); say so."""
    log.warning("%s: cache_limit %s bytes is smaller than the %s bytes of the batches the "
                "loader keeps in flight; holding them anyway (raise cache_limit to let the "
                "prefetcher run ahead)", url, f"{limit:,}", f"{need:,}")


def timeout_message(self, k: int, waited: float, missing: int) -> str:
    """Why batch ``k`` of planner ``self`` (``missing`` items absent) is not ready after
    ``waited`` seconds."""
    items = self.plan.needs[k]
    stall = ""
    if self.waiting_budget is not None and self.waiting_budget <= k:
        stall = (f"; the prefetcher is waiting for cache space (cache_limit "
                 f"{self.limit:,} bytes, {self.held:,} held by batches not yet released): "
                 f"release delivered batches or raise cache_limit")
    if getattr(self, "_waiting", None):  # keep.py: ranges fetched, waiting for room
        return (f"{self.source.url}: batch {k} not ready after {waited:.1f} s: {missing} of "
                f"its {len(items)} {self.plan.mode} not in the cache yet; the cache_dir "
                f"{self.source.cache_dir} is full and {len(self._waiting)} fetched ranges wait "
                f"for room there: free space there, or pass another cache_dir")
    return (f"{self.source.url}: batch {k} not ready after {waited:.1f} s: {missing} of its "
            f"{len(items)} {self.plan.mode} not in the cache yet{stall}. Check that the "
            f"endpoint ({self.store.options.get('endpoint') or 'AWS default'}) is reachable")


def rewrap(exc: BaseException, k: int) -> BaseException:
    """The planner's error, raised again in the waiting thread: the same type (a caller that
    catches ``ShardChangedError``, ``StorageError`` or ``OSError`` still catches it), its
    attributes (``errno``, ``path``...) and its message, plus which batch was waited for."""
    note = f"(while prefetching batch {k} and earlier)"
    if not isinstance(exc, Exception):  # a cancelled task, an interrupt: never re-raised
        return RuntimeError(f"prefetch failed before batch {k}: {exc!r}")  # as such here
    new = _same_kind(exc)
    if new is None:  # cannot be copied: the very exception, with a note for tracebacks
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        return exc
    if isinstance(new, OSError) and new.errno is not None and new.strerror:
        new.strerror = f"{new.strerror} {note}"  # str(): [Errno n] strerror (errno kept)
    else:
        new.args = (f"{exc} {note}",)
    new.__cause__ = exc
    return new


def _same_kind(exc: BaseException):
    """A fresh copy of ``exc`` (same type, args and attributes), or None."""
    try:
        new = copy.copy(exc)  # __reduce__: keeps what the constructor needs
        if type(new) is type(exc):
            return new
    except Exception:  # a constructor whose arguments are not its args
        pass
    try:
        cls = type(exc)
        new = cls.__new__(cls, *exc.args)  # no __init__: the args as they are
        if isinstance(exc, OSError):
            new.errno, new.strerror, new.filename = exc.errno, exc.strerror, exc.filename
        new.__dict__.update(getattr(exc, "__dict__", {}))
        return new
    except Exception:
        return None


# The consumer side of the prefetch planner (planner.py): what the Prefetch handle and
# the readers of this process call, from their own threads, on the state the planner's thread
# fills: wait for a batch, ask if it is ready, wait for one record, release a batch (evicting
# what no later batch needs), close. Every method takes the planner's condition first.



class ConsumerSide:
    """Mixed into Planner: the methods other threads call (its attributes: planner.py)."""

    def wait(self, k: int, timeout) -> None:
        if not 0 <= k < len(self.plan.needs):
            raise IndexError(f"batch {k}: the prefetch was started for {len(self.plan.needs)}")
        limit = self.store.policy.deadline if timeout is None else timeout
        deadline = time.monotonic() + limit
        items = self.plan.needs[k]
        with self.cond:
            if k > self.demand:  # the planner may now go past cache_limit up to batch k
                self.demand = k
                self._wake()
            while True:
                if self.error is not None:
                    raise rewrap(self.error, k)
                if self.closed:
                    raise RuntimeError(f"{self.source.url}: prefetch was closed before batch {k}")
                if np.all(self.state[items] == PRESENT):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(timeout_message(
                        self, k, limit, int(np.count_nonzero(self.state[items] != PRESENT))))
                self.cond.wait(left)

    def ready(self, k: int) -> bool:
        with self.cond:
            if self.error is not None:
                raise rewrap(self.error, k)
            if k > self.demand:  # a consumer asking about k will want it: allow it past the limit
                self.demand = k
                self._wake()
            return bool(np.all(self.state[self.plan.needs[k]] == PRESENT))

    def wait_record(self, shard: int, sample: int) -> bool:
        """(Reader threads of this process) wait for a record the plan will fetch anyway
        instead of fetching it twice; False if it is not planned (fetch it yourself)."""
        item = shard if self.plan.mode == "shards" else sample
        deadline = time.monotonic() + self.store.policy.deadline
        with self.cond:
            if self.plan.last_use[item] < 0:
                return False
            while self.state[item] != PRESENT:
                if self.error is not None:
                    raise rewrap(self.error, -1)
                left = deadline - time.monotonic()
                if self.closed or left <= 0 or (self.state[item] == ABSENT and
                                                self.released[self.plan.last_use[item]]):
                    return False
                self.cond.wait(left)
            return True

    def release(self, k: int) -> None:
        items = self.plan.needs[k]
        with self.cond:
            if self.released[k] or self.closed:
                return
            self.released[k] = True
            done = items[(self.plan.last_use[items] <= k) & (self.state[items] == PRESENT)]
            self._evict(done)
            self.cond.notify_all()  # a landing thread may wait for room (planner.py)
        self._wake()

    def _wake(self) -> None:
        """Tell the planner that budget came free (nothing to do once it has finished)."""
        try:
            self._loop.call_soon_threadsafe(self._budget.set)
        except (AttributeError, RuntimeError):
            pass  # not started yet (it checks the budget itself) or already finished

    def _evict(self, items) -> None:
        """Delete cached items (lock held) and give their bytes back to the budget; kept
        records stay (they were never held against it)."""
        self.state[items] = ABSENT
        items = items[self.transient[items]]
        self.transient[items] = False
        for item in items.tolist():
            if self.plan.mode == "records":
                k, j = self.source.locate(item)
                path = self.session.record_path(k, j)
            else:
                path = self.session.pin_path(self.shards[item].name)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.held -= int(self.plan.size[items].sum())
        self.stats["evicted"] += len(items)

    def close(self) -> None:
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.cond.notify_all()
        for sink in list(getattr(self, "receiving", ())):  # a receive waiting on the server
            self.store.interrupt(sink)  # ends now, not after request_timeout
        try:
            self._loop.call_soon_threadsafe(self._main.cancel)
        except (AttributeError, RuntimeError):
            pass  # not started yet (it checks `closed`) or already finished
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=self.store.policy.request_timeout + 5)
        with self.cond:
            self._evict(np.flatnonzero(self.state == PRESENT))
