"""The prefetch planner: fetch what the next batches need, ahead, into the verified cache.

It runs in the process that opened the data set, on one thread with an asyncio event loop
(many requests in flight, no thread per request), never in a Loader worker. Mode "records"
fetches each batch's records as coalesced byte ranges; mode "shards" fetches whole shards
into the shared pool (reused by later epochs and processes). Either way batches are planned
in consumption order and a batch is started only when its bytes fit in ``cache_limit`` next
to what unreleased batches hold; an item is evicted when the last batch needing it is
released (the future order is known, so nothing still needed is ever evicted). Every record
is checked against its CRC before its file appears (atomic rename); a failed request (after
the store's retries and deadline) fails every ``wait`` with the store's message.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

import numpy as np

from dlpack_io.reader.remote import cache as cache_mod
from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote.fetchplan import range_requests
from dlpack_io.reader.remote.recordspan import extents, mismatch
from dlpack_io.reader.remote.storage import StorageError

log = logging.getLogger(__name__)
ABSENT, REQUESTED, PRESENT = 0, 1, 2


class Planner:
    """The state and thread behind a Prefetch handle (reader/remote/prefetch.py)."""

    def __init__(self, source, plan, shards, *, max_inflight: int, gap: int, max_request: int):
        self.source, self.plan, self.shards = source, plan, shards
        self.store, self.session, self.limit = source.store, source.session, source.cache_limit
        self.max_inflight, self.gap, self.max_request = max_inflight, gap, max_request
        self.state = np.zeros(len(plan.size), dtype=np.int8)
        self.released = np.zeros(len(plan.needs), dtype=bool)
        self.held = 0
        self.stats = {"requests": 0, "bytes_fetched": 0, "max_held": 0, "evicted": 0}
        self.cond = threading.Condition()
        self.error, self.closed, self.waiting_budget = None, False, None
        self.demand, self._warned = -1, False  # the highest batch a consumer waits for
        self._loop = self._budget = self._main = None
        self.thread = threading.Thread(target=self._run, name="dlpack-prefetch", daemon=True)
        self.thread.start()

    # ---- the planner thread -----------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._plan_all())
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # surfaced to every wait()
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    async def _plan_all(self) -> None:
        self._loop, self._budget = asyncio.get_running_loop(), asyncio.Event()
        self._main = asyncio.current_task()
        sem, tasks = asyncio.Semaphore(self.max_inflight), set()
        for k, items in enumerate(self.plan.needs):
            with self.cond:
                if self.closed:
                    return
                absent = self.state[items] == ABSENT
                todo = items[absent]
            nbytes = int(self.plan.size[todo].sum())
            while True:  # clear first: a release() landing after the check wakes the wait
                self._budget.clear()
                if self._reserve(k, todo, nbytes):
                    break
                await self._budget.wait()
            pos = self.plan.first_pos[k][absent] if self.plan.first_pos else None
            for request in self._requests(todo, pos):
                await sem.acquire()
                task = asyncio.ensure_future(self._fetch(request, sem))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))

    def _reserve(self, k: int, todo: np.ndarray, nbytes: int) -> bool:
        with self.cond:
            if self.closed:
                raise asyncio.CancelledError()
            if self.held + nbytes > self.limit and self.held > 0:
                if k > self.demand:
                    self.waiting_budget = k
                    return False
                self._overcommit(k, nbytes)
            self.waiting_budget = None
            self.state[todo] = REQUESTED
            self.held += nbytes
            self.stats["max_held"] = max(self.stats["max_held"], self.held)
            return True

    def _overcommit(self, k: int, nbytes: int) -> None:
        """A consumer blocks on batch k while the batches before it (not yet released)
        fill cache_limit: holding more than the limit beats a deadlock. Say so once."""
        if not self._warned:
            self._warned = True
            log.warning("%s: cache_limit %s bytes is smaller than the %s bytes of the batches "
                        "the loader keeps in flight; holding them anyway (raise cache_limit to "
                        "let the prefetcher run ahead)", self.source.url, f"{self.limit:,}",
                        f"{self.held + nbytes:,}")

    def _requests(self, items: np.ndarray, positions) -> list:
        """The requests that fetch ``items`` (whole shards, or coalesced record ranges)."""
        if self.plan.mode == "shards":
            return [("shard", int(s)) for s in items]
        return range_requests(items, positions, self.source.dataset_lookup(items),
                              gap=self.gap, max_bytes=self.max_request)

    async def _fetch(self, request, sem) -> None:
        try:
            if request[0] == "shard":
                await self._fetch_shard(request[1])
            else:
                await self._fetch_range(*request[1:])
        except BaseException as exc:
            with self.cond:
                self.error = self.error or exc
                self.cond.notify_all()
            self._main.cancel()
            raise
        finally:
            sem.release()

    async def _fetch_range(self, k, start, end, samples, local, entries) -> None:
        shard = self.shards[k]
        data = memoryview(await self.store.aget_range(shard.name, start, end, etag=shard.etag))
        self.stats["requests"] += 1
        self.stats["bytes_fetched"] += end - start
        self.source.bytes_fetched += end - start
        for j, e, length in zip(local.tolist(), entries, extents(entries).tolist()):
            off = int(e["offset"]) - start
            piece = data[off:off + length]  # the image and its field block (recordspan.py)
            bad = mismatch(piece, e)  # "image", "field block" or "span"
            if bad is not None:
                raise fmt.FormatError(
                    f"{shard.path} record {j} (bytes {int(e['offset'])}-{int(e['offset']) + length - 1}):"
                    f" {bad} checksum mismatch in the downloaded bytes: the object in the bucket is "
                    f"damaged or was replaced; run 'dlpack verify {self.source.url}'")
            cache_mod.publish(self.session.record_path(k, j), piece, base=self.session.dir)
        self._mark_present(samples)

    async def _fetch_shard(self, k: int) -> None:
        from dlpack_io.reader.remote.shardfetch import fetch_shard

        shard = self.shards[k]
        fetched = await fetch_shard(self.store, shard, self.source.cache, self.session,
                                    self.limit, max_parts=max(2, self.max_inflight // 4))
        self.stats["requests"] += fetched["requests"]
        self.stats["bytes_fetched"] += fetched["bytes"]
        self.source.bytes_fetched += fetched["bytes"]
        self._mark_present(np.array([k]))

    def _mark_present(self, items) -> None:
        with self.cond:
            if self.closed:
                return
            self.state[items] = PRESENT
            last = self.plan.last_use[items]
            self._evict(items[self.released[np.maximum(last, 0)] & (last >= 0)])  # released early
            self.cond.notify_all()

    # ---- the consumer side -------------------------------------------------------------
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
                    raise TimeoutError(self._timeout_message(k, limit))
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

    def _timeout_message(self, k: int, waited: float) -> str:
        items = self.plan.needs[k]
        missing = int(np.count_nonzero(self.state[items] != PRESENT))
        stall = ""
        if self.waiting_budget is not None and self.waiting_budget <= k:
            stall = (f"; the prefetcher is waiting for cache space (cache_limit "
                     f"{self.limit:,} bytes, {self.held:,} held by batches not yet released): "
                     f"release delivered batches or raise cache_limit")
        return (f"{self.source.url}: batch {k} not ready after {waited:.1f} s: {missing} of its "
                f"{len(items)} {self.plan.mode} not in the cache yet{stall}. Check that the "
                f"endpoint ({self.store.options.get('endpoint') or 'AWS default'}) is reachable")

    def release(self, k: int) -> None:
        items = self.plan.needs[k]
        with self.cond:
            if self.released[k] or self.closed:
                return
            self.released[k] = True
            done = items[(self.plan.last_use[items] <= k) & (self.state[items] == PRESENT)]
            self._evict(done)
        self._wake()

    def _wake(self) -> None:
        """Tell the planner that budget came free (nothing to do once it has finished)."""
        try:
            self._loop.call_soon_threadsafe(self._budget.set)
        except (AttributeError, RuntimeError):
            pass  # not started yet (it checks the budget itself) or already finished

    def _evict(self, items) -> None:
        """Delete cached items (lock held) and give their bytes back to the budget."""
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
        self.state[items] = ABSENT
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


def _rewrap(exc: BaseException, k: int) -> BaseException:
    """The planner's error, raised again in the waiting thread (same type and message)."""
    if isinstance(exc, (StorageError, fmt.FormatError, ValueError, OSError)):
        try:
            new = type(exc)(f"{exc} (while prefetching batch {k} and earlier)")
            new.__cause__ = exc
            return new
        except TypeError:
            pass
    return RuntimeError(f"prefetch failed before batch {k}: {exc!r}")
