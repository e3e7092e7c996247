"""Records kept for later epochs and later runs: the lasting part of a remote data set's cache.

Epoch 0 fetches every record once; without this, later epochs would fetch them all again.
A record the planner fetched is published (verified, atomically) into ``<key>/records/<shard>/
<record>`` when the data set's keep budget has room, and then stays: later epochs of this
process, and later runs or other ranks and jobs sharing ``cache_dir``, read it from there.

Which records stay: when the data set fits ``cache_limit`` all of them. When it does not,
the first ones fetched, up to ``cache_limit`` minus room for the batches in flight
(``ROOM_BATCHES`` of the largest batch, at most half the limit), and then no others: with a
shuffled order every record is equally likely to be needed next, so a fixed subset serves
the same share of each epoch as any eviction policy would, without deleting and fetching
again all the time (LRU under a random order would churn the whole budget every epoch for
the same hit rate).

How many bytes are kept is counted in ``records/.ledger`` (20 digits), updated under an
exclusive ``flock`` by every process, so ranks and jobs sharing the folder stay within the
budget together. Kept files are never evicted by a planner: only ``dlpack cache clear`` (which
skips data sets in use) removes them, and a file whose bytes fail their checksum is
discarded (and fetched again). cache.py's rules hold: no link followed, nothing trusted
before its checksum passed; a kept file is verified once per process and re-verified when
its inode, size or modification time changes."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import uuid

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote import cache as cache_mod
from dlpack_io.reader.remote.fetchplan import (ABSENT, PRESENT, REQUESTED, extents, first_use,
                                               mismatch, range_requests)

# How many bytes and files are kept under a records folder, counted on disk:
# regular files of ours only, nothing followed (a recount when the ledger is missing or
# damaged, and ``dlpack cache``'s report). Entries removed while they are counted (another
# process's ``dlpack cache clear``) are skipped, never an error.

def usage(records_dir: str) -> tuple[int, int]:
    """(bytes, files) of kept records under ``records_dir``: regular files of ours only,
    temporary files and links not counted, nothing followed (a shard still growing counts
    its size, as the ledger does, and no records)."""
    try:
        names = os.listdir(records_dir)
    except FileNotFoundError:
        return 0, 0
    return usage_of(records_dir, names)


def usage_of(records_dir: str, names) -> tuple[int, int]:
    """(bytes, files) of the entries ``names`` listed in ``records_dir``. Another process
    may have removed any of them since (``dlpack cache clear``): those count nothing. A
    shard assembled as ``<k>.shard`` counts once, as the ledger does: its ``<k>.grow`` (a
    second name of the same file) and ``<k>/`` (record files about to be removed) are not
    counted again."""
    total = files = 0
    assembled = set()  # its .grow (the same file) and record files (being removed) count 0
    for shard in sorted(names, key=lambda name: not name.endswith(".shard")):
        folder = os.path.join(records_dir, shard)
        st = _lstat(folder)
        if st is None or shard.removesuffix(".grow") in assembled:
            continue
        if shard.endswith(".shard") and shard[:-6].isdigit():  # assembled (assembled.py)
            if _regular_ours(st):
                total, files = total + st.st_size, files + _records_in(folder, st.st_size)
                assembled.add(shard[:-6])
            continue
        if shard.endswith(".grow") and shard[:-5].isdigit():  # filling (growing.py): bytes
            total += st.st_size if _regular_ours(st) else 0  # on the ledger, records not yet
            continue
        if not shard.isdigit() or not stat.S_ISDIR(st.st_mode):
            continue
        try:
            kept = os.listdir(folder)
        except FileNotFoundError:
            continue
        for name in kept:
            st = _lstat(os.path.join(folder, name)) if name.isdigit() else None
            if st is not None and _regular_ours(st):
                total, files = total + st.st_size, files + 1
    return total, files


def _lstat(path: str):
    """``lstat`` of ``path``, or None when it was removed since it was listed."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _regular_ours(st) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _records_in(path: str, size: int) -> int:
    """Records of an assembled shard, from its header page (0 when it is not valid)."""
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as f:
            return fmt.unpack_header(f.read(fmt.HEADER_SIZE), size, path).num_records
    except (OSError, fmt.FormatError):
        return 0


def counted_size(path: str) -> int:
    """The bytes ``usage`` counts for the kept file at ``path``: its size when it is a
    regular file of ours, else 0 (a link or a planted file is never on the ledger)."""
    st = _lstat(path)
    return st.st_size if st is not None and _regular_ours(st) else 0


log = logging.getLogger(__name__)
ROOM_BATCHES = 16  # room kept free for batches in flight when the data set does not fit
READ_AHEAD = 2 * 2**20  # per record a batch needs: its neighbours, when all is kept anyway
BRIDGE_GAP = 256 * 1024  # ... and a range goes on over records already fetched, up to this
# cold epoch 0, all kept: after batch 0, the rest in ranges of up to FILL_BYTES (16 MiB: half
# the requests of 4 MiB ones on 1,000 JPEGs, the fetching threads' CPU per image 0.8x, 1.09x
# the images/s with 20 ms of latency; docs/benchmarks.md), FILL_INFLIGHT of them at once (few
# large requests, little server CPU), each at least FILL_MIN_BYTES, or smaller only so the
# fill of a small data set still spans FILL_INFLIGHT requests (fetchplan.fill_range_bytes)
FILL_BYTES = 16 * 2**20
FILL_MIN_BYTES = 4 * 2**20
FILL_INFLIGHT = 8
FILL_FIRST = 8  # ... and batch 0 with them when it all is within this many times its bytes
_LEDGER_WIDTH = 20
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # the cache's file system has no more room


class CacheFull(OSError):
    """The session folder has no room for a record: ``kept`` says which of the records
    before number ``at`` were kept (all before it were published; none from it on)."""

    def __init__(self, exc: OSError, folder: str, kept, at: int):
        super().__init__(exc.errno, exc.strerror)
        self.folder, self.kept, self.at = folder, kept, at
        self.evicted = None  # the planner's eviction count before the write (planner._land)


def keep_budget(total: int, limit: int, max_batch: int) -> int:
    """Bytes of records that may stay: all when the data set (``total`` record bytes) fits
    ``limit``, else ``limit`` less room for the batches in flight: ROOM_BATCHES batches of
    ``max_batch`` bytes, but no more than half the limit (at least two batches), so a limit
    that is small next to the batches still keeps about half of itself, not nothing."""
    if total <= limit:
        return limit
    room = min(ROOM_BATCHES * max_batch, max(limit // 2, 2 * max_batch))
    return max(0, limit - room)


def split_limit(total: int, limit: int, max_batch: int, mode: str) -> tuple[int, int]:
    """(bytes records may keep, bytes the planner may hold for batches in flight) of
    ``limit``: kept records are never held, and when the data set fits, nothing is held
    for long (a record that cannot be kept, e.g. another job filled the ledger, is held)."""
    if mode != "records":
        return 0, limit
    keep = keep_budget(total, limit, max_batch)
    return keep, (limit if total <= limit else limit - keep)


def publish_records(keeper, session, k: int, samples, local, pieces, budget: int) -> np.ndarray:
    """Publish verified records (``pieces``) of shard ``k``: kept for later epochs while the
    keep ``budget`` has room, else in ``session``. Returns the mask of those kept."""
    admitted = keeper.admit([len(p) for p in pieces], budget)
    kept = np.zeros(len(pieces), dtype=bool)
    for i, (sample, j, piece) in enumerate(zip(samples.tolist(), local.tolist(), pieces)):
        kept[i] = admitted[i] and keeper.publish(sample, k, j, piece)
        if not kept[i]:
            try:
                cache_mod.publish(session.record_path(k, j), piece, base=session.dir)
            except OSError as exc:
                if exc.errno not in FULL:
                    raise
                keeper.discard_bytes(sum(len(p) for p, a in zip(pieces[i + 1:], admitted[i + 1:])
                                         if a))  # admitted, never published
                raise CacheFull(exc, session.dir, kept[:i], i) from exc
    return kept


class KeptRecords:
    """The kept records of one data set (``cache.root/records``), as one process sees them."""

    def __init__(self, cache, n_samples: int, *, owner: bool):
        self.dir = os.path.join(cache.root, "records")
        self.owner = owner
        cache_mod.make_dirs(cache.root, self.dir)
        self.ledger = os.path.join(self.dir, ".ledger")
        n_samples = n_samples if owner else 0  # workers only read (and discard) kept files
        self.kept = np.zeros(n_samples, dtype=bool)  # verified here, with this signature:
        self.sig = np.zeros((n_samples, 3), dtype=np.int64)  # (inode, size, mtime_ns)
        self.looked = np.zeros(n_samples, dtype=bool)  # absent when last looked for
        self._dirs: set[str] = set()
        self._broken = self._reconciled = False

    def path(self, shard: int, record: int) -> str:
        """Where record ``record`` of shard number ``shard`` is kept."""
        return os.path.join(self.dir, str(shard), str(record))

    # ---- what is kept (the planner asks before it fetches) ----------------------------
    def present(self, samples: np.ndarray, lookup) -> np.ndarray:
        """Mask of ``samples`` kept and verified: known ones whose file is unchanged (one
        ``lstat``), others read and checked against their CRC. ``lookup`` = (shard numbers,
        record numbers, index entries) of ``samples``."""
        shard_ids, local, entries = lookup
        spans = extents(entries)  # a record file holds its image and field block
        out = np.zeros(len(samples), dtype=bool)
        for i, (s, k, j) in enumerate(zip(samples.tolist(), shard_ids.tolist(), local.tolist())):
            if self.kept[s]:
                try:
                    st = os.lstat(self.path(k, j))
                    if (st.st_ino, st.st_size, st.st_mtime_ns) == tuple(self.sig[s]):
                        out[i] = True
                        continue
                except FileNotFoundError:
                    pass
                self.kept[s] = False
            elif self.looked[s]:
                continue
            out[i] = self._verify(s, k, j, int(spans[i]), entries[i])
        return out

    def _verify(self, sample: int, k: int, j: int, length: int, entry) -> bool:
        """Read kept record (k, j), ``length`` bytes (its image and field block), and check
        it against ``entry``'s CRCs; remember it when it passes."""
        path = self.path(k, j)
        opened = cache_mod.open_regular(path)
        self.looked[sample] = True
        if opened is None:
            return False
        fd, st = opened
        try:
            data = os.pread(fd, length + 1, 0) if st.st_size == length else None
        finally:
            os.close(fd)
        if data is None or mismatch(data, entry) is not None:
            self.discard(path, length, f"kept record {j} of shard {k} fails its checksum or "
                                       f"size (damaged or edited locally)")
            return False
        self.remember(sample, path)
        return True

    def remember(self, sample: int, path: str) -> None:
        """Record that ``sample``'s kept file at ``path`` was verified (its signature now)."""
        st = os.lstat(path)
        self.kept[sample], self.looked[sample] = True, False
        self.sig[sample] = (st.st_ino, st.st_size, st.st_mtime_ns)

    # ---- keeping more ------------------------------------------------------------------
    def admit(self, sizes: list[int], budget: int) -> list[bool]:
        """Which of records of ``sizes`` bytes may be kept (first come, while the ledger
        stays within ``budget``); their bytes are added to the ledger now."""
        if not self.owner or self._broken or budget <= 0:
            return [False] * len(sizes)
        out = []

        def take(total):
            for size in sizes:
                fits = total + size <= budget
                out.append(fits)
                total += size if fits else 0
            return total
        if self._update(take) is None:
            return [False] * len(sizes)
        return out

    def publish(self, sample: int, k: int, j: int, data) -> bool:
        """Publish verified record (k, j) as kept; False when the place is not usable (the
        caller keeps it in its session instead). An existing file is replaced, never
        written through, and its bytes are taken off the ledger again."""
        path = self.path(k, j)
        directory = os.path.dirname(path)
        try:
            if directory not in self._dirs:
                cache_mod.make_dirs(self.dir, directory)
                self._dirs.add(directory)
            tmp = os.path.join(directory, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                with open(fd, "wb") as f:
                    f.write(data)
                try:
                    os.link(tmp, path)  # exclusive: a second process's copy is not counted twice
                except FileExistsError:  # ours is verified: it wins over whatever is there
                    replaced = counted_size(path)  # what the ledger holds for it, not ours
                    os.replace(tmp, path)
                    self._update(lambda total: max(0, total - replaced))
            finally:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
        except OSError as exc:  # a full disk, or a planted folder or link in the way
            self._update(lambda total: max(0, total - len(data)))
            if exc.errno in FULL:  # keep no more: records pass through the session
                self._give_up(f"{exc.strerror}: the cache_dir's file system is full, so no "
                              f"more records are kept for later epochs (reading goes on, "
                              f"streamed); to keep them, free space there, pass a smaller "
                              f"cache_limit, or another cache_dir", full=True)
                return False
            log.warning("%s: cannot keep a record here (%s); it is kept for this run only",
                        path, exc)
            return False
        self.remember(sample, path)
        return True

    def discard(self, path: str, length: int, why: str) -> None:
        """Remove a kept file whose bytes failed their checks and take it off the ledger,
        once: when a reader thread and the planner find the same damage, only the one whose
        unlink removed the file takes its bytes off."""
        if cache_mod.discard(path, why):
            self.discard_bytes(length)

    def drop(self, samples, places, lengths, nbytes: int) -> int:
        """Remove kept files of ``samples`` (at (shard, record) ``places``, of ``lengths``)
        until ``nbytes`` are freed (keep.py); returns the bytes freed."""
        freed = 0
        for s, (k, j), length in zip(samples, places, lengths):
            if freed < nbytes and os.path.lexists(self.path(k, j)):
                os.unlink(self.path(k, j))
                self.kept[s], freed = False, freed + int(length)
        self.discard_bytes(freed)
        return freed

    def discard_bytes(self, length: int) -> None:
        """Take ``length`` bytes off the ledger (files removed, or admitted and not used)."""
        self._update(lambda total: max(0, total - length))

    def forget_dir(self, directory: str) -> None:
        """``directory`` was removed: create it again before the next publish into it."""
        self._dirs.discard(directory)

    def _update(self, change) -> int | None:
        """Apply ``change(total) -> new total`` to the ledger under its lock; None (and
        nothing kept from now on) when the ledger is not a regular file of ours."""
        try:
            fd = os.open(self.ledger, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            return self._give_up(exc.strerror)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return self._give_up("not a regular file of ours")
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, _LEDGER_WIDTH + 1, 0)
            total = int(raw) if len(raw) == _LEDGER_WIDTH and raw.isdigit() else self.recount()
            new = int(change(total))
            os.pwrite(fd, f"{new:0{_LEDGER_WIDTH}d}".encode(), 0)
            return new
        finally:
            os.close(fd)  # also drops the lock

    def _give_up(self, why: str, full: bool = False) -> None:
        """Keep nothing more in this run, saying why once (``full``: the disk, not the
        ledger)."""
        broken, self._broken = self._broken, True
        if not broken and full:
            log.warning("%s: %s", self.dir, why)
        elif not broken:
            log.warning("%s: %s; records are not kept for later epochs in this run (remove "
                        "it, or use another cache_dir)", self.ledger, why)
        return None

    def reconcile(self) -> None:
        """Raise the ledger to the bytes found on disk when it counts fewer: files put in
        the records folder without going on the ledger (a planted or copied ``.grow``,
        ``.shard`` or record file, joined and served once verified) are counted before this
        process keeps more, so ``cache_limit`` holds. Never lowered here: bytes admitted by a
        process still writing them are on the ledger before they are on disk. Once per
        process (its first prefetch): a recount lists every kept file (0.3 s per 100,000)."""
        if self.owner and not self._broken and not self._reconciled and os.path.isdir(self.dir):
            self._reconciled = self._update(lambda total: max(total, self.recount())) is not None

    def recount(self) -> int:
        """Bytes of the kept files, counted on disk (a missing or damaged ledger)."""
        return usage(self.dir)[0]


# Reading on when the cache_dir's file system is full (mixed into planner.Planner).
#
# A full disk (ENOSPC, a quota, a file size limit) is not the end of reading while the data can
# still be streamed. In order: records stop being kept for later epochs (``KeptRecords``
# says so once, naming the folder and the fix), and pass through the session folder instead; a growing
# shard that cannot be written switches the planner to a file per record; a range the session
# has no room for waits (on the event loop: no thread, no place in flight is held) until room
# comes: the consumer releasing a batch (its session files go), kept files of batches already
# released (removed: they cannot stay anyway), or records of later batches that landed early
# (removed, and fetched again once their turn is near). No more bytes are admitted in flight
# than what fitted. Only when none of these can make room is it an OSError naming the folder
# and the fix (free space there, another cache_dir).

log = logging.getLogger(__name__)


class FullCacheSide:
    """Mixed into Planner (its attributes: planner.py)."""

    _waiting: list | None = None  # the batches of ranges waiting for room (a multiset)
    _roomless: np.ndarray | None = None  # their records: fetched, not landing by themselves

    async def _land_later(self, full, k, data, start, samples, local, entries, pieces) -> None:
        """Land records ``samples`` of a range (``data`` from shard offset ``start``) that
        found no room (``full``) once there is room, as many times as it takes."""
        need = int(first_use(self.plan)[samples].min())
        while len(samples):
            # Counted as waiting only while they wait: records being written right now may
            # land as later batches' files that another waiter can remove (``_room``).
            with self.cond:
                self._waiting = (self._waiting or []) + [need]
                if self._roomless is None:
                    self._roomless = np.zeros(len(self.state), dtype=np.int32)
                self._roomless[samples] += 1
            try:
                await self._room(full, samples, need)
            finally:
                with self.cond:
                    self._waiting.remove(need)
                    self._roomless[samples] -= 1
            try:
                await self._loop.run_in_executor(None, self._land, k, data, start,
                                                 samples, local, entries, pieces)
                return
            except CacheFull as again:
                full, a = again, again.at
                samples, local, entries = samples[a:], local[a:], entries[a:]
                pieces = pieces[a:]

    async def _room(self, full, pending: np.ndarray, need: int) -> None:
        """Wait for room for ``pending`` (records of batch ``need`` on: ``full``, a
        keep.CacheFull); OSError naming the folder when none can come."""
        with self.cond:
            # counted before the write that failed: room freed since (a batch released
            # while it failed) is a reason to try again, not to give up
            evicted = self.stats["evicted"] if full.evicted is None else full.evicted
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
