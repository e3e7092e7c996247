"""Read-only access to one shard: the index table and zero-copy record payloads.

Shards open lazily, once per process (a forked worker re-opens its own): an LMDB
environment must never cross a fork, and lazily opened mmaps cost nothing until read.
Every structural check happens at open, so ``payload(i)`` is a bare slice.
"""
from __future__ import annotations

import mmap
import os
import struct

import numpy as np

from dlpack_io.reader import format as fmt


class _Shard:
    def __init__(self, path: str, expected_crc: int | None = None):
        self.path = path
        self.expected_crc = expected_crc
        self._pid = None
        self._index = None

    def _ensure_open(self) -> None:
        if self._pid != os.getpid():
            self._pid = None
            self._open()
            self._pid = os.getpid()

    @property
    def index(self) -> np.ndarray:
        """The shard's index table (INDEX_DTYPE entries), a view over the file."""
        self._ensure_open()
        return self._index

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self):
        return {"path": self.path, "expected_crc": self.expected_crc}

    def __setstate__(self, state):
        self.__init__(state["path"], state["expected_crc"])

    def file_view(self):
        """The whole shard file as one zero-copy buffer, or None when records do not lie
        in one mapped file (LMDB): the batch path then reads record by record."""
        return None

    def _check_crc(self, what: str, stored: int, data) -> None:
        actual = fmt.crc32(data)
        if actual != stored:
            raise fmt.FormatError(f"{self.path}: {what} checksum mismatch (stored {stored:#010x}, "
                                  f"computed {actual:#010x}): the shard is damaged")

    def _check_manifest_crc(self, crc: int) -> None:
        if self.expected_crc is not None and crc != self.expected_crc:
            raise fmt.FormatError(f"{self.path}: shard checksum {crc:#010x} differs from the "
                                  f"manifest's {self.expected_crc:#010x}: the file was replaced "
                                  f"or damaged")


class RecordShard(_Shard):
    """A ``.rec`` shard, memory-mapped read-only."""

    def _open(self) -> None:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < fmt.HEADER_SIZE:
                    raise fmt.FormatError(f"{self.path}: {size} bytes, shorter than the "
                                          f"{fmt.HEADER_SIZE}-byte header: truncated shard")
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path}: shard listed in the manifest is missing") from None
        view = memoryview(mm)
        header = fmt.unpack_header(view[:fmt.HEADER_SIZE], size, self.path)
        self._check_manifest_crc(header.header_crc)
        index_bytes = view[header.index_offset:header.index_offset + header.index_size]
        self._check_crc("index", header.index_crc, index_bytes)
        index = fmt.index_from_buffer(index_bytes, header.num_records, self.path)
        fmt.check_index_bounds(index, header.data_offset, header.index_offset, self.path)
        self._header, self._mm, self._view, self._index = header, mm, view, index

    @property
    def header(self) -> fmt.ShardHeader:
        """The parsed, validated header page."""
        self._ensure_open()
        return self._header

    def payload(self, i: int) -> memoryview:
        """Zero-copy bytes of record ``i``."""
        self._ensure_open()
        start = int(self._index["offset"][i])
        return self._view[start:start + int(self._index["length"][i])]

    def span(self, start: int, stop: int) -> memoryview:
        """Zero-copy bytes [start, stop) of the shard file (used by verify for padding)."""
        self._ensure_open()
        return self._view[start:stop]

    def file_view(self) -> memoryview:
        """The memory-mapped file up to the end of its metadata (one C call can then copy
        many records)."""
        h = self.header
        return self.span(0, h.meta_offset + h.meta_size)

    def meta(self) -> dict:
        """The shard's metadata JSON (source paths and position in the data set)."""
        h = self.header
        data = self._view[h.meta_offset:h.meta_offset + h.meta_size]
        self._check_crc("metadata", h.meta_crc, data)
        return fmt.decode_json(data, f"{self.path} metadata")


# lmdb refuses to open one environment twice in a process, so every LmdbShard of a
# process over the same file shares one environment and one long read transaction.
_LMDB_OPEN: dict = {}


# LMDB trusts its file: a truncated one is mmapped and read past its end (SIGBUS). Its two
# meta pages (LMDB 0.9 layout: 16-byte page header, then magic u32 @16, page size in
# mm_dbs[0].md_pad u32 @40, last used page u64 @136, txn id u64 @144) say how long the file
# must be, so we check that before LMDB sees the file.
_LMDB_MAGIC = 0xBEEFC0DE


def _lmdb_required_size(path: str) -> int:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = f.read(152)
        if len(first) < 152 or struct.unpack_from("<I", first, 16)[0] != _LMDB_MAGIC:
            raise fmt.FormatError(f"{path}: not an LMDB file (no LMDB meta page)")
        psize = struct.unpack_from("<I", first, 40)[0]
        if psize < 512 or psize > 65536 or psize & (psize - 1):
            raise fmt.FormatError(f"{path}: LMDB page size {psize} is not a power of two "
                                  f"in 512..65536: damaged meta page")
        f.seek(psize)
        second = f.read(152)
    metas = [m for m in (first, second) if len(m) == 152
             and struct.unpack_from("<I", m, 16)[0] == _LMDB_MAGIC]
    newest = max(metas, key=lambda m: struct.unpack_from("<Q", m, 144)[0])
    need = (struct.unpack_from("<Q", newest, 136)[0] + 1) * psize
    if need > size:
        raise fmt.FormatError(f"{path}: LMDB file is {size} bytes but its pages reach {need}: "
                              f"the shard is truncated")
    return need


def _lmdb_txn(path: str):
    import lmdb

    key = (os.getpid(), os.path.realpath(path))
    if key not in _LMDB_OPEN:
        # py-lmdb refuses to open an environment that is open in this process, and a forked
        # child inherits the parent's. Closing the child's copy (read-only, lock-free, so no
        # shared lock table) leaves the parent's untouched and lets this process reopen it.
        for stale in [k for k in _LMDB_OPEN if k[1] == key[1] and k[0] != key[0]]:
            _LMDB_OPEN.pop(stale)[0].close()
        _lmdb_required_size(path)
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False,
                        max_readers=1, max_spare_txns=0)
        _LMDB_OPEN[key] = (env, env.begin(buffers=True))
    return _LMDB_OPEN[key][1]


class LmdbShard(_Shard):
    """A single-file LMDB shard, opened readonly, lock-free, without readahead."""

    def _open(self) -> None:
        import lmdb

        if not os.path.exists(self.path):
            raise FileNotFoundError(f"{self.path}: shard listed in the manifest is missing")
        try:
            txn = _lmdb_txn(self.path)
            meta_bytes, index_bytes = txn.get(fmt.LMDB_META_KEY), txn.get(fmt.LMDB_INDEX_KEY)
        except lmdb.Error as exc:
            raise fmt.FormatError(f"{self.path}: not a readable LMDB shard ({exc})") from None
        if meta_bytes is None or index_bytes is None:
            raise fmt.FormatError(f"{self.path}: LMDB shard lacks its {fmt.LMDB_META_KEY!r} or "
                                  f"{fmt.LMDB_INDEX_KEY!r} key: incomplete or not a dlpack shard")
        self._check_manifest_crc(fmt.crc32(meta_bytes))
        meta = fmt.decode_json(meta_bytes, f"{self.path} metadata")
        if meta.get("magic") != fmt.MAGIC.decode() or meta.get("version") != fmt.FORMAT_VERSION:
            raise fmt.FormatError(f"{self.path}: magic/version {meta.get('magic')!r}/"
                                  f"{meta.get('version')!r}, expected {fmt.MAGIC.decode()!r}/"
                                  f"{fmt.FORMAT_VERSION}")
        num = meta.get("num_records")
        if not isinstance(num, int) or num < 0:
            raise fmt.FormatError(f"{self.path}: num_records {num!r} is not a count")
        self._check_crc("index", meta.get("index_crc", -1), index_bytes)
        self._index = fmt.index_from_buffer(index_bytes, num, self.path)
        self._txn, self._meta = txn, meta

    def payload(self, i: int) -> memoryview:
        """Zero-copy bytes of record ``i`` (valid while this process keeps the shard open)."""
        self._ensure_open()
        value = self._txn.get(fmt.lmdb_record_key(i))
        if value is None:
            raise fmt.FormatError(f"{self.path}: record {i} is missing from the LMDB shard")
        return value

    def meta(self) -> dict:
        """The shard's metadata JSON (header facts, source paths, position)."""
        self._ensure_open()
        return self._meta


def open_shard(dataset_dir, entry: dict, data_format: str):
    """A lazily opened shard object for one manifest shard entry."""
    path = os.path.join(os.fspath(dataset_dir), fmt.check_shard_name(entry["name"], "manifest"))
    cls = LmdbShard if data_format == "lmdb" else RecordShard
    return cls(path, entry["crc"])
