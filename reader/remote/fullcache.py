"""Reading on when the cache_dir's file system is full (mixed into planner.Planner).

A full disk (ENOSPC, a quota, a file size limit) is not the end of reading while the data can
still be streamed. In order: records stop being kept for later epochs (keep.py says so once,
naming the folder and the fix), and pass through the session folder instead; a growing
shard that cannot be written switches the planner to a file per record; a range the session
has no room for waits (on the event loop: no thread, no place in flight is held) until room
comes: the consumer releasing a batch (its session files go), kept files of batches already
released (removed: they cannot stay anyway), or records of later batches that landed early
(removed, and fetched again once their turn is near). No more bytes are admitted in flight
than what fitted. Only when none of these can make room is it an OSError naming the folder
and the fix (free space there, another cache_dir).
"""
from __future__ import annotations

import logging

import numpy as np

from dlpack_io.reader.remote.fetchplan import first_use, range_requests
from dlpack_io.reader.remote.keep import CacheFull
from dlpack_io.reader.remote.planwaits import ABSENT, PRESENT, REQUESTED

log = logging.getLogger(__name__)


class FullCacheSide:
    """Mixed into Planner (its attributes: planner.py)."""

    _waiting: list | None = None  # the batches of ranges waiting for room (a multiset)
    _roomless: np.ndarray | None = None  # their records: fetched, not landing by themselves

    async def _land_later(self, full, k, data, start, samples, local, entries, pieces) -> None:
        """Land records ``samples`` of a range (``data`` from shard offset ``start``) that
        found no room (``full``) once there is room, as many times as it takes."""
        need = int(first_use(self.plan)[samples].min())
        with self.cond:
            self._waiting = (self._waiting or []) + [need]
            if self._roomless is None:
                self._roomless = np.zeros(len(self.state), dtype=np.int32)
            self._roomless[samples] += 1
        try:
            while len(samples):
                await self._room(full, samples, need)
                try:
                    await self._loop.run_in_executor(None, self._land, k, data, start,
                                                     samples, local, entries, pieces)
                    return
                except CacheFull as again:
                    full, a = again, again.at
                    samples, local, entries = samples[a:], local[a:], entries[a:]
                    pieces = pieces[a:]
        finally:
            with self.cond:
                self._waiting.remove(need)
                self._roomless[samples] -= 1

    async def _room(self, full, pending: np.ndarray, need: int) -> None:
        """Wait for room for ``pending`` (records of batch ``need`` on: ``full``, a
        keep.CacheFull); OSError naming the folder when none can come."""
        with self.cond:
            evicted = self.stats["evicted"]
            if self.limit > self.held:  # what fits is what is held: admit no more than that
                log.warning("%s: %s; at most %d bytes of batches in flight from now on (free "
                            "space there, or pass another cache_dir)", full.folder,
                            full.strerror, self.held)
                self.limit, self._warned = max(1, self.held), True  # (not "raise cache_limit")
        while True:  # clear first: a release() landing after the check wakes the wait
            self._budget.clear()
            with self.cond:
                if self.closed or self.error is not None:
                    raise full  # closed, or failed elsewhere: nothing lands any more
                if self.stats["evicted"] != evicted or self._unkeep(pending):
                    return
                if self.released[:need].all():
                    later = self._make_way(need)  # no release can come before ``need``
                    landing = (self.state == REQUESTED) & (first_use(self.plan) > need) & \
                        (self._roomless == 0)
                    if len(later):
                        self._spawn(self._tasks, ("again", later))
                        return
                    if not landing.any():
                        raise OSError(full.errno, f"{full.strerror}: {full.folder} (in "
                                                  f"cache_dir {self.source.cache_dir}) has no "
                                                  f"room for the records of batch {need}, even "
                                                  f"streamed; free space there, or pass "
                                                  f"another cache_dir")
            await self._budget.wait()

    def _unkeep(self, pending: np.ndarray) -> bool:
        """(Condition held) Remove kept record files of batches the consumer released, for
        room for ``pending``; whether anything was freed (counted as evicted)."""
        keeper = self.source.keeper
        if self.plan.mode != "records" or not len(keeper.kept):
            return False
        last = self.plan.last_use
        done = np.flatnonzero(keeper.kept[:len(last)] & (last >= 0) &
                              self.released[np.maximum(last, 0)])
        freed = keeper.drop(done.tolist(), [self.source.locate(s) for s in done.tolist()],
                            self.plan.size[done], 2 * int(self.plan.size[pending].sum()))
        if freed:
            log.warning("%s: full; %d bytes of records kept for later epochs removed to stream "
                        "this epoch (free space there, or pass another cache_dir)",
                        keeper.dir, freed)
            self.stats["evicted"] += 1
        return freed > 0

    def _make_way(self, need: int) -> np.ndarray:
        """(Condition held) Remove the session files, else the kept files, of records first
        needed after batch ``need`` (landed early); returns them, to be fetched again
        (``_again``) when their turn comes."""
        first, keeper = first_use(self.plan), self.source.keeper
        later = np.flatnonzero(self.transient & (self.state == PRESENT) & (first > need))
        if len(later):
            self._evict(later)
        elif self.plan.mode == "records" and len(keeper.kept):
            later = np.flatnonzero(keeper.kept[:len(first)] & (self.state == PRESENT) &
                                   (first > need))
            keeper.drop(later.tolist(), [self.source.locate(s) for s in later.tolist()],
                        self.plan.size[later], int(self.plan.size[later].sum()))
            self.state[later] = ABSENT
        if len(later):
            log.warning("%s: full; %d records of later batches removed to make room for batch "
                        "%d, fetched again when their turn comes", self.source.cache.root,
                        len(later), need)
        return later

    async def _again(self, items: np.ndarray) -> None:
        """Fetch ``items`` (removed by ``_make_way``) again once the consumer released the
        batch before the first that needs them."""
        first = int(first_use(self.plan)[items].min())
        while True:
            self._budget.clear()
            with self.cond:
                if self.closed or self.error is not None:
                    return
                if first == 0 or self.released[first - 1]:
                    todo = items[self.state[items] == ABSENT]
                    break
            await self._budget.wait()
        await self._admit(first, todo)
        for request in range_requests(todo, first_use(self.plan)[todo],
                                      self.source.dataset_lookup(todo), gap=self.gap,
                                      max_bytes=self.max_request):
            await self._fetch_range(*request[1:])
