"""A data set in object storage, as Dataset sees it: manifest, shards, verified local bytes.

``RemoteSource(url, ...)`` fetches the manifest (one GET; the cache key follows from it),
then the header page and index + metadata of every record shard (two range requests per
shard, all shards at once, cached in the cache directory), and opens a cache session.
Its shards are :class:`~dlpack_io.reader.remote.remote_shard.RemoteShard` objects.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import weakref

import numpy as np

from dlpack_io.reader.remote import cache as cache_mod
from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote.assembled import WholeShards
from dlpack_io.reader.remote.recordspan import extents
from dlpack_io.reader.remote.growing import GrowingShards
from dlpack_io.reader.remote.keep import BRIDGE_GAP, FILL_BYTES, FILL_INFLIGHT, KeptRecords
from dlpack_io.reader.remote.remote_shard import RemoteShard
from dlpack_io.reader.remote.storage import Policy, Store, run_sync
from dlpack_io.reader.remote.urls import canonical

log = logging.getLogger(__name__)


class RemoteSource:
    """The remote side of a Dataset: store, manifest, cache session, shards."""

    def __init__(self, url: str, *, cache_dir=None, cache_limit=None, storage_options=None,
                 policy: Policy | None = None, attach: dict | None = None,
                 max_pixels: int = fmt.DEFAULT_MAX_PIXELS):
        self.url = canonical(url)
        self.max_pixels = int(max_pixels)
        self.cache_dir = os.fspath(cache_dir) if cache_dir else cache_mod.default_cache_dir()
        cache_mod.make_cache_dir(self.cache_dir)  # everything below: cachefs
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
        # a record's cached span: its image and (format 3) its field block (recordspan.py)
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
