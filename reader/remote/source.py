"""A data set in object storage, as Dataset sees it: manifest, shards, verified local bytes.

``RemoteSource(url, ...)`` fetches the manifest (one GET; the cache key follows from it),
then the header page and index + metadata of every record shard (two range requests per
shard, all shards at once, cached in the cache directory), and opens a cache session.
``RemoteShard`` offers what the Loader uses of a local shard (``index``, ``header``,
``meta()``, ``payload(j)``, ``path``): ``payload`` reads the record from the session (put
there by the prefetch planner), checks its CRC-32 against the index and only then returns
it. In the process that opened the data set, a record not in the cache is fetched on demand
(one range request); in any other process (Loader workers) that is an error: only the main
process talks to the network (see s3client: the client is not fork-safe).
"""
from __future__ import annotations

import asyncio
import logging
import os
import weakref

import numpy as np

from dlpack_io.reader.remote import cache as cache_mod
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.indexcheck import check_index
from dlpack_io.reader.remote.storage import Policy, StorageError, Store, run_sync

log = logging.getLogger(__name__)


class RemoteSource:
    """The remote side of a Dataset: store, manifest, cache session, shards."""

    def __init__(self, url: str, *, cache_dir=None, cache_limit=None, storage_options=None,
                 policy: Policy | None = None, attach: dict | None = None,
                 max_pixels: int = fmt.DEFAULT_MAX_PIXELS):
        self.url = url.rstrip("/")
        self.max_pixels = int(max_pixels)
        self.cache_dir = os.fspath(cache_dir) if cache_dir else cache_mod.default_cache_dir()
        os.makedirs(self.cache_dir, exist_ok=True)
        self.store = Store(self.url, storage_options=storage_options, policy=policy)
        self.policy = self.store.policy
        raw = self._manifest_bytes(attach)
        where = f"{self.url}/{fmt.MANIFEST_NAME}"
        self.manifest = fmt.validate_manifest(fmt.decode_json(raw, where), where)
        if self.manifest["format"] != "record":
            raise ValueError(f"{self.url}: remote reading supports format 'record' shards (LMDB "
                             f"pages cannot be read by byte range); re-pack with --format record")
        self.key = cache_mod.dataset_key(raw, self.manifest["checksum"])
        self.cache = cache_mod.DatasetCache(self.cache_dir, self.key)
        if attach is None:
            cache_mod.publish(os.path.join(self.cache.root, fmt.MANIFEST_NAME), raw)
        self.cache_limit = _parse_limit(cache_limit, self.cache_dir)
        self.session = cache_mod.Session(self.cache, None if attach is None else attach["sid"])
        self._finalizer = weakref.finalize(self, self.session.close)
        self.shards = [RemoteShard(self, k, e) for k, e in enumerate(self.manifest["shards"])]
        if attach is None:
            self._load_indexes()
        self._starts = np.array([e["first_sample"] for e in self.manifest["shards"]], np.int64)
        self.lengths = np.concatenate([s.index["length"] for s in self.shards]).astype(np.int64) \
            if self.shards else np.zeros(0, np.int64)
        self.fetch_mode, self._active = None, None
        self.bytes_fetched = 0  # by prefetches of this data set (closed ones included)
        # Coalesce neighbours whose gap is under 1/8 of a typical record (capped at 64 KiB):
        # adjacent records always share a request, bytes wasted stay under ~12%.
        typical = int(np.median(self.lengths)) if len(self.lengths) else 0
        self.fetch_options = {"max_inflight": 64, "gap": min(64 * 1024, typical // 8),
                              "max_request": 8 * 2**20}

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
        raw = cache_mod.read_file(path)
        if raw is None:
            raise FileNotFoundError(f"{path}: the cache of {self.url} is gone (was the cache "
                                    f"directory cleaned while the data set was open?)")
        return raw

    def attach_state(self) -> dict:
        """What a spawned process needs to read this session's cache (no secrets)."""
        return {"key": self.key, "sid": self.session.sid, "cache_dir": self.cache_dir}

    def close(self) -> None:
        """Stop any prefetch and remove this session's cached records; idempotent."""
        active = self._active() if self._active else None
        if active is not None:
            active.close()
        self._finalizer()

    # ---- lookups for the planner (the index tables are loaded) ---------------------------
    def locate(self, sample: int) -> tuple[int, int]:
        """(shard number, record number) of global sample ``sample``."""
        k = int(np.searchsorted(self._starts, sample, side="right")) - 1
        return k, sample - int(self._starts[k])

    def dataset_lookup(self, samples: np.ndarray):
        """(shard numbers, record numbers, index entries) of ``samples``."""
        shard_ids = np.searchsorted(self._starts, samples, side="right") - 1
        local = samples - self._starts[shard_ids]
        entries = np.empty(samples.shape, dtype=fmt.INDEX_DTYPE)
        for k in np.unique(shard_ids):
            mask = shard_ids == k
            entries[mask] = self.shards[int(k)].index[local[mask]]
        return shard_ids, local, entries

    def start_prefetch(self, dataset, batches, *, mode=None):
        """A running Prefetch of ``batches``; closes the one started before (one per data set)."""
        from dlpack_io.reader.remote.prefetch import start

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
    from dlpack_io.reader.format.units import parse_size

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


class RemoteShard:
    """One record shard of a remote data set (see the module docstring)."""

    def __init__(self, source: RemoteSource, number: int, entry: dict):
        self.source, self.number, self.entry = source, number, entry
        self.name = fmt.check_shard_name(entry["name"], source.url)
        self.path = f"{source.url}/{self.name}"
        self.size, self.expected_crc = entry["bytes"], entry["crc"]
        self._index = self._header = self._meta_bytes = None
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
        index = fmt.index_from_buffer(index_bytes, header.num_records, where)
        check_index(index, where, data_offset=header.data_offset, data_end=header.index_offset,
                    num_classes=len(self.source.manifest["classes"]),
                    max_pixels=self.source.max_pixels)  # the same checks as a local shard
        self._header, self._index, self._meta_bytes = header, index, meta

    def load_cached_index(self) -> bool:
        """Use the cached header + index if present and intact; False if it must be fetched."""
        data = cache_mod.read_file(self.source.cache.index_path(self.name))
        if data is None:
            return False
        try:
            self._parse(data[:fmt.HEADER_SIZE], data[fmt.HEADER_SIZE:], self.path)
        except fmt.FormatError as exc:
            if self.source.session.owner:
                log.warning("cached index of %s is damaged (%s); fetching it again", self.path, exc)
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
        cache_mod.publish(self.source.cache.index_path(self.name), page + tail)

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
        """None: records are separate verified files, not one mapped shard (the Loader then
        reads record by record)."""
        return None

    def payload(self, j: int) -> bytes:
        """Verified bytes of record ``j``: from this session's cache, else (main process
        only) fetched now. Raises FormatError when the bytes fail their checksum."""
        entry = self.index[j]
        offset, length = int(entry["offset"]), int(entry["length"])
        session = self.source.session
        data = cache_mod.read_file(session.record_path(self.number, j))
        if data is None:
            data = _pread(session.pin_path(self.name), offset, length)
        if data is None and self._planned(j):  # the prefetcher brings it: don't fetch twice
            data = cache_mod.read_file(session.record_path(self.number, j)) or \
                _pread(session.pin_path(self.name), offset, length)
        if data is None:
            data = self._fetch_now(j, offset, length)
        if len(data) != length or fmt.crc32(data) != int(entry["crc"]):
            raise fmt.FormatError(f"{self.path} record {j} (bytes {offset}-{offset + length - 1}): "
                                  f"checksum mismatch in the downloaded bytes: the object in "
                                  f"the bucket is damaged or was replaced")
        return data

    def _planned(self, j: int) -> bool:
        active = self.source._active() if self.source._active else None
        if active is None or self.source.store._pid != os.getpid():
            return False
        return active._planner.wait_record(self.number, int(self.source._starts[self.number]) + j)

    def _fetch_now(self, j: int, offset: int, length: int) -> bytes:
        if self.source.store._pid not in (None, os.getpid()) or not self.source.session.owner:
            raise StorageError(
                f"{self.path} record {j}: not in the local cache {self.source.session.dir}, and "
                f"this process (pid {os.getpid()}) may not fetch it (only the process that "
                f"opened the data set talks to the network); call dataset.start_prefetch(...) "
                f"and wait for the batch first (the Loader does this)")
        return self.source.store.get_range(self.name, offset, offset + length, etag=self.etag)

    def __getstate__(self):
        raise TypeError("RemoteShard is pickled as part of its Dataset, not on its own")


def _pread(path: str, offset: int, length: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)
