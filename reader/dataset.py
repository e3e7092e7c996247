"""``Dataset(path)``: a packed data set as a random-access sequence of (pixels, label).

Also here: how its manifest is found and loaded (local or remote), the attributes
torchvision's ImageFolder users reach for (``classes``, ``targets``, ``samples``...), and
``ds.sample(i)``: one sample with its fields, as a dict."""
from __future__ import annotations

import os
import posixpath

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.decode import decode_record
from dlpack_io.reader.format import FormatError
from dlpack_io.reader.format.fields import decode_fields
from dlpack_io.reader.remote.clouds import is_remote
from dlpack_io.reader.shard import guarded_array, open_shard, read_limited

# torchvision ImageFolder's attributes on a Dataset: ``classes``, ``class_to_idx``,
# ``targets``, ``samples`` and ``source(i)``, the file a sample was packed from.
#
# The source paths come from the shards' metadata (each shard lists the path of each of its
# records relative to the source folder, always); the folder itself is in the manifest unless
# the data set was packed with ``--no-provenance``. Both are read from files we do not trust:
# every path is checked to be text, one per record, before it is handed out.

class ImageFolderAttributes:
    """Mixed into Dataset: reads ``self.manifest``, ``self.shards``, ``self.locate``,
    ``self.record_of`` and ``self.labels``."""

    @property
    def class_to_idx(self) -> dict:
        """{class name: label}, as ImageFolder's (empty for a data set without labels)."""
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def targets(self) -> list:
        """The label of every sample in sample order, a list of ints as ImageFolder's
        (``labels`` is the same as an int64 array)."""
        return self.labels.tolist()

    @property
    def source_root(self) -> str | None:
        """The source folder this data set was packed from, as it was named on the machine
        that packed it; None when packed with ``--no-provenance``."""
        return self.manifest["source"].get("root")

    def source(self, i: int, *, relative: bool = False) -> str:
        """The file sample ``i`` was packed from: its path joined to the source folder, or
        with ``relative=True`` its path inside that folder (kept even with
        ``--no-provenance``)."""
        k, j = self.locate(i)
        rel = self._shard_paths(k)[j]
        return rel if relative else posixpath.join(self._root_or_raise(), rel)

    @property
    def samples(self) -> list:
        """[(source path, label), ...] in sample order, as ImageFolder's ``samples``."""
        root = self._root_or_raise()
        paths = [posixpath.join(root, p) for k in range(len(self.shards))
                 for p in self._shard_paths(k)]
        if len(paths) != len(self):  # an append retired records: samples in sample order
            paths = [paths[self.record_of(i)] for i in range(len(self))]
        return list(zip(paths, self.targets))

    def _root_or_raise(self) -> str:
        root = self.source_root
        if root is None:
            raise ValueError(f"{self.path}: packed with --no-provenance, so the manifest does not "
                             f"name the source folder and there are no full source paths; "
                             f"ds.source(i, relative=True) gives a sample's path inside the "
                             f"source folder, or re-pack without --no-provenance")
        return root

    def _shard_paths(self, k: int) -> list:
        """Shard ``k``'s source paths (relative), checked: one text path per record."""
        cache = self.__dict__.setdefault("_source_paths", {})
        if k not in cache:
            shard = self.shards[k]
            paths = shard.meta().get("paths")
            expected = self.manifest["shards"][k]["num_samples"]
            if not isinstance(paths, list) or len(paths) != expected or \
                    not all(isinstance(p, str) for p in paths):
                got = f"{len(paths)} entries" if isinstance(paths, list) else repr(type(paths))
                raise FormatError(f"{shard.path}: metadata 'paths' must list the source path of "
                                  f"each of its {expected} records, got {got}: the shard does "
                                  f"not record where its samples came from (or is damaged); "
                                  f"dlpack verify checks it")
            cache[k] = paths
        return cache[k]


# A sample's fields (format 3) read from its shard: the record's field block, copied
# under the mapped-file guard, its CRC checked when asked, decoded with every length and
# shape checked (reader/format/fields.py).

def check_names(dataset, names) -> None:
    """KeyError naming the data set unless every one of ``names`` is a field of it."""
    unknown = [n for n in (names or ()) if n not in dataset.fields]
    if unknown:
        raise KeyError(f"{dataset.path}: no field {unknown[0]!r}; the data set has "
                       f"{sorted(dataset.fields) or 'no fields'} besides image and label")


def read_fields(dataset, i: int, names=None) -> dict:
    """name -> value of sample ``i``'s fields (all of the schema, or ``names``)."""
    check_names(dataset, names)
    if not dataset.fields or names == ():
        return {}
    k, j = dataset.locate(i)
    return read_record_fields(dataset, i, k, j, names)


def read_record_fields(dataset, i: int, k: int, j: int, names=None) -> dict:
    """The fields of sample ``i``, record ``j`` of shard ``k`` (located by the caller)."""
    schema = dataset.fields
    shard = dataset.shards[k]
    if not shard.has_fields:
        raise fmt.FormatError(f"{shard.path}: a format-2 shard in a data set whose manifest "
                              f"declares fields {sorted(schema)}: the files are mixed up")
    where = f"{shard.path} record {j} (sample {i})"  # cheap: built for every sample
    try:
        block = guarded_array(shard.fields_block(j))  # no bytes() copy: a mask is large
    except ValueError as exc:  # MappedFileError: the shard changed under the map
        raise fmt.FormatError(f"{where}: {exc}") from None
    if dataset.verify_checksums:
        crc = shard.fields_entry(j)[1]
        if fmt.crc32(block) != crc:
            raise fmt.FormatError(f"{where}: field block checksum mismatch (stored {crc:#010x}, "
                                  f"computed {fmt.crc32(block):#010x}): damaged data")
    entry = shard.index[j]  # the upright size bounds compressed values (masks) before inflating
    return decode_fields(block, schema, where, names, (entry["height"], entry["width"]))


# Load and validate a data set's manifest.json.

# Names a conversion leaves in DST while it runs or after it was interrupted.
_UNFINISHED = (".dlpack-convert.journal", ".dlpack-convert.lock")
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".jfif", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


class NotADatasetError(FileNotFoundError):
    """The folder has no manifest.json: not a dlpack data set (or an unfinished one)."""


def manifest_path(dataset_dir) -> str:
    """Path of the manifest inside a data set folder."""
    return os.path.join(os.fspath(dataset_dir), fmt.MANIFEST_NAME)


def _looks_like_images(dataset_dir: str, names: list) -> bool:
    if any(n.lower().endswith(_IMAGE_SUFFIXES) for n in names):
        return True
    subdirs = [n for n in names[:20] if os.path.isdir(os.path.join(dataset_dir, n))]
    return any(any(m.lower().endswith(_IMAGE_SUFFIXES) for m in os.listdir(
        os.path.join(dataset_dir, d))[:50]) for d in subdirs)


def _not_a_dataset(dataset_dir: str) -> NotADatasetError:
    """The error for a folder without a manifest, saying what the folder looks like."""
    try:
        names = sorted(os.listdir(dataset_dir))
    except OSError:
        names = []
    if any(n in _UNFINISHED or (n.startswith(".shard-") and n.endswith(".partial")) for n in names):
        why = ("a conversion into it is still running or was interrupted; finish it with "
               "'dlpack convert SRC " + dataset_dir + " --resume'")
    elif any(n.startswith("shard-") for n in names):
        why = ("it holds shard files but no manifest: an interrupted conversion (finish it "
               "with 'dlpack convert SRC " + dataset_dir + " --resume') or an incomplete copy "
               "(copy manifest.json too)")
    elif _looks_like_images(dataset_dir, names):
        why = f"it looks like a folder of images: pack it with 'dlpack convert {dataset_dir} DST'"
    else:
        why = "point at the folder that 'dlpack convert' wrote (it holds manifest.json and shard files)"
    return NotADatasetError(f"{dataset_dir} is not a dlpack data set (no {fmt.MANIFEST_NAME}): {why}")


def load_manifest(dataset_dir) -> dict:
    """Read, parse and validate ``dataset_dir/manifest.json``.

    Raises NotADatasetError (a FileNotFoundError) when there is none, FileNotFoundError
    when the folder does not exist, and FormatError when the manifest is damaged, is not a
    regular file or is larger than MAX_MANIFEST_BYTES, naming the file every time.
    """
    dataset_dir = os.fspath(dataset_dir)
    path = manifest_path(dataset_dir)
    if not os.path.isdir(dataset_dir):
        raise FileNotFoundError(f"{dataset_dir}: no such data set folder")
    try:
        data = read_limited(path, fmt.MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise _not_a_dataset(dataset_dir) from None
    return fmt.validate_manifest(fmt.decode_json(data, path), path)


class Dataset(ImageFolderAttributes):
    """A packed data set (record or LMDB, jpeg or raw mode), opened lazily.

    Construction reads the manifest and each shard's header (LMDB: its checked B-tree) to
    check every record count the manifest claims; the index and data open on first use in
    each process, so a Dataset can be handed to torch's DataLoader workers. ``ds[i]``
    returns ``(HWC uint8 ndarray, int label)``; ``ds.classes`` lists the class names (empty
    for a data set packed with ``--no-labels``, whose labels are all -1). As ImageFolder:
    ``class_to_idx``, ``targets``, ``samples`` and ``source(i)`` (reader/dataset.py).

    After ``dlpack convert --append --replace-changed`` the manifest retires records
    (reader/format/schema.py): ``len(ds)`` counts the samples shown, a replaced sample
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
        # record of each sample when an append retired records (reader/format/schema.py)
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
