"""``Dataset(path)``: a packed data set as a random-access sequence of (pixels, label)."""
from __future__ import annotations

import os

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.decode import decode_record
from dlpack_io.reader.imagefolder import ImageFolderAttributes
from dlpack_io.reader.manifest import load_manifest
from dlpack_io.reader.nativecopy import guarded_array
from dlpack_io.reader.shard import open_shard
from dlpack_io.reader.remote.urls import is_remote


class Dataset(ImageFolderAttributes):
    """A packed data set (record or LMDB, jpeg or raw mode), opened lazily.

    Construction reads the manifest and each shard's header (LMDB: its checked B-tree) to
    check every record count the manifest claims; the index and data open on first use in
    each process, so a Dataset can be handed to torch's DataLoader workers. ``ds[i]``
    returns ``(HWC uint8 ndarray, int label)``; ``ds.classes`` lists the class names (empty
    for a data set packed with ``--no-labels``, whose labels are all -1). As ImageFolder:
    ``class_to_idx``, ``targets``, ``samples`` and ``source(i)`` (reader/imagefolder.py).

    After ``dlpack convert --append --replace-changed`` the manifest retires records
    (reader/format/retired.py): ``len(ds)`` counts the samples shown, a replaced sample
    keeps its index, and ``locate``/``lookup``/``labels`` map sample indices to records.

    ``max_pixels``: a shard holding a record of more pixels (height x width) than this is
    refused when it opens, before anything is sized from the record (default
    ``format.DEFAULT_MAX_PIXELS``, the default of ``dlpack convert --max-pixels``).
    """

    def __init__(self, path, *, verify_checksums: bool = False,
                 max_pixels: int = fmt.DEFAULT_MAX_PIXELS, cache_dir=None, cache_limit=None,
                 storage_options=None, fetch_mode=None, _attach=None):
        self.path = path if is_remote(path) else os.fspath(path)
        self.verify_checksums = verify_checksums
        if not isinstance(max_pixels, int) or max_pixels < 1:
            raise ValueError(f"max_pixels {max_pixels!r}: expected a positive integer")
        self.max_pixels = max_pixels
        self._remote = None
        if is_remote(self.path):  # s3://: see reader/remote/source.py and docs/remote.md
            from dlpack_io.reader.remote.source import open_remote

            self._remote = open_remote(self.path, cache_dir=cache_dir, cache_limit=cache_limit,
                                       storage_options=storage_options, fetch_mode=fetch_mode,
                                       attach=_attach, max_pixels=max_pixels)
            self.manifest = self._remote.manifest
        else:
            self.manifest = load_manifest(self.path)
        self.classes = list(self.manifest["classes"])
        self.fields = dict(self.manifest.get("fields", {}))  # name -> spec (format 3)
        self.format = self.manifest["format"]
        self.mode = self.manifest["mode"]
        self.shards = self._remote.shards if self._remote else \
            [open_shard(self.path, e, self.format, num_classes=len(self.classes),
                        max_pixels=max_pixels) for e in self.manifest["shards"]]
        self._check_counts()
        self._starts = np.array([e["first_sample"] for e in self.manifest["shards"]], dtype=np.int64)
        # record of each sample when an append retired records (reader/format/retired.py)
        self._records = fmt.sample_records(self.manifest["num_samples"],
                                           fmt.retired_pairs(self.manifest))

    def _check_counts(self) -> None:
        """Every shard holds the records the manifest says, before anything (a Loader's
        epoch order, say) is sized from the manifest's counts."""
        for shard, entry in zip(self.shards, self.manifest["shards"]):
            held = shard.record_count()
            if held != entry["num_samples"]:
                raise fmt.FormatError(f"{shard.path}: holds {held} records, the manifest "
                                      f"says {entry['num_samples']}: the data set is damaged "
                                      f"or its files are mixed up")

    @property
    def is_remote(self) -> bool:
        """True for a data set read from object storage (s3://, gs://, az://), False on
        local disk."""
        return self._remote is not None

    def check_unchanged(self, shard_ids=None) -> None:
        """Raise ShardChangedError (a FormatError) naming the shard if any of ``shard_ids``
        (default: all) changed on disk since this process mapped it. Two system calls per
        shard opened in this process; meant to run once per batch."""
        ids = range(len(self.shards)) if shard_ids is None else np.unique(np.asarray(shard_ids))
        for k in ids:
            self.shards[int(k)].check_unchanged()

    def start_prefetch(self, batches, *, mode=None):
        """Start fetching the records of ``batches`` (int64 arrays of sample indices, this
        rank's upcoming batches in order) into the local cache; returns a Prefetch with
        ``wait(k)``, ``ready(k)``, ``release(k)``, ``close()``, or None for a data set on
        local disk (nothing to fetch)."""
        if self._remote is None:
            return None
        if self._records is not None:  # the planner fetches records
            batches = [self._records[np.asarray(b, dtype=np.int64)] for b in batches]
        return self._remote.start_prefetch(self, batches, mode=mode)

    def close(self) -> None:
        """Release what a remote data set holds (cache session, prefetch threads)."""
        if self._remote is not None:
            self._remote.close()

    def __len__(self) -> int:
        if self._records is not None:
            return len(self._records)
        return self.manifest["num_samples"]

    @property
    def shard_sizes(self) -> list:
        """Samples per shard in sample order, for block shuffles: each shard's record
        count, less its records that show in an older record's place (a replaced sample
        keeps its index, so it counts in the shard of its first record)."""
        sizes = [e["num_samples"] for e in self.manifest["shards"]]
        if self._records is None:
            return sizes
        moved = np.array([p[1] for p in fmt.retired_pairs(self.manifest)], dtype=np.int64)
        hidden = np.searchsorted(self._starts, moved, side="right") - 1
        return (np.asarray(sizes, np.int64) - np.bincount(hidden, minlength=len(sizes))).tolist()

    def record_of(self, i: int) -> int:
        """The global record number (the shards' ``first_sample`` + position) of sample
        ``i`` (0 <= i < len): ``i`` itself unless an append retired records."""
        return i if self._records is None else int(self._records[i])

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, record number within the shard) of global sample ``i``."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for a data set of {n} samples")
        i %= n
        if self._records is not None:  # inline, not record_of(): no call for most data sets
            i = int(self._records[i])
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        return k, i - int(self._starts[k])

    def lookup(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorized ``locate`` + index entries for many samples at once.

        Returns (shard numbers, record numbers within their shard, a copy of the index
        entries as an INDEX_DTYPE array), one row per sample. Opens the shards touched.
        """
        idx = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"sample {bad} out of range for a data set of {n} samples")
        if self._records is not None:
            idx = self._records[idx]
        shard_ids = np.searchsorted(self._starts, idx, side="right") - 1
        local = idx - self._starts[shard_ids]
        entries = np.empty(idx.shape, dtype=fmt.INDEX_DTYPE)
        for k in np.unique(shard_ids):
            mask = shard_ids == k
            entries[mask] = self._checked_index(int(k))[local[mask]]
        return shard_ids, local, entries

    def _checked_index(self, k: int) -> np.ndarray:
        shard = self.shards[k]
        index = shard.index
        if len(index) != self.manifest["shards"][k]["num_samples"]:
            raise fmt.FormatError(f"{shard.path}: holds {len(index)} records, the "
                                  f"manifest says {self.manifest['shards'][k]['num_samples']}")
        return index

    @property
    def labels(self) -> np.ndarray:
        """The label of every sample, in sample order (int64 array; reads only the index
        tables, never a payload)."""
        if not len(self.shards):
            return np.zeros(0, dtype=np.int64)
        labels = np.concatenate([self._checked_index(k)["label"].astype(np.int64)
                                 for k in range(len(self.shards))])
        return labels if self._records is None else labels[self._records]

    def where(self, i: int) -> str:
        """Human-readable location of sample ``i`` for error messages."""
        k, j = self.locate(i)
        return f"{self.shards[k].path} record {j} (sample {i})"

    def record(self, i: int):
        """(zero-copy payload, index entry) of sample ``i``; checks its CRC if asked."""
        k, j = self.locate(i)
        shard = self.shards[k]
        entry = self._checked_index(k)[j]
        payload = shard.payload(j)
        if self.verify_checksums and fmt.crc32(payload) != int(entry["crc"]):
            raise fmt.FormatError(f"{self.where(i)}: record checksum mismatch: damaged data")
        return payload, entry

    def __getitem__(self, i: int):
        payload, entry = self.record(i)
        try:
            if entry["kind"] == fmt.KIND_RAW:  # size checked at open; copied under the guard
                pixels = guarded_array(payload).reshape(int(entry["height"]), int(entry["width"]), 3)
            else:
                pixels = decode_record(payload, entry, "record")
        except fmt.FormatError as exc:  # name the place only on failure: not on the hot path
            raise fmt.FormatError(str(exc).replace("record", self.where(i), 1)) from None
        except ValueError as exc:  # MappedFileError: the shard changed under the map
            raise fmt.FormatError(f"{self.where(i)}: {exc}") from None
        return pixels, int(entry["label"])

    def sample(self, i: int) -> dict:
        """Every field of sample ``i``: ``{"image": HWC uint8, "label": int, **fields}``."""
        from dlpack_io.reader.samplefields import read_fields

        pixels, label = self[i]
        return {"image": pixels, "label": label, **read_fields(self, i)}

    def open_args(self) -> dict:
        """Keywords that open this data set again in a process of its own, on this machine
        or another (a Ray actor): ``Dataset(**ds.open_args())``. For object storage: the
        endpoint, region and explicit ``storage_options`` this process resolved, never
        credentials found in its environment (each machine uses its own), and no cache
        folder (each machine uses its default, or its ``DLPACK_CACHE_DIR``)."""
        args = {"path": self.path, "verify_checksums": self.verify_checksums,
                "max_pixels": self.max_pixels}
        if self._remote is not None:
            args.update(storage_options=self._remote.store.explicit_options or None,
                        fetch_mode=self._remote.fetch_mode)
        return args

    def __getstate__(self):
        state = {"path": self.path, "verify_checksums": self.verify_checksums,
                 "max_pixels": self.max_pixels}
        if self._remote is not None:
            state["remote"] = self._remote.attach_state()
        return state

    def __setstate__(self, state):
        # a spawned worker of a remote data set attaches to the owner's cache session
        self.__init__(state["path"], verify_checksums=state["verify_checksums"],
                      max_pixels=state.get("max_pixels", fmt.DEFAULT_MAX_PIXELS),
                      _attach=state.get("remote"))

    def __repr__(self) -> str:
        return (f"Dataset({self.path!r}: {len(self)} samples, {len(self.classes)} classes, "
                f"{self.format}/{self.mode}, {len(self.shards)} shards)")
