"""One record shard of a data set in object storage, offering what the Loader uses of a
local shard (``index``, ``header``, ``meta()``, ``payload(j)``, ``path``).

``payload`` reads the record from the cache session (put there by the prefetch planner),
checks its CRC-32 against the index and only then returns it. In the process that opened
the data set, a record not in the cache is fetched on demand (one range request); in any
other process (Loader workers) that is an error: only the main process talks to the network
(see s3client: the client is not fork-safe).
"""
from __future__ import annotations

import logging
import os

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.indexcheck import check_index
from dlpack_io.reader.remote import cache as cache_mod
from dlpack_io.reader.remote import cachefs
from dlpack_io.reader.remote.storage import StorageError, run_sync

log = logging.getLogger(__name__)


class RemoteShard:
    """One record shard of a remote data set (see the module docstring); ``source`` is the
    RemoteSource that built it (its store, cache session and running prefetch)."""

    def __init__(self, source, number: int, entry: dict):
        self.source, self.number, self.entry = source, number, entry
        self.name = fmt.check_shard_name(entry["name"], source.url)
        self.path = f"{source.url}/{self.name}"
        self.size, self.expected_crc = entry["bytes"], entry["crc"]
        self._index = self._header = self._meta_bytes = self._fields = None
        self._fetched = None  # (j, span) last fetched on demand: ds.sample(i) is one request
        self.etag = None  # seen when the index was fetched; later reads require the same

    # -- index ------------------------------------------------------------------------------
    def _parse(self, page: bytes, tail: bytes, where: str) -> None:
        """Validate header page + (index, metadata) bytes; keep them. Raises FormatError."""
        header = fmt.unpack_header(page, self.size, where)
        if header.header_crc != self.expected_crc:
            raise fmt.FormatError(f"{where}: shard checksum {header.header_crc:#010x} differs "
                                  f"from the manifest's {self.expected_crc:#010x}: the object "
                                  f"was replaced or damaged")
        index_bytes, meta = tail[:header.index_size], tail[header.index_size:]
        if len(meta) != header.meta_size or fmt.crc32(index_bytes) != header.index_crc \
                or fmt.crc32(meta) != header.meta_crc:
            raise fmt.FormatError(f"{where}: index or metadata checksum mismatch: damaged shard")
        index = fmt.index_from_buffer(index_bytes, header.num_records, where, header.version)
        check_index(index, where, data_offset=header.data_offset, data_end=header.index_offset,
                    num_classes=len(self.source.manifest["classes"]),
                    max_pixels=self.source.max_pixels)  # the same checks as a local shard
        # format 3: the image columns as in format 2, the field columns beside them
        self._fields = None if index.dtype == fmt.INDEX_DTYPE else \
            np.ascontiguousarray(index[["fields_length", "fields_crc"]])
        self._header, self._index, self._meta_bytes = header, fmt.image_index(index), meta

    def load_cached_index(self) -> bool:
        """Use the cached header + index if present and intact; False if it must be fetched."""
        # header page + index + metadata: never more than the shard itself
        path = self.source.cache.index_path(self.name)
        data = cache_mod.read_file(path, self.size)
        if data is None:
            return False
        try:  # errors name the cache file: the bucket is not to blame for it
            self._parse(data[:fmt.HEADER_SIZE], data[fmt.HEADER_SIZE:], path)
        except fmt.FormatError as exc:
            if self.source.session.owner:
                log.warning("cached index %s of %s is damaged (%s); fetching it again", path,
                            self.path, exc)
                return False
            raise
        return True

    async def fetch_index(self) -> None:
        """Two range requests: the header page, then index + metadata; cache them."""
        store = self.source.store
        if self.size < fmt.HEADER_SIZE:
            raise fmt.FormatError(f"{self.path}: the manifest says {self.size} bytes, shorter "
                                  f"than a {fmt.HEADER_SIZE}-byte header page")
        page, self.etag = await store.aget_range(self.name, 0, fmt.HEADER_SIZE, with_etag=True)
        page = bytes(page)
        header = fmt.unpack_header(page, self.size, self.path)
        tail = bytes(await store.aget_range(self.name, header.index_offset, self.size,
                                            etag=self.etag))
        self._parse(page, tail, self.path)
        try:
            cache_mod.publish(self.source.cache.index_path(self.name), page + tail)
        except cachefs.CacheEntryError as exc:  # the index is in memory: go on uncached
            log.warning("%s", exc)
        except OSError as exc:  # a full disk: this process reads on from memory
            log.warning("%s: the index of %s is not cached (%s); free space there, or pass "
                        "a smaller cache_limit or another cache_dir", self.source.cache.root,
                        self.path, exc.strerror or exc)

    @property
    def index(self) -> np.ndarray:
        """The shard's index table (INDEX_DTYPE entries)."""
        if self._index is None and not self.load_cached_index():
            run_sync(self.fetch_index())
        return self._index

    @property
    def header(self) -> fmt.ShardHeader:
        """The parsed, validated header page."""
        self.index  # noqa: B018 - loads header and index together
        return self._header

    def __len__(self) -> int:
        return len(self.index)

    def record_count(self) -> int:
        """Records in the shard, from its (fetched, verified) header and index."""
        return len(self.index)

    def check_unchanged(self) -> None:
        """Nothing to check: records come from immutable, verified cache files (published
        by rename) and are returned as copies; a changed object is caught by its ETag."""
        return None

    def meta(self) -> dict:
        """The shard's metadata JSON (checked against the header's CRC when loaded)."""
        self.index  # noqa: B018
        return fmt.decode_json(self._meta_bytes, f"{self.path} metadata")

    # -- records ----------------------------------------------------------------------------
    def file_view(self):
        """The assembled shard (all records kept, verified: assembled.py) as one zero-copy
        buffer, like a local shard's; None while records are separate files (the Loader then
        reads record by record)."""
        return self.source.whole.view(self.number)

    def entries(self, local, dtype=fmt.INDEX_DTYPE) -> np.ndarray:
        """Index entries of records ``local`` as ``dtype``: INDEX_DTYPE, or
        FIELDS_INDEX_DTYPE with the field columns (zeros in a format-2 shard)."""
        index = self.index[local]
        if dtype == fmt.INDEX_DTYPE:
            return index
        out = np.zeros(len(index), dtype=dtype)
        for name in fmt.INDEX_DTYPE.names:
            out[name] = index[name]
        if self._fields is not None:
            out["fields_length"] = self._fields["fields_length"][local]
            out["fields_crc"] = self._fields["fields_crc"][local]
        return out

    @property
    def has_fields(self) -> bool:
        """True for a format-3 shard (its records carry a field block, maybe empty)."""
        self.index  # noqa: B018
        return self._fields is not None

    def fields_entry(self, j: int) -> tuple[int, int]:
        """(length, CRC-32) of record ``j``'s field block; (0, 0) in a format-2 shard."""
        if not self.has_fields:
            return 0, 0
        return int(self._fields["fields_length"][j]), int(self._fields["fields_crc"][j])

    def payload(self, j: int) -> bytes:
        """Verified bytes of record ``j``: from this session's cache, else (main process
        only) fetched now. Cached bytes that fail their checksum are discarded (a warning
        names the file) and fetched again; FormatError when the fetched bytes fail too."""
        return self._part(j, False)

    def fields_block(self, j: int) -> bytes:
        """Verified bytes of record ``j``'s field block (empty in a format-2 shard), read
        from the same cached span as its image (recordspan.py), checked like ``payload``."""
        return self._part(j, True) if self.has_fields else b""

    def _part(self, j: int, fields: bool) -> bytes:
        entry = self.index[j]
        offset, length = int(entry["offset"]), int(entry["length"])
        flen, fcrc = self.fields_entry(j)
        start, n, crc = (length, flen, fcrc) if fields else (0, length, int(entry["crc"]))
        span = self._mapped(j)
        if span is not None:  # verified, in a mapped shard file: zero-copy, as a local shard
            return span[start:start + n]
        data, origin = self._cached(j, offset + start, n, length + flen)
        if data is None and self._planned(j):  # the prefetcher brings it: don't fetch twice
            span = self._mapped(j)
            if span is not None:
                return span[start:start + n]
            data, origin = self._cached(j, offset + start, n, length + flen)
        if data is not None and (len(data) != n or fmt.crc32(data) != crc):
            self._discard(origin, j, length + flen)
            data = None
        if data is None:
            data = self._fetch_now(j, offset, length + flen)[start:start + n]
        if len(data) != n or fmt.crc32(data) != crc:
            self.source.last_fetched = None
            raise fmt.FormatError(f"{self.path} record {j} (bytes {offset + start}-"
                                  f"{offset + start + n - 1}): {'field block ' * fields}checksum "
                                  f"mismatch in the downloaded bytes: the object in the bucket "
                                  f"is damaged or was replaced")
        return data

    def _mapped(self, j: int):
        """Record ``j``'s span (image, field block), verified, from the assembled shard or
        the shard growing in place (growing.py); None when it is in neither."""
        whole = self.source.whole.view(self.number)
        if whole is None:
            span = self.source.growing.record(self.number, j)
            if span is not None:
                return span
            whole = self.source.whole.view(self.number)  # finished since we looked
            if whole is None:
                return None
        at = int(self.index[j]["offset"])
        return whole[at:at + int(self.source.lengths[self.source.first_sample(self.number) + j])]

    def _cached(self, j: int, at: int, n: int, span: int) -> tuple[bytes | None, str]:
        """(``n`` bytes at shard offset ``at`` of record ``j`` from the kept records or this
        session's cache, or None; the file they came from); unverified: the caller checks
        them. A record file holds the record's whole ``span`` (image, then field block)."""
        session = self.source.session
        rel = at - int(self.index[j]["offset"])
        for path in (self.source.keeper.path(self.number, j), session.record_path(self.number, j)):
            if rel == 0:  # the image: the file is read whole (its few field bytes come along)
                data = cache_mod.read_file(path, span)
                data = None if data is None else data[:n]
            else:
                data = cachefs.pread_exact(path, rel, n, span)
            if data is not None:
                return data, path
        pin = session.pin_path(self.name)
        data = cachefs.pread_exact(pin, at, n, self.size)
        whole = self.source.whole.view(self.number) if data is None else None
        if whole is not None:  # assembled (and its records removed) since we looked
            return bytes(whole[at:at + n]), self.source.whole.path(self.number)
        return data, pin

    def _discard(self, path: str, j: int, length: int) -> None:
        """Drop a cache file whose bytes failed their checksum (and the pooled shard it
        links, when it is the same file), so no later run trusts it either."""
        why = f"record {j} of {self.path} fails its checksum (damaged or edited locally)"
        keeper = self.source.keeper
        if path == keeper.path(self.number, j):
            if keeper.owner:
                keeper.kept[self.source.first_sample(self.number) + j] = False
            keeper.discard(path, length, why)
            return
        if path == self.source.session.pin_path(self.name):
            pool = self.source.cache.pool_path(self.name)
            try:
                if os.path.samestat(os.lstat(pool), os.lstat(path)):
                    cachefs.discard(pool, why)
            except FileNotFoundError:
                pass
        cachefs.discard(path, why)

    def _planned(self, j: int) -> bool:
        active = self.source.active_prefetch()
        if active is None or self.source.store.owner_pid != os.getpid():
            return False
        return active.wait_record(self.number, self.source.first_sample(self.number) + j)

    def _fetch_now(self, j: int, offset: int, span: int) -> bytes:
        """Record ``j``'s whole span (image + field block) in one request; the last one
        is kept so that ``ds.sample(i)`` reads image and fields with one request."""
        last = self.source.last_fetched
        if last is not None and last[:2] == (self.number, j):
            return last[2]
        if self.source.store.owner_pid not in (None, os.getpid()) or not self.source.session.owner:
            raise StorageError(
                f"{self.path} record {j}: not in the local cache {self.source.session.dir}, and "
                f"this process (pid {os.getpid()}) may not fetch it (only the process that "
                f"opened the data set talks to the network); call dataset.start_prefetch(...) "
                f"and wait for the batch first (the Loader does this)")
        data = bytes(self.source.store.get_range(self.name, offset, offset + span, etag=self.etag))
        if self.has_fields:  # one record per data set, only where a second part may follow
            self.source.last_fetched = (self.number, j, data)
        return data

    def __getstate__(self):
        raise TypeError("RemoteShard is pickled as part of its Dataset, not on its own")
