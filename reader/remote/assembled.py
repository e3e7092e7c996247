"""Kept shards assembled into one file each: later epochs read a remote data set through
the same memory-mapped, zero-copy path as a local one.

When every record of shard ``k`` is kept (keep.py), the process that opened the data set
writes ``records/<k>.shard``, laid out like the shard in the bucket (header page, records at
their index offsets, index and metadata at the end; gaps zero), each record's CRC checked
as it is copied in; published by an exclusive link, then the per-record files are removed.
The ledger counts it once (its extra bytes are admitted within the keep budget first).

Trust: nothing on disk vouches for a file (a stamp there could be written by any job of the
same user: inode, size and times are all readable with ``stat``). A process maps unread only
the file it wrote or verified itself (or its parent did, before forking it): the signature
(inode, size, mtime, ctime) it saw then, held in memory, must match the ``fstat`` of the
opened file (no link followed, ours, regular). Any other file has every record's CRC
checked first, once per process (docs/benchmarks.md: what it costs). A file that fails is
discarded, taken off the ledger, and its records are fetched (and kept, and assembled)
again. The mapped file's descriptor stays open: each read compares its ``fstat`` with the
signature it was mapped with (an edit in place, even with the mtime set back, changes the
ctime; a link or unlink of its name too), so a changed file is verified again before its
bytes are used. CRC-32 finds damage and a swapped file, not a forger: jobs sharing a
``cache_dir`` must trust each other (docs/remote.md).
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
import uuid

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote import cache as cache_mod

log = logging.getLogger(__name__)


class WholeShards:
    """The assembled shards of one remote data set (``source``), as one process sees them."""

    def __init__(self, source):
        self.source, self.keeper = source, source.keeper
        self._maps: dict = {}  # k -> (pid, signature, mmap, memoryview, descriptor)
        self._lock = (os.getpid(), threading.Lock())
        self._busy: set[int] = set()  # shards being assembled by a thread of this process
        self._verified: dict = {}  # k -> signature of the file this process wrote or checked
        self.assembled = 0  # shards this process assembled (for tests and benchmarks)

    def path(self, k: int) -> str:
        """Where shard number ``k`` is kept as one file."""
        return os.path.join(self.keeper.dir, f"{k}.shard")

    # ---- reading -------------------------------------------------------------------------
    def view(self, k: int, *, recheck: bool = True):
        """Zero-copy view of assembled shard ``k`` (verified), or None when it is not there
        (or failed its checks: then it is discarded). Mapped once per process; each call
        compares the mapped file's signature again (one ``fstat`` of its open descriptor: a
        file edited since it was mapped is verified again before its bytes are used),
        unless ``recheck`` is False."""
        held = self._maps.get(k)
        if held is not None and held[0] == os.getpid() and \
                (not recheck or cache_mod.fd_stamp(held[4]) == held[1]):
            return held[3]
        if self._lock[0] != os.getpid():  # forked: the parent's lock may be held for good
            self._lock = (os.getpid(), threading.Lock())
        with self._lock[1]:  # one thread maps (and verifies) a file; the others wait for it
            held = self._maps.get(k)
            if held is not None and held[0] == os.getpid() and \
                    (not recheck or cache_mod.fd_stamp(held[4]) == held[1]):
                return held[3]
            self._maps.pop(k, None)
            return self._map(k)

    def _map(self, k: int):
        shard = self.source.shards[k]
        opened = cache_mod.open_regular(self.path(k))
        if opened is None:
            return None
        fd, st = opened
        mm = None
        try:
            sig = cache_mod.stamp_of(st)
            if st.st_uid != os.geteuid():  # not ours: never used, never removed
                log.warning("%s: belongs to user id %d, not to this user; ignored (its "
                            "records are fetched)", self.path(k), st.st_uid)
                return None
            if st.st_size != shard.size or st.st_size == 0:
                self._discard(k, shard.size, f"{st.st_size} bytes, the shard has {shard.size}")
                return None
            stamped = self._stamp(k) == sig
            bad = None if stamped else _first_bad(fd, shard)  # read, not mapped: see there
            mm = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ) if bad is None else None
        finally:
            if mm is None:  # mapped: the descriptor stays open for the rechecks (view)
                os.close(fd)
        if bad is not None:
            self._discard(k, shard.size, f"record {bad} fails its checksum (damaged or edited "
                                         f"locally)")
            return None
        if not stamped:
            self._write_stamp(k, sig)
        view = memoryview(mm)
        self._maps[k] = (os.getpid(), sig, mm, view, cache_mod.OwnedFd(fd))
        return view

    def present(self, samples: np.ndarray, lookup, budget: int = 0) -> np.ndarray:
        """Mask of ``samples`` kept (assembled shards first, then keep.KeptRecords); a shard
        found kept record by record (an earlier run) is assembled now, within ``budget``."""
        shard_ids = lookup[0]
        whole = np.zeros(len(samples), dtype=bool)
        for k in np.unique(shard_ids).tolist():
            if self.view(k, recheck=True) is not None:
                whole |= shard_ids == k
        out = whole.copy()
        rest = ~whole
        if rest.any():
            out[rest] = self.keeper.present(samples[rest], tuple(part[rest] for part in lookup))
            for k in np.unique(shard_ids[rest & out]).tolist():
                self.after_publish(k, budget)
        return out

    # ---- assembling ----------------------------------------------------------------------
    def after_publish(self, k: int, budget: int) -> None:
        """Assemble shard ``k`` when all its records are kept (owner only, once; the
        planner calls this off its event loop, so one shard is assembled by one thread)."""
        first, n = self.source.first_sample(k), len(self.source.shards[k].index)
        if not self.keeper.owner or not n or not self.keeper.kept[first:first + n].all() \
                or k in self._busy or os.path.lexists(self.path(k)):
            return
        self._busy.add(k)
        try:
            self._assemble(k, first, budget)
        except (OSError, cache_mod.CacheEntryError) as exc:  # the records stay: still correct
            log.warning("%s: cannot assemble the kept records of shard %d into one file (%s);"
                        " they are read one by one", self.path(k), k, exc)
        finally:
            self._busy.discard(k)

    def _assemble(self, k: int, first: int, budget: int) -> None:
        shard = self.source.shards[k]
        head = cache_mod.read_file(self.source.cache.index_path(shard.name), shard.size)
        index = shard.index
        records = int(self.source.lengths[first:first + len(index)].sum())  # spans
        extra = shard.size - records
        if head is None or len(head) != shard.size - shard.header.index_offset + fmt.HEADER_SIZE \
                or not self.keeper.admit([extra], budget)[0]:
            return  # no cached header (or no room): the records stay as they are
        path = self.path(k)
        tmp = os.path.join(self.keeper.dir, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, shard.size)
            cache_mod.preallocate(fd, shard.size)  # no hole of a full tmpfs mapped (a SIGBUS)
            cache_mod.pwrite_all(fd, head[:fmt.HEADER_SIZE], 0)  # (pwrite may write less)
            cache_mod.pwrite_all(fd, head[fmt.HEADER_SIZE:], shard.header.index_offset)
            if not self._copy_records(fd, k, first, index):
                self.keeper.discard_bytes(extra)
                return
            self._write_stamp(k, cache_mod.stamp_of(os.fstat(fd)))
            try:
                os.link(tmp, path)  # exclusive: another process's copy may be there already
            except FileExistsError:
                self.keeper.discard_bytes(extra)
                return
            self.assembled += 1
        finally:
            try:
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                self.restamp(k, fd)  # the links changed its ctime (if it is the file at path)
            finally:
                os.close(fd)
        self._drop_records(k, first, index)

    def _copy_records(self, fd: int, k: int, first: int, index) -> bool:
        """Copy kept record files of shard ``k`` (image, then field block in format 3) into
        ``fd`` at their offsets; False when one is missing or damaged (nothing is
        assembled). A file this process verified and that is unchanged since (same inode,
        size, mtime) is not checked again."""
        keeper, shard = self.keeper, self.source.shards[k]
        for j, e in enumerate(index):
            span = int(self.source.lengths[first + j])
            opened = cache_mod.open_regular(keeper.path(k, j))
            if opened is None:
                return False
            rfd, st = opened
            try:
                data = os.pread(rfd, span + 1, 0) if st.st_size == span else b""
            finally:
                os.close(rfd)
            known = keeper.kept[first + j] and \
                tuple(keeper.sig[first + j]) == (st.st_ino, st.st_size, st.st_mtime_ns)
            if len(data) != span or (not known and not _intact(data, 0, e, shard, j)):
                return False
            cache_mod.pwrite_all(fd, data, int(e["offset"]))
        return True

    def _drop_records(self, k: int, first: int, index) -> None:
        """Remove the per-record files the assembled file replaces. The ledger is left as
        it is: their bytes plus the admitted extra are now the assembled file's size."""
        for j in range(len(index)):
            try:
                os.unlink(self.keeper.path(k, j))
            except FileNotFoundError:
                pass
        self.keeper.kept[first:first + len(index)] = False
        folder = os.path.dirname(self.keeper.path(k, 0))
        try:
            os.rmdir(folder)
            self.keeper.forget_dir(folder)
        except OSError:
            pass  # not empty (a temporary file of another process): left for later

    def adopt(self, k: int, grown: str, fd: int):
        """Publish the file open as ``fd`` (growing.py's ``grown``; every record in it
        verified) as assembled shard ``k``: its stamp (from ``fstat``: the file verified,
        whatever ``grown`` names now), then an exclusive link of that very file. True: linked
        now; False: it is linked already (another process finished it), or ours lost its
        name (whatever ``grown`` names now stays on the ledger in its place); None: another
        file is the assembled shard."""
        st = os.fstat(fd)
        self._write_stamp(k, cache_mod.stamp_of(st))
        try:
            cache_mod.link_open_file(fd, st, grown, self.path(k))
        except FileExistsError:
            try:
                return False if os.path.samestat(os.lstat(self.path(k)), st) else None
            except FileNotFoundError:
                return None
        except FileNotFoundError:
            return False
        self.assembled += 1
        return True

    # ---- stamps and discards ---------------------------------------------------------------
    def restamp(self, k: int, fd: int) -> None:
        """Stamp assembled shard ``k`` again after its names changed (a link or unlink sets
        its ctime), if ``path(k)`` names the verified file open as ``fd``."""
        st = os.fstat(fd)
        if cache_mod.path_stamp(self.path(k)) == cache_mod.stamp_of(st):
            self._write_stamp(k, cache_mod.stamp_of(st))

    def _stamp(self, k: int):
        """The signature of shard ``k``'s file as this process (or its parent, before the
        fork) wrote or verified it, or None: never read from disk."""
        return self._verified.get(k)

    def _write_stamp(self, k: int, sig) -> None:
        self._verified[k] = tuple(sig)

    def _discard(self, k: int, size: int, why: str) -> None:
        """Remove the assembled file; off the ledger only if this call removed it (threads
        or processes that found the same damage must not take its bytes off twice)."""
        self._maps.pop(k, None)
        self._verified.pop(k, None)
        log.warning("%s: assembled shard %d: %s; discarded from the cache, fetched again",
                    self.path(k), k, why)
        try:
            os.unlink(self.path(k))
        except FileNotFoundError:
            return
        self.keeper.discard_bytes(size)


def cached(source, grow, todo: np.ndarray, budget: int) -> np.ndarray:
    """Mask of samples ``todo`` verified in ``source``'s cache: in growing shards (``grow``,
    None when records do not grow in place), assembled shards, or kept record files."""
    lookup = source.dataset_lookup(todo)
    found = np.zeros(len(todo), dtype=bool)
    if grow is not None:
        found = grow.present(todo, lookup, budget)
    rest = ~found
    if rest.any():
        found[rest] = source.whole.present(todo[rest], tuple(p[rest] for p in lookup), budget)
    return found


def _first_bad(fd: int, shard) -> int | None:
    """Number of the first record of ``shard`` whose bytes (image, field block) in the file
    open as ``fd`` fail their CRC. Read with ``pread``: a mapped page of a file cut under
    the check would fault (SIGBUS); a short read is a record that fails."""
    for j, e in enumerate(shard.index):
        span = int(e["length"]) + shard.fields_entry(j)[0]
        data = os.pread(fd, span, int(e["offset"]))
        if len(data) != span or not _intact(data, 0, e, shard, j):
            return j
    return None


def _intact(buf, at: int, e, shard, j: int) -> bool:
    """Whether record ``j``'s image (index entry ``e``) at ``at`` of ``buf``, and its field
    block right after it, pass their CRCs."""
    length = int(e["length"])
    if fmt.crc32(buf[at:at + length]) != int(e["crc"]):
        return False
    flen, fcrc = shard.fields_entry(j)
    return not flen or fmt.crc32(buf[at + length:at + length + flen]) == fcrc
