"""A data set in object storage, as Dataset sees it: manifest, shards, verified local bytes.

``RemoteSource(url, ...)`` fetches the manifest (one GET; the cache key follows from it),
then the header page and index + metadata of every record shard (two range requests per
shard, all shards at once, cached in the cache directory), and opens a cache session.
Its shards are :class:`~dlpack_io.reader.remote.source.RemoteShard` objects."""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import weakref

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.checks import check_index
from dlpack_io.reader.remote import cache as cache_mod
from dlpack_io.reader.remote.assembled import WholeShards
from dlpack_io.reader.remote.clouds import canonical
from dlpack_io.reader.remote.fetchplan import extents
from dlpack_io.reader.remote.growing import GrowingShards
from dlpack_io.reader.remote.keep import BRIDGE_GAP, FILL_BYTES, FILL_INFLIGHT, KeptRecords
from dlpack_io.reader.remote.storage import Policy, StorageError, Store, run_sync

# One record shard of a data set in object storage, offering what the Loader uses of a
# local shard (``index``, ``header``, ``meta()``, ``payload(j)``, ``path``).
#
# ``payload`` reads the record from the cache session (put there by the prefetch planner),
# checks its CRC-32 against the index and only then returns it. In the process that opened
# the data set, a record not in the cache is fetched on demand (one range request); in any
# other process (Loader workers) that is an error: only the main process talks to the network
# (see s3client: the client is not fork-safe).

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
        except cache_mod.CacheEntryError as exc:  # the index is in memory: go on uncached
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
        from the same cached span as its image (fetchplan.py), checked like ``payload``."""
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
                data = cache_mod.pread_exact(path, rel, n, span)
            if data is not None:
                return data, path
        pin = session.pin_path(self.name)
        data = cache_mod.pread_exact(pin, at, n, self.size)
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
                    cache_mod.discard(pool, why)
            except FileNotFoundError:
                pass
        cache_mod.discard(path, why)

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


log = logging.getLogger(__name__)


class RemoteSource:
    """The remote side of a Dataset: store, manifest, cache session, shards."""

    def __init__(self, url: str, *, cache_dir=None, cache_limit=None, storage_options=None,
                 policy: Policy | None = None, attach: dict | None = None,
                 max_pixels: int = fmt.DEFAULT_MAX_PIXELS):
        self.url = canonical(url)
        self.max_pixels = int(max_pixels)
        self.cache_dir = os.fspath(cache_dir) if cache_dir else cache_mod.default_cache_dir()
        cache_mod.make_cache_dir(self.cache_dir)  # everything below: cache_mod
        self.store = Store(self.url, storage_options=storage_options, policy=policy)
        self.policy = self.store.policy
        raw = self._manifest_bytes(attach)
        where = f"{self.url}/{fmt.MANIFEST_NAME}"
        self.manifest = fmt.validate_manifest(fmt.decode_json(raw, where), where)
        if self.manifest["format"] != "record":
            raise ValueError(f"{self.url}: remote reading supports format 'record' shards (LMDB "
                             f"pages cannot be read by byte range); re-pack with --format record")
        self.key = cache_mod.dataset_key(raw, self.manifest["checksum"])
        self._set_up_cache(raw, attach)
        self.cache_limit = _parse_limit(cache_limit, self.cache_dir)
        self._finalizer = weakref.finalize(self, _close_cache, self.session, self.cache)
        self.shards = [RemoteShard(self, k, e) for k, e in enumerate(self.manifest["shards"])]
        if attach is None:
            self._load_indexes()
        self._starts = np.array([e["first_sample"] for e in self.manifest["shards"]], np.int64)
        # a record's cached span: its image and (format 3) its field block (fetchplan.py)
        self.record_dtype = fmt.FIELDS_INDEX_DTYPE if any(s.has_fields for s in self.shards) \
            else fmt.INDEX_DTYPE
        self.lengths = np.concatenate([extents(s.entries(slice(None), self.record_dtype))
                                       for s in self.shards]) \
            if self.shards else np.zeros(0, np.int64)
        self.last_fetched = None  # (shard, record, span) a RemoteShard fetched on demand last
        self.keeper = KeptRecords(self.cache, len(self.lengths), owner=self.session.owner)
        self.whole = WholeShards(self)  # kept shards assembled into one mapped file each
        self.growing = GrowingShards(self)  # epoch 0: shards filled in place (all kept)
        self.fetch_mode, self._active = None, None
        self.bytes_fetched = 0  # by prefetches of this data set (closed ones included)
        # Coalesce neighbours whose gap is under 1/8 of a typical record (capped at 64 KiB):
        # adjacent records always share a request, bytes wasted stay under ~12%.
        typical = int(np.median(self.lengths)) if len(self.lengths) else 0
        self.fetch_options = {"max_inflight": 64, "gap": min(64 * 1024, typical // 8),
                              "max_request": 8 * 2**20,  # runs pass over <= 2 records:
                              "bridge_gap": min(BRIDGE_GAP, 2 * typical),  # keep.py
                              "fill_bytes": FILL_BYTES, "fill_inflight": FILL_INFLIGHT}

    def _set_up_cache(self, raw: bytes, attach) -> None:
        """The data set's cache folder and this Dataset's session in it; a full disk is an
        OSError naming cache_dir and the fix, not a bare errno."""
        try:
            self.cache = cache_mod.DatasetCache(self.cache_dir, self.key)
            if attach is None:
                cache_mod.publish(os.path.join(self.cache.root, fmt.MANIFEST_NAME), raw)
                cache_mod.publish(os.path.join(self.cache.root, cache_mod.SOURCE_NAME),
                                  self.url.encode())  # for `dlpack cache ls` (no secrets)
            self.session = cache_mod.Session(self.cache, None if attach is None else
                                             attach["sid"])
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise
            raise type(exc)(exc.errno, f"{exc.strerror}: cannot set up the cache of {self.url} "
                                       f"in cache_dir {self.cache_dir}; free space there, or "
                                       f"pass another cache_dir") from exc

    def _manifest_bytes(self, attach) -> bytes:
        if attach is None:
            meta = self.store.head(fmt.MANIFEST_NAME)
            if meta is None:
                raise FileNotFoundError(f"{self.url} is not a dlpack data set (no "
                                        f"{fmt.MANIFEST_NAME}): an upload still running or "
                                        f"interrupted, or the wrong prefix")
            if meta["size"] > fmt.MAX_MANIFEST_BYTES:  # read whole: bounded first
                raise fmt.FormatError(f"{self.url}/{fmt.MANIFEST_NAME}: {meta['size']} bytes, "
                                      f"more than the {fmt.MAX_MANIFEST_BYTES} a manifest may "
                                      f"have: not a dlpack manifest")
            return bytes(self.store.get_range(fmt.MANIFEST_NAME, 0, meta["size"],
                                              etag=meta["etag"]))
        # a spawned worker: read what the owner cached, never the network
        path = os.path.join(self.cache_dir, attach["key"], fmt.MANIFEST_NAME)
        raw = cache_mod.read_file(path, fmt.MAX_MANIFEST_BYTES)
        if raw is None:
            raise FileNotFoundError(f"{path}: the cache of {self.url} is gone (was the cache "
                                    f"directory cleaned while the data set was open?)")
        if not attach["key"].endswith(cache_mod.dataset_key(raw, 0)[-16:]):
            raise fmt.FormatError(f"{path}: differs from the manifest the main process "
                                  f"cached (its SHA-256 does not match the cache key "
                                  f"{attach['key']}): the cache was edited while in use")
        return raw

    def attach_state(self) -> dict:
        """What a spawned process needs to read this session's cache (no secrets)."""
        return {"key": self.key, "sid": self.session.sid, "cache_dir": self.cache_dir}

    def close(self) -> None:
        """Stop any prefetch and remove this session's cached records; idempotent."""
        active = self.active_prefetch()
        if active is not None:
            active.close()
        self._finalizer()

    # ---- the running prefetch (one per data set) -----------------------------------------
    def active_prefetch(self):
        """The Prefetch started last and still alive, or None."""
        return self._active() if self._active else None

    def set_active_prefetch(self, handle) -> None:
        """Remember ``handle`` (weakly: dropping it stops its planner) as the running one."""
        self._active = weakref.ref(handle)

    # ---- lookups for the planner (the index tables are loaded) ---------------------------
    def shard_of(self, samples):
        """Shard number(s) of global sample number(s) ``samples``."""
        return np.searchsorted(self._starts, samples, side="right") - 1

    def first_sample(self, k: int) -> int:
        """Global number of shard ``k``'s first sample."""
        return int(self._starts[k])

    def locate(self, sample: int) -> tuple[int, int]:
        """(shard number, record number) of global sample ``sample``."""
        k = int(self.shard_of(sample))
        return k, sample - self.first_sample(k)

    def dataset_lookup(self, samples: np.ndarray):
        """(shard numbers, record numbers, index entries) of ``samples`` (the entries carry
        the field columns when the data set's records have field blocks)."""
        shard_ids = self.shard_of(samples)
        local = samples - self._starts[shard_ids]
        entries = np.empty(samples.shape, dtype=self.record_dtype)
        for k in np.unique(shard_ids):
            mask = shard_ids == k
            entries[mask] = self.shards[int(k)].entries(local[mask], self.record_dtype)
        return shard_ids, local, entries

    def start_prefetch(self, dataset, batches, *, mode=None):
        """A running Prefetch of ``batches``; closes the one started before (one per data set)."""
        from dlpack_io.reader.remote.planner import start

        return start(self, batches, mode=mode)

    def _load_indexes(self) -> None:
        missing = [s for s in self.shards if not s.load_cached_index()]
        if missing:
            run_sync(self._fetch_indexes(missing))

    async def _fetch_indexes(self, shards) -> None:
        sem = asyncio.Semaphore(64)

        async def one(shard):
            async with sem:
                await shard.fetch_index()
        await asyncio.gather(*(one(s) for s in shards))


def _close_cache(session, cache) -> None:
    session.close()
    cache.close()


def open_remote(url: str, *, cache_dir=None, cache_limit=None, storage_options=None,
                fetch_mode=None, attach=None,
                max_pixels: int = fmt.DEFAULT_MAX_PIXELS) -> RemoteSource:
    """The RemoteSource behind ``Dataset(url, ...)``; ``attach`` (from attach_state) opens
    the owner's cache session read-only in a spawned worker."""
    from dlpack_io.reader.remote.fetchplan import MODES

    if fetch_mode not in (None,) + MODES:
        raise ValueError(f"fetch_mode {fetch_mode!r}: expected None (automatic) or one of {MODES}")
    if attach is not None:
        cache_dir = attach["cache_dir"]
    source = RemoteSource(url, cache_dir=cache_dir, cache_limit=cache_limit,
                          storage_options=storage_options, attach=attach, max_pixels=max_pixels)
    source.fetch_mode = fetch_mode
    return source


def _parse_limit(limit, cache_dir: str) -> int:
    from dlpack_io.reader.format.spec import parse_size

    if limit is None:
        return cache_mod.default_limit(cache_dir)
    try:
        value = parse_size(limit)
    except ValueError:
        raise ValueError(f"cache_limit {limit!r}: expected a byte count or a size such as "
                         f"'20GB' or '512MiB'") from None
    if value < 1:
        raise ValueError(f"cache_limit {limit!r}: expected a positive size such as '20GB'")
    return value
