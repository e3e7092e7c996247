"""The consumer side of the prefetch planner (planner.py): what the Prefetch handle and
the readers of this process call, from their own threads, on the state the planner's thread
fills: wait for a batch, ask if it is ready, wait for one record, release a batch (evicting
what no later batch needs), close. Every method takes the planner's condition first.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from dlpack_io.reader.remote.planmsg import rewrap as _rewrap, timeout_message

ABSENT, REQUESTED, PRESENT = 0, 1, 2  # the state of each planned item


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
                    raise _rewrap(self.error, k)
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
                raise _rewrap(self.error, k)
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
                    raise _rewrap(self.error, -1)
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
        try:
            self._loop.call_soon_threadsafe(self._main.cancel)
        except (AttributeError, RuntimeError):
            pass  # not started yet (it checks `closed`) or already finished
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=self.store.policy.request_timeout + 5)
        with self.cond:
            self._evict(np.flatnonzero(self.state == PRESENT))
