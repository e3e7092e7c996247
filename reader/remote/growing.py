"""Shards filled in place during a cold epoch 0: when everything fetched is kept (the data
set fits ``cache_limit``), the planner writes each verified record straight into
``records/<k>.grow``, a file laid out like the shard in the bucket (header page, records at
their index offsets, index and metadata at the end; its blocks reserved when it is made,
cache_mod.preallocate), and readers take its records from one ``mmap`` of it, like a local
shard (one CRC per record, when it lands). Once every record is in, the file becomes the
assembled shard ``records/<k>.shard`` (assembled.py) by an exclusive link: epoch 1 is unchanged.

Sharing: ``<k>.grow.map`` holds one byte per record, 1 once its verified bytes are in the
file (written after them). Any process with the same ``cache_dir`` may join a growing file
and checks bytes it did not write against their CRC once (a record that fails is marked
absent by a planner and fetched again). The file is linked in exclusively; its size goes on
the keep ledger (keep.py) by the process that created it and stays as the assembled shard.
"""
from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
import uuid

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote import cache as cache_mod
from dlpack_io.reader.remote.fetchplan import extents, mismatch

log = logging.getLogger(__name__)
_CLOSE_AFTER_S = 10.0  # a finished shard's files stay open this long (threads still using them)


class GrowingShards:
    """The shards of one remote data set (``source``) being filled in place, as one process
    sees them. The planner (``start``, ``land``) writes; any thread or process reads."""

    def __init__(self, source):
        self.source, self.keeper = source, source.keeper
        self.enabled = True  # False: epoch 0 keeps records one file each (the older path)
        self._owner = os.getpid() if source.keeper.owner else None  # its planner writes
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self.verified = np.zeros(len(self.source.lengths), dtype=bool)  # ours to read
        self._files: dict = {}  # k -> (fd, map fd, mmap, memoryview)
        self._refused: set[int] = set()  # shards that go the per-record way in this process
        self._finished: set[int] = set()  # shards this process published as assembled
        self._spent: list = []  # (when, fd, map fd) of finished shards, closed later
        self._lock = threading.Lock()

    def path(self, k: int) -> str:
        """Where shard number ``k`` grows."""
        return os.path.join(self.keeper.dir, f"{k}.grow")

    # ---- the planner's side ----------------------------------------------------------------
    def start(self, k: int, budget: int) -> bool:
        """Whether records of shard ``k`` land in its growing file (created now, within the
        keep ``budget``, or joined) or need not land (another process assembled it since);
        False: keep them one file each (keep.py)."""
        if k in self._files:
            return True
        if not self.enabled or self._owner != os.getpid():
            return False
        if k not in self._refused:
            with self._lock:
                try:
                    opened = k in self._files or self._open(k, budget, create=True)
                except OSError as exc:  # a planted entry, a full disk: record by record
                    log.warning("%s: %s; records of shard %d are kept one file each",
                                self.path(k), exc, k)
                    opened = False
                if not opened:
                    self._refused.add(k)
                self._finished.discard(k)
        return k in self._files or self.source.whole.view(k) is not None

    def land(self, k: int, data, start: int, local, entries) -> None:
        """Write verified records ``local`` (index ``entries``) of shard ``k``, whose bytes
        are in ``data`` (fetched from shard offset ``start``), into the growing file, then
        mark them present in its map; runs of adjacent records go in one ``pwrite``."""
        held = self._files.get(k)
        if held is None:  # assembled by another process: its verified bytes are there
            return
        fd = held[0]
        cache_mod.check_size(fd, self.source.shards[k].size, self.path(k))  # a cut file: no
        offsets = entries["offset"].astype(np.int64)  # write extends it (zeros, verified)
        ends = offsets + self.source.lengths[self.source.first_sample(k) + local]
        order = np.argsort(offsets, kind="stable")
        a = 0
        with self._disk_errors(k):
            for i in range(1, len(order) + 1):
                if i == len(order) or offsets[order[i]] != ends[order[i - 1]]:
                    lo, hi = int(offsets[order[a]]), int(ends[order[i - 1]])
                    cache_mod.pwrite_all(fd, data[lo - start:hi - start], lo)
                    a = i
        self.mark(k, local)

    def receiver(self, k: int, entries, start: int, budget: int, stopped):
        """A :class:`RangeSink` writing the records of shard ``k`` that ``entries`` index
        into its growing file as the bytes from shard offset ``start`` arrive (until
        ``stopped()``), or None when they do not land in place here (then fetch and
        ``land`` them). Close it when done."""
        if not self.start(k, budget) or k not in self._files:
            return None
        fd = self._files[k][0]
        cache_mod.check_size(fd, self.source.shards[k].size, self.path(k))
        return RangeSink(fd, entries, start, stopped)

    def mark(self, k: int, local) -> None:
        """Records ``local`` of shard ``k`` (their verified bytes written) present in the
        map; a byte per record, adjacent ones in one ``pwrite``."""
        held = self._files.get(k)
        if held is None:
            return
        marks = np.sort(np.asarray(local, dtype=np.int64))
        cuts = np.flatnonzero(np.diff(marks) != 1) + 1
        with self._disk_errors(k):  # after the bytes: a reader seeing the 1 sees them
            for run in np.split(marks, cuts) if len(marks) else ():
                os.pwrite(held[1], b"\x01" * len(run), int(run[0]))
        self.verified[self.source.first_sample(k) + marks] = True

    @contextlib.contextmanager
    def _disk_errors(self, k: int):
        try:
            yield
        except OSError as exc:  # a full disk (where blocks could not be reserved up front)
            raise OSError(exc.errno, f"{exc.strerror}: writing records of shard {k} into "
                          f"{self.path(k)}; free space there, or pass a smaller cache_limit "
                          f"or another cache_dir") from exc

    def present(self, samples: np.ndarray, lookup, budget: int) -> np.ndarray:
        """Mask of ``samples`` whose verified bytes are in a growing file (one left by
        another process or an earlier run is joined, within ``budget``; its records are
        checked once). A shard whose file is gone (finished: assembled) is forgotten."""
        out = np.zeros(len(samples), dtype=bool)
        shard_ids, local = lookup[0], lookup[1]
        for k in np.unique(shard_ids).tolist():
            there = os.path.lexists(self.path(k))
            if k in self._files and not there:
                self._forget(k)
            if k in self._refused or not there or not self.start(k, budget):
                continue
            sel = np.flatnonzero(shard_ids == k)
            out[sel] = [self.record(k, j) is not None for j in local[sel].tolist()]
        return out

    def _forget(self, k: int) -> None:
        """Drop what this process knows of shard ``k``'s growing file (it became the
        assembled shard, whose own checks rule from now on)."""
        with self._lock:
            held = self._files.pop(k, None)
            first, n = self.source.first_sample(k), len(self.source.shards[k].index)
            self.verified[first:first + n] = False
            now = time.monotonic()
            if held is not None:  # closed a while later: a reader may be checking with it
                self._spent.append((now, held[0], held[1]))
            while self._spent and now - self._spent[0][0] > _CLOSE_AFTER_S:
                for fd in self._spent.pop(0)[1:]:
                    os.close(fd)

    def finish(self, k: int) -> bool:
        """Make shard ``k``'s growing file the assembled shard once every record is in
        (those written by others checked first); True when it was published by this call."""
        first, n = self.source.first_sample(k), len(self.source.shards[k].index)
        with self._lock:  # one thread of this process publishes it
            if k not in self._files or k in self._finished:
                return False
            if not self.verified[first:first + n].all():
                held = self._files[k]
                marks = os.pread(held[1], n, 0)
                if marks != b"\x01" * n or any(self._check(k, j, held) is None for j in
                                               np.flatnonzero(~self.verified[first:first + n])):
                    return False
            self._finished.add(k)
        published = self._publish(k)
        self._forget(k)
        return published

    def _publish(self, k: int) -> bool:
        fd, map_fd = self._files[k][:2]
        head = self._head(k)
        if head is not None:  # our own verified copy of the header, index and metadata
            shard = self.source.shards[k]
            cache_mod.pwrite_all(fd, head[:fmt.HEADER_SIZE], 0)
            cache_mod.pwrite_all(fd, head[fmt.HEADER_SIZE:], shard.header.index_offset)
        adopted = self.source.whole.adopt(k, self.path(k), fd)
        if adopted is None:  # another file is the assembled shard: ours goes off the ledger
            self.keeper.discard_bytes(self.source.shards[k].size)
        for path, held in ((self.path(k), fd), (self.path(k) + ".map", map_fd)):
            cache_mod.unlink_if_same(path, held)  # never a file swapped in under our names
        if adopted:  # its ctime changed with its names: the stamp follows
            self.source.whole.restamp(k, fd)
        return bool(adopted)

    # ---- any reader ------------------------------------------------------------------------
    def record(self, k: int, j: int):
        """Zero-copy view of record ``j`` of shard ``k`` (its image and field block) when its
        verified bytes are in the growing file, else None. Bytes this process did not write
        are checked against their CRC once (a failure marks the record absent)."""
        if self._pid != os.getpid():
            self._reset()  # forked: open our own files, check what we did not write
        s = self.source.first_sample(k) + j
        if k not in self._files:
            if self._owner == os.getpid() and not self.verified[s] or k in self._refused:
                return None  # the planner opens what this process fills
            with self._lock:
                if k not in self._files and not self._open(k, 0, create=False):
                    return None
        held = self._files.get(k)
        return None if held is None else self._check(k, j, held)

    def _check(self, k: int, j: int, held):
        """Record ``j``'s span in the open growing file of shard ``k``: verified by this
        process already, or marked present and passing its CRC now; else None."""
        s = self.source.first_sample(k) + j
        entry = self.source.shards[k].entries(np.array([j]), self.source.record_dtype)[0]
        at, span = int(entry["offset"]), int(self.source.lengths[s])
        view = held[3][at:at + span]
        if self.verified[s]:
            return view
        if os.pread(held[1], 1, j) != b"\x01":
            return None
        data = os.pread(held[0], span, at)  # checked as read (a mapped page of a cut file
        if len(data) != span:  # would fault: SIGBUS), then served from the map
            cache_mod.check_size(held[0], self.source.shards[k].size, self.path(k))
        if mismatch(data, entry) is not None:
            log.warning("%s: record %d of shard %d fails its checksum (a writer was killed, "
                        "or the file was edited); fetched again", self.path(k), j, k)
            if self._owner == os.getpid():  # its planner fetches it again (a worker that read
                os.pwrite(held[1], b"\x00", j)  # old bytes must not clear a fresh mark)
            return None
        self.verified[s] = True
        return view

    # ---- files -----------------------------------------------------------------------------
    def _open(self, k: int, budget: int, *, create: bool) -> bool:
        """Open (``create``: or create) shard ``k``'s growing file and its map (lock held)."""
        shard = self.source.shards[k]
        if create and (os.path.lexists(self.source.whole.path(k))
                       or os.path.lexists(os.path.dirname(self.keeper.path(k, 0)))):
            return False  # assembled, or kept record by record by an earlier run
        self._made = None
        if create and not os.path.lexists(self.path(k)) and not self._create(k, budget):
            return False
        opened = cache_mod.open_regular(self.path(k), os.O_RDWR if create else os.O_RDONLY)
        if opened is None:
            return False
        fd, st = opened
        if st.st_uid != os.geteuid() or st.st_size != shard.size or not shard.size \
                or create and st.st_nlink != 1:  # a hard link: a file outside is not written
            os.close(fd)
            log.warning("%s: not a growing shard of ours of %d bytes (one link); records of "
                        "shard %d are kept one file each", self.path(k), shard.size, k)
            return False
        map_fd = self._open_map(k, create)
        mm = None if map_fd is None else cache_mod.map_readonly(fd, shard.size, self.path(k))
        if mm is None:  # a planted map, no mmap: files we made just now are not left behind
            for path, held in ((self.path(k), fd), (self.path(k) + ".map", map_fd)):
                if held is not None:
                    if self._made == k:
                        cache_mod.unlink_if_same(path, held)
                    os.close(held)
            if self._made == k:
                self.keeper.discard_bytes(shard.size)
            return False
        self._files[k] = (fd, map_fd, mm, memoryview(mm))
        return True

    def _open_map(self, k: int, create: bool):
        n = len(self.source.shards[k].index)
        opened = cache_mod.open_regular(self.path(k) + ".map") if not create else None
        if create:
            try:
                fd = os.open(self.path(k) + ".map", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                             | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                log.warning("%s.map: %s; shard %d is kept record by record", self.path(k),
                            exc.strerror, k)
                return None
            opened = fd, os.fstat(fd)
        if opened is None:
            return None
        fd, st = opened
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1 \
                or not create and st.st_size != n:  # written: never through a hard link
            os.close(fd)
            return None
        if st.st_size != n:  # added zeros: absent; a longer one cut (workers refuse it)
            os.ftruncate(fd, n)
        return fd

    def _create(self, k: int, budget: int) -> bool:
        """A file of the shard's size (blocks reserved) with its header, index and metadata,
        linked in exclusively; its size goes on the keep ledger (False: no header, no room)."""
        shard, head = self.source.shards[k], self._head(k)
        if head is None or not self.keeper.admit([shard.size], budget)[0]:
            return False
        cache_mod.make_dirs(self.keeper.dir, self.keeper.dir)
        tmp, fd = os.path.join(self.keeper.dir, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"), -1
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.ftruncate(fd, shard.size)
            cache_mod.preallocate(fd, shard.size)  # a full disk fails here, not mid-epoch
            cache_mod.pwrite_all(fd, head[:fmt.HEADER_SIZE], 0)
            cache_mod.pwrite_all(fd, head[fmt.HEADER_SIZE:], shard.header.index_offset)
            os.link(tmp, self.path(k))
            self._made = k  # ours: removed again if its map cannot be opened
        except OSError as exc:  # not ours on the ledger: another process's file, or none
            self.keeper.discard_bytes(shard.size)
            if not isinstance(exc, FileExistsError):  # FileExistsError: join theirs
                raise
        finally:
            if fd >= 0:
                os.close(fd)
                os.unlink(tmp)
        return True

    def _head(self, k: int):
        """The cached (verified when loaded) header page + index + metadata of shard ``k``."""
        shard = self.source.shards[k]
        head = cache_mod.read_file(self.source.cache.index_path(shard.name), shard.size)
        full = shard.size - shard.header.index_offset + fmt.HEADER_SIZE
        return head if head is not None and len(head) == full else None


_RECEIVE_BUFFER = 512 * 1024  # bytes a receiving thread reads at once: fits its L2 cache
_buffers = threading.local()  # one buffer per receiving thread, kept


def receive_buffer() -> memoryview:
    """The calling thread's receive buffer (_RECEIVE_BUFFER bytes, made once per thread)."""
    view = getattr(_buffers, "view", None)
    if view is None or len(view) != _RECEIVE_BUFFER:
        view = _buffers.view = memoryview(bytearray(_RECEIVE_BUFFER))
    return view


class RangeSink:
    """Records of one requested range, received (Store.receive_range) into a buffer of the
    receiving thread and checked there while the bytes are in the CPU's cache; each record
    whose CRCs match is written into its growing file straight from the buffer, so only
    verified bytes ever reach the file, as with ``land``. Bytes between the records (a
    bridged gap) are dropped. Nothing is marked present here: the caller marks the records
    (GrowingShards.mark) once :meth:`failed` is None."""

    def __init__(self, fd: int, entries, start: int, stopped):
        entries = entries[np.argsort(entries["offset"], kind="stable")]
        # its own descriptor: a receive still running when the shard's files are closed
        # (a planner stopped mid-request) never writes through a number reused meanwhile
        self.fd, self.entries, self.stopped, self._buffer = os.dup(fd), entries, stopped, None
        self.offsets = entries["offset"].astype(np.int64).tolist()
        self.ends = (entries["offset"].astype(np.int64) + extents(entries)).tolist()
        self.next, self.bad = 0, None  # the first record not passed yet; the first that failed
        self.base = start  # the shard offset of buffer[0] (the range's first byte)
        self.fill = 0  # bytes in the buffer

    def space(self) -> memoryview:
        """Where the next bytes go (the buffer after those held)."""
        buffer = self._buffer or receive_buffer()
        need = self.fill + 1
        if self.next < len(self.offsets):  # a record larger than the buffer: one to fit it
            need = max(need, self.ends[self.next] - self.base)
        if len(buffer) < need:  # (a larger one is dropped when done)
            larger = memoryview(bytearray(need))
            larger[:self.fill] = buffer[:self.fill]
            buffer = larger
        self._buffer = buffer
        return buffer[self.fill:]

    def got(self, n: int) -> None:
        """``n`` more bytes are in the buffer: write the records now complete (those whose
        CRCs match), then keep only the bytes of the record not complete yet."""
        if self.stopped():
            raise ReceiveStopped("the prefetch was closed")
        self.fill += n
        held_end, buffer, run = self.base + self.fill, self._buffer, None
        while self.next < len(self.offsets) and self.ends[self.next] <= held_end:
            i = self.next
            lo, hi = self.offsets[i] - self.base, self.ends[i] - self.base
            if lo >= 0 and mismatch(buffer[lo:hi], self.entries[i]) is None:
                if run is not None and run[1] == lo:  # adjacent records: one write
                    run[1] = hi
                else:
                    self._write(run)
                    run = [lo, hi]
            elif self.bad is None:
                self.bad = i
            self.next += 1
        self._write(run)
        keep_from = held_end if self.next == len(self.offsets) else \
            min(max(self.offsets[self.next], self.base), held_end)
        kept = held_end - keep_from  # the part of the next record that came
        if kept:
            buffer[:kept] = buffer[keep_from - self.base:self.fill]
        self.base, self.fill = keep_from, kept

    def _write(self, run) -> None:
        if run is not None:
            cache_mod.pwrite_all(self.fd, self._buffer[run[0]:run[1]], self.base + run[0])

    def failed(self) -> int | None:
        """None when every record arrived whole and matched its CRCs, else the position (in
        offset order) of the first that did not."""
        return self.bad if self.bad is not None or self.next == len(self.offsets) \
            else self.next

    def close(self) -> None:
        """Close the sink's descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ReceiveStopped(Exception):
    """A RangeSink's receive ended early: the prefetch was closed."""
