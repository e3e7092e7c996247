"""Whole-shard fetch into the shared pool of the cache (fetch mode "shards").

A shard is downloaded as parallel range requests into a temporary file in the pool
directory, checked completely (header CRC against the manifest, index and metadata CRCs,
every record's CRC), renamed into place and hard-linked into the session, so readers only
ever open a complete, verified file. A shard another process already put in the pool is
reused as it is (it was verified before it was renamed there).
"""
from __future__ import annotations

import asyncio
import logging
import os
import stat
import uuid

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote import cache as cache_mod
from dlpack_io.reader.remote.growing import ReceiveStopped, receive_buffer

log = logging.getLogger(__name__)
PART = 8 * 2**20


async def fetch_shard(store, shard, cache, session, limit: int, *, max_parts: int = 8,
                      receive=None, stopped=None) -> dict:
    """Make ``shard`` available at ``session.pin_path``; return {"requests", "bytes"}.
    ``receive(name, start, end, etag, sink)`` (the planner's ``_received``), when given,
    reads each part straight off the socket into the file (True) before the client is
    asked (False: it did not work out); ``stopped()`` ends such a receive early."""
    pool, pin = cache.pool_path(shard.name), session.pin_path(shard.name)
    cache_mod.make_dirs(session.dir, os.path.dirname(pin))
    if _link(pool, pin, shard.size):
        return {"requests": 0, "bytes": 0}
    trim_pool(cache, limit - shard.size)
    tmp = os.path.join(os.path.dirname(pool), f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, shard.size)
        _reserve(fd, shard.size, tmp)  # a full disk now, not a SIGBUS when it is mapped
        sem = asyncio.Semaphore(max_parts)

        async def part(start):
            async with sem:
                end = min(start + PART, shard.size)
                if receive is not None and await receive(
                        shard.name, start, end, shard.etag, PartSink(fd, start, stopped)):
                    return  # (checked with the rest below: verify_shard_file)
                data = await store.aget_range(shard.name, start, end, etag=shard.etag)
                cache_mod.pwrite_all(fd, data, start)  # (pwrite may write less)
        starts = list(range(0, shard.size, PART))
        # wait for every part even when one fails: none may write after fd is closed
        results = await asyncio.gather(*(part(s) for s in starts), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        await asyncio.get_running_loop().run_in_executor(None, verify_shard_file, fd, shard)
        os.close(fd)
        fd = None
        if not _publish(tmp, pool, pin):
            return {"requests": len(starts), "bytes": shard.size}
    finally:
        if fd is not None:
            os.close(fd)
            os.unlink(tmp)
    if not _link(pool, pin, shard.size):
        raise FileNotFoundError(f"{pool}: shard vanished from the cache right after download "
                                f"(another process trimming a cache_limit that is too small?)")
    return {"requests": len(starts), "bytes": shard.size}


class PartSink:
    """A part of a whole shard received straight off the socket (Store.receive_range) and
    written into the shard's temporary file as it comes, from the receiving thread's buffer
    (not through the client's body buffer). Unchecked bytes land there; nothing reads the
    file before ``verify_shard_file`` has checked all of it (a part that did not arrive
    whole is fetched again through the client, over what landed)."""

    def __init__(self, fd: int, start: int, stopped=None):
        # its own descriptor: a receive still running when the download is given up (a
        # planner stopped mid-request) never writes through a number reused meanwhile
        self.fd, self.at, self.stopped = os.dup(fd), start, stopped or (lambda: False)

    def space(self) -> memoryview:
        """Where the next bytes go: the receiving thread's buffer."""
        return receive_buffer()

    def got(self, n: int) -> None:
        """``n`` bytes are at the start of the buffer: into the file at their offset."""
        if self.stopped():
            raise ReceiveStopped("the prefetch was closed")
        cache_mod.pwrite_all(self.fd, receive_buffer()[:n], self.at)
        self.at += n

    def close(self) -> None:
        """Close the sink's descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _reserve(fd: int, size: int, path: str) -> None:
    """Reserve the blocks of a shard about to be downloaded; an OSError naming the folder
    and the fix on a full disk (a mapped hole of a full tmpfs would be a SIGBUS)."""
    try:
        cache_mod.preallocate(fd, size)
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror}: no room for a {size}-byte shard in "
                                 f"{os.path.dirname(path)}; free space there, pass a smaller "
                                 f"cache_limit, another cache_dir, or fetch_mode='records' "
                                 f"(which streams)") from exc


def _publish(tmp: str, pool: str, pin: str) -> bool:
    """Rename a verified download into the pool (True); when something that is not a file
    sits at the pool's name (planted: never removed), pin the download into this session
    only and return False."""
    try:
        os.replace(tmp, pool)
        return True
    except (IsADirectoryError, NotADirectoryError):
        log.warning("%s: not a file of ours (left alone); the shard is kept for this session "
                    "only", pool)
        os.link(tmp, pin)
        os.unlink(tmp)
        return False


def _link(pool: str, pin: str, size: int) -> bool:
    """Pin the pooled shard into the session; False if it is not (completely) there. Only
    a regular file of ours of the right size is linked (a planted link is never followed:
    ``follow_symlinks=False``); its records are still checked on every read."""
    try:
        st = os.lstat(pool)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size != size:
            return False
        os.link(pool, pin, follow_symlinks=False)
    except FileExistsError:
        return True
    except FileNotFoundError:
        return False
    os.utime(pool)  # recently used: trimmed last
    return True


def verify_shard_file(fd: int, shard) -> None:
    """Check a downloaded shard file completely; FormatError naming the URL otherwise."""
    import mmap

    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:  # slices copy: no views to leak
        header = fmt.unpack_header(mm[:fmt.HEADER_SIZE], shard.size, shard.path)
        if header.header_crc != shard.expected_crc:
            raise fmt.FormatError(f"{shard.path}: shard checksum {header.header_crc:#010x} "
                                  f"differs from the manifest's {shard.expected_crc:#010x}: "
                                  f"the object was replaced")
        index_bytes = mm[header.index_offset:header.index_offset + header.index_size]
        if fmt.crc32(index_bytes) != header.index_crc or \
                fmt.crc32(mm[header.meta_offset:shard.size]) != header.meta_crc:
            raise fmt.FormatError(f"{shard.path}: index or metadata checksum mismatch")
        index = fmt.image_index(fmt.index_from_buffer(index_bytes, header.num_records,
                                                      shard.path, header.version))
        # equal to the index fetched and validated at open (indexcheck): layout and limits hold
        if not np.array_equal(index, shard.index):
            raise fmt.FormatError(f"{shard.path}: index differs from the one read before")
        for j, (off, length, crc) in enumerate(zip(index["offset"].tolist(),
                                                   index["length"].tolist(),
                                                   index["crc"].tolist())):
            if fmt.crc32(mm[off:off + length]) != crc:
                raise fmt.FormatError(f"{shard.path} record {j} (bytes {off}-{off + length - 1})"
                                      f": checksum mismatch in the downloaded bytes: the "
                                      f"object in the bucket is damaged or was replaced")


def trim_pool(cache, budget: int) -> None:
    """Delete pooled shards no session pins (link count 1), least recently used first,
    until the pool holds at most ``budget`` bytes (best effort: pinned ones stay)."""
    entries = sorted(cache.pool_usage(), key=lambda e: e[2])
    total = sum(e[1] for e in entries)
    for name, size, _, links in entries:
        if total <= budget:
            return
        if links == 1:
            try:
                os.unlink(cache.pool_path(name))
                total -= size
                log.debug("trimmed %s from the shard cache", name)
            except FileNotFoundError:
                pass
