"""The prefetch planner: fetch what the next batches need, ahead, into the verified cache.

It runs in the process that opened the data set, on one thread with an asyncio event loop,
never in a Loader worker. Mode "records" fetches each batch's records as coalesced byte
ranges (records kept by an earlier epoch or run are not fetched again, see keep.py); mode
"shards" fetches whole shards into the shared pool. Batches are planned in consumption
order and started when their bytes fit in ``cache_limit`` next to what unreleased batches
hold; an item is evicted when the last batch needing it is released. Records are CRC-checked
before they land (a file each, or in place: growing.py); a failed request fails every wait.

The prefetch protocol of a remote Dataset (see docs/remote.md):

    prefetch = dataset.start_prefetch(batches)   # this rank's upcoming batches, in order
    prefetch.wait(k)      # every record of batch k is verified in the cache (or an error)
    prefetch.ready(k)     # the same question, without blocking
    prefetch.release(k)   # batch k delivered: what no later batch needs may be evicted
    prefetch.close()      # stop; idempotent (also when the handle is garbage collected)
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dlpack_io.reader.remote import fetchplan
from dlpack_io.reader.remote.assembled import cached
from dlpack_io.reader.remote.fetchplan import (ABSENT, PRESENT, REQUESTED, ahead_masks,
                                               fetch_spans, fill_first, fill_inflight,
                                               fill_range_bytes, first_use, range_requests,
                                               read_ahead)
from dlpack_io.reader.remote.keep import (FILL_FIRST, FILL_MIN_BYTES, FULL, READ_AHEAD,
                                          CacheFull, FullCacheSide, publish_records,
                                          split_limit)
from dlpack_io.reader.remote.prefetch import ConsumerSide, warn_overcommit

log = logging.getLogger(__name__)
HOLD_FILL = True  # a fill after batch 0 starts when batch 0's requests are done


def _closing(sink, receive):
    """``receive`` (run on a receiving thread) that closes ``sink`` when it ends, also when
    the task that waits for it was cancelled meanwhile."""
    def run():
        try:
            return receive()
        finally:
            sink.close()
    return run


class Planner(ConsumerSide, FullCacheSide):
    """The state and thread behind a Prefetch handle (reader/remote/prefetch.py): this
    class fetches; what consumers call (wait, ready, release, close) is in prefetch.py;
    how reading goes on when the cache_dir's file system is full, in keep.py."""

    def __init__(self, source, plan, shards, *, max_inflight: int, gap: int, max_request: int,
                 bridge_gap: int = 0, fill_bytes: int = 0, fill_inflight: int = 4):
        self.source, self.plan, self.shards = source, plan, shards
        self.store, self.session, self.limit = source.store, source.session, source.cache_limit
        self.max_inflight, self.gap, self.max_request = max_inflight, gap, max_request
        self.state = np.zeros(len(plan.size), dtype=np.int8)
        self.released = np.zeros(len(plan.needs), dtype=bool)
        self.transient = np.zeros(len(plan.size), dtype=bool)  # in the session, not kept
        self.held = 0  # records mode: what epoch 0 fetched stays for later ones (keep.py);
        # held counts only the transient rest, within what the kept records leave of the limit
        self.keep_budget, self.limit = split_limit(int(source.lengths.sum()), self.limit,
                                                   plan.max_batch_bytes()[0], plan.mode)
        self.ahead = plan.mode == "records" and self.keep_budget >= int(source.lengths.sum())
        self.grow = source.growing if self.ahead else None  # records land in place
        self.bridge = bridge_gap if self.ahead and (plan.last_use >= 0).all() else 0  # keep.py
        self.fill = (fill_bytes, fill_inflight) if self.grow is not None and fill_bytes else None
        self.ends = np.array([source.first_sample(k) + len(s) for k, s in enumerate(shards)])
        self.stats = {"requests": 0, "bytes_fetched": 0, "max_held": 0, "evicted": 0,
                      "cached": 0}
        self.cond = threading.Condition()
        self.error, self.closed, self.waiting_budget = None, False, None
        self.demand, self._warned = -1, False  # the highest batch a consumer waits for
        self.receiving: set = set()  # RangeSinks of ranges being received in place
        self._loop = self._budget = self._main = self._lander = None
        self.thread = threading.Thread(target=self._run, name="dlpack-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # records growing in place land one range at a time, on one thread: concurrent
        # writes into one file contend for its inode lock, and the kernel spins for it
        # (ranges received straight into it are written by a thread each: receive_range)
        self._lander = ThreadPoolExecutor(1, thread_name_prefix="dlpack-land") \
            if self.grow is not None else None
        receives = self.grow is not None or self.plan.mode == "shards"  # straight into files
        self._receivers = ThreadPoolExecutor(min(self.max_inflight, 8), thread_name_prefix=
                                             "dlpack-receive") if receives else None
        try:
            asyncio.run(self._plan_all())
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # surfaced to every wait()
            with self.cond:
                self.error = exc
                self.cond.notify_all()
        finally:
            for pool in (self._lander, self._receivers):
                if pool is not None:
                    pool.shutdown()
            if self._receivers is not None:  # (the next prefetch opens its own)
                self.store.close_connections()

    async def _plan_all(self) -> None:
        self._loop, self._budget = asyncio.get_running_loop(), asyncio.Event()
        self._main = asyncio.current_task()
        sem, tasks = asyncio.Semaphore(self.max_inflight), set()
        self._tasks = tasks  # keep.py adds its refetches
        filled = False
        for k, items in enumerate(self.plan.needs):
            if k == 0 and self.fill:  # a small data set: all of it first, batch 0 with it
                filled = await self._fill(sem, tasks, first=True)
            with self.cond:
                if self.closed:
                    return
                absent = self.state[items] == ABSENT
            todo, pos = await self._take_kept(k, items, absent)
            await self._admit(k, todo)
            for request in self._requests(todo, pos, k):
                await sem.acquire()
                self._spawn(tasks, request, sem)
            if k == 0 and self.fill and not filled:  # else the rest once batch 0 is in
                if HOLD_FILL and tasks:  # (its large ranges would slow batch 0's requests)
                    await asyncio.wait(set(tasks))
                await self._fill(sem, tasks)
        while tasks:
            await asyncio.gather(*list(tasks))

    async def _fill(self, sem, tasks, first: bool = False) -> bool:
        """(Everything kept) every record of this plan not requested yet in few large ranges
        (up to ``fill_bytes``, fewer when ``fill_inflight`` of them would not be busy:
        fill_range_bytes; ``fill_inflight`` at once; other ranks' records are not fetched,
        so a rank's share may be small ranges: then ``max_inflight`` at once),
        those the epoch needs first first: later batches find them requested. ``first``
        (before batch 0): only when it is all within FILL_FIRST times batch 0's bytes."""
        with self.cond:
            todo = np.flatnonzero((self.state == ABSENT) & (self.plan.last_use >= 0))
        if first and not fill_first(self.plan, todo, FILL_FIRST):
            return False
        todo = todo[~await self._found(todo)] if len(todo) else todo
        await self._admit(0, todo)
        largest = fill_range_bytes(int(self.plan.size[todo].sum()), *self.fill, FILL_MIN_BYTES)
        requests = range_requests(todo, first_use(self.plan)[todo],
                                  self.source.dataset_lookup(todo),
                                  gap=self.bridge or self.gap, max_bytes=largest)
        fill_sem = asyncio.Semaphore(fill_inflight(requests, largest, self.fill[1],
                                                   self.max_inflight))
        for request in requests:
            await fill_sem.acquire()
            await sem.acquire()
            self._spawn(tasks, request, sem, fill_sem)
        return True

    def _spawn(self, tasks: set, request, *sems) -> None:
        task = asyncio.ensure_future(self._fetch(request, *sems))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _admit(self, k: int, todo: np.ndarray) -> None:
        """Reserve ``todo`` for batch ``k``, waiting while the budget has no room."""
        nbytes = int(self.plan.size[todo].sum())
        while True:  # clear first: a release() landing after the check wakes the wait
            self._budget.clear()
            if self._reserve(k, todo, nbytes):
                return
            await self._budget.wait()

    async def _found(self, todo: np.ndarray) -> np.ndarray:
        """Mask of ``todo`` verified in the cache already (now PRESENT)."""
        found = await self._loop.run_in_executor(None, cached, self.source, self.grow, todo,
                                                 self.keep_budget)
        if found.any():
            with self.cond:
                self.bridge = 0  # a cache holding records already (a repair, a resume): as is
                self.state[todo[found]] = PRESENT
                self.stats["cached"] += int(found.sum())
                self.cond.notify_all()
        return found

    async def _take_kept(self, k: int, items: np.ndarray, absent: np.ndarray):
        """(items to fetch, positions in batch k): the absent ones not verified in the cache."""
        todo = items[absent]
        pos = self.plan.first_pos[k][absent] if self.plan.first_pos else None
        if self.plan.mode != "records" or not len(todo):
            return todo, pos
        if self.ahead and k > 0:  # not for batch 0: its first batch must come fast
            with self.cond:
                eligible, passable = ahead_masks(self.state == ABSENT, self.plan.last_use, k,
                                                 self.bridge > 0)
            todo, pos = read_ahead(todo, pos, eligible, self.plan.size,
                                   self.ends[self.source.shard_of(todo)], READ_AHEAD, passable)
        found = await self._found(todo)
        return todo[~found], pos[~found]

    def _reserve(self, k: int, todo: np.ndarray, nbytes: int) -> bool:
        with self.cond:
            if self.closed:
                raise asyncio.CancelledError()
            if self.held + nbytes > self.limit and self.held > 0:
                if k > self.demand:
                    self.waiting_budget = k
                    return False
                if not self._warned:  # holding more than the limit beats a deadlock
                    self._warned = True
                    warn_overcommit(self.source.url, self.limit, self.held + nbytes)
            self.waiting_budget = None
            self.state[todo] = REQUESTED
            self.held += nbytes
            self.stats["max_held"] = max(self.stats["max_held"], self.held)
            return True

    def _requests(self, items: np.ndarray, positions, k: int) -> list:
        """The requests that fetch ``items`` for batch ``k`` (shards, or record ranges)."""
        if self.plan.mode == "shards":
            return [("shard", int(s)) for s in items]
        return range_requests(items, positions, self.source.dataset_lookup(items),
                              gap=self.bridge if self.bridge and k else self.gap,
                              max_bytes=self.max_request)

    async def _fetch(self, request, *sems) -> None:
        try:
            if request[0] == "shard":
                await self._fetch_shard(request[1])
            elif request[0] in ("again", "land"):  # keep.py
                await (self._again(request[1]) if request[0] == "again" else
                       self._land_later(*request[1:]))
            else:
                await self._fetch_range(*request[1:])
        except BaseException as exc:
            with self.cond:
                self.error = self.error or exc
                self.cond.notify_all()
            self._main.cancel()
            if not isinstance(exc, Exception):  # cancelled: the task ends as cancelled
                raise  # (an error is every wait()'s now, not left for asyncio to log)
        finally:
            for sem in sems:
                sem.release()

    async def _fetch_range(self, k, start, end, samples, local, entries) -> None:
        if self.grow is not None and self.store.receives_directly() and \
                await self._receive(self.grow, k, start, end, samples, local, entries):
            return
        data, pieces = await fetch_spans(self.store, self.shards[k], start, end, local, entries,
                                         self.source.url, self._count)
        try:  # (the one landing thread only while records grow in place)
            await self._loop.run_in_executor(self._lander if self.grow is not None else None,
                                             self._land, k, data, start, samples, local,
                                             entries, pieces)
        except CacheFull as full:  # the rest lands once there is room (keep.py), in a
            a = full.at  # task of its own: this one ends, and frees its place in flight
            self._spawn(self._tasks, ("land", full, k, data, start, samples[a:], local[a:],
                                      entries[a:], pieces[a:]))

    async def _receive(self, grow, k, start, end, samples, local, entries) -> bool:
        """Records growing in place (``grow``): bytes ``start``-``end`` of shard ``k``
        received straight into its growing file (Store.receive_range), checked as they pass,
        then marked present; False when that way is closed or did not work out (nothing was
        marked: the caller fetches and lands them as before, its checks and messages as
        ever)."""
        sink = await self._loop.run_in_executor(self._lander, grow.receiver, k, entries,
                                                start, self.keep_budget, lambda: self.closed)
        if sink is None:
            return False
        shard = self.shards[k]
        try:
            got = await self._received(shard.name, start, end, shard.etag, sink)
        except OSError as exc:  # writing into the growing file: the usual way says how
            log.debug("%s: receiving bytes %d-%d into %s failed: %s", shard.path, start,
                      end - 1, grow.path(k), exc)
            return False
        if not got:
            return False
        self._count(1, end - start)
        bad = sink.failed()
        if bad is not None:
            log.warning("%s record at byte %d: checksum mismatch in the downloaded bytes; "
                        "fetching bytes %d-%d again", shard.path, sink.offsets[bad], start,
                        end - 1)
            return False
        return await self._loop.run_in_executor(self._lander, self._land_received, grow, k,
                                                samples, local)

    async def _received(self, name: str, start: int, end: int, etag, sink) -> bool:
        """Bytes ``start``-``end`` of object ``name`` read straight into ``sink`` on a
        receiving thread (Store.receive_range; ``close()`` interrupts it); False when that
        way is closed here or did not deliver them (then ask through the client). What the
        sink raises propagates; the sink is closed either way."""
        if self._receivers is None or not self.store.receives_directly():
            sink.close()
            return False
        receive = functools.partial(self.store.receive_range, name, start, end, etag=etag,
                                    sink=sink)
        self.receiving.add(sink)  # close() interrupts it (prefetch.py)
        try:
            return await self._loop.run_in_executor(self._receivers, _closing(sink, receive))
        finally:
            self.receiving.discard(sink)

    def _land_received(self, grow, k, samples, local) -> bool:
        """(The landing thread) records of shard ``k`` received in place: marked present, as
        ``_land`` marks those it writes; False on a full disk (they land the usual way)."""
        try:
            grow.mark(k, local)
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            log.warning("%s; records land one file each from now on", exc)
            self.grow = None
            return False
        self._mark_present(samples, np.ones(len(samples), dtype=bool))
        grow.finish(k)
        return True

    def _land(self, k, data, start, samples, local, entries, pieces) -> None:
        """(An executor thread) verified records of shard ``k`` into the cache: in place in its
        growing file when all is kept (growing.py), else a file each; then tell the waiters."""
        with self.cond:
            evicted = self.stats["evicted"]
        if self.grow is not None and self.grow.start(k, self.keep_budget):
            try:
                self.grow.land(k, data, start, local, entries)
                self._mark_present(samples, np.ones(len(samples), dtype=bool))
                self.grow.finish(k)
                return
            except OSError as exc:  # a full disk: from now on record by record (streamed)
                if exc.errno not in FULL:
                    raise
                log.warning("%s; records land one file each from now on", exc)
                self.grow = None
        try:
            kept = publish_records(self.source.keeper, self.session, k, samples, local, pieces,
                                   self.keep_budget)
        except CacheFull as full:  # those before it landed; _fetch_range waits for room
            full.evicted = evicted
            self._mark_present(samples[:full.at], full.kept)
            raise
        self._mark_present(samples, kept)
        self.source.whole.after_publish(k, self.keep_budget)

    async def _fetch_shard(self, k: int) -> None:
        from dlpack_io.reader.remote.shardfetch import fetch_shard

        shard = self.shards[k]
        fetched = await fetch_shard(self.store, shard, self.source.cache, self.session,
                                    self.limit, max_parts=max(2, self.max_inflight // 4),
                                    receive=self._received, stopped=lambda: self.closed)
        self._count(fetched["requests"], fetched["bytes"])
        self._mark_present(np.array([k]))

    def _count(self, requests: int, nbytes: int) -> None:
        self.stats["requests"] += requests
        self.stats["bytes_fetched"] += nbytes
        self.source.bytes_fetched += nbytes

    def _mark_present(self, items, kept=None) -> None:
        with self.cond:
            if self.closed:
                return
            self.state[items] = PRESENT
            self.transient[items if kept is None else items[~kept]] = True
            if kept is not None:  # reserved as transient, but kept: not held against the budget
                self.held -= int(self.plan.size[items[kept]].sum())
            last = self.plan.last_use[items]
            self._evict(items[self.released[np.maximum(last, 0)] & (last >= 0)])  # released early
            self.cond.notify_all()
        self._wake()  # a record waiting for room in a full cache_dir may evict these


def start(source, batches, *, mode=None) -> "Prefetch":
    """Plan ``batches`` for RemoteSource ``source`` and start fetching (see the module doc)."""

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
    mode = mode or source.fetch_mode or fetchplan.auto_mode(
        batches, source.shard_of, sizes, source.cache_limit, int(source.lengths.sum()))
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
