"""Per-sample readers of the simple stores (JPEG files, raw.npy, one .npy per sample, plain
LMDB, our record shards read record by record), opened lazily.

Each is picklable before first use and opens its files once per process (never across a
fork: lmdb refuses an environment inherited from the parent).
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np


class FileSource:
    """The JPEG folder: payload = the file's bytes."""

    def __init__(self, store: str):
        with open(os.path.join(store, "index.json")) as f:
            index = json.load(f)
        self.paths, self.labels = index["paths"], index["labels"]

    def __len__(self) -> int:
        return len(self.paths)

    def get(self, i: int):
        """(JPEG bytes, label) of sample i."""
        with open(self.paths[i], "rb") as f:
            return f.read(), self.labels[i]


class NpyFileSource(FileSource):
    """One .npy file per sample (stores.write_npy_files): payload = its HWC array."""

    def get(self, i: int):
        """(HWC uint8 array, label) of sample i."""
        return np.load(self.paths[i]), self.labels[i]


class RecordSource:
    """Our record shards through ``Dataset.record``: payload = the stored record (JPEG bytes
    or raw pixels), zero-copy; the data set opens its shards lazily in each process."""

    def __init__(self, store: str):
        from dlpack_io.reader import Dataset

        self.dataset = Dataset(store)

    def __len__(self) -> int:
        return len(self.dataset)

    def get(self, i: int):
        """(record payload, label) of sample i."""
        payload, entry = self.dataset.record(i)
        return payload, int(entry["label"])


class NumpySource:
    """raw.npy (N, 256, 256, 3) memory-mapped: payload = one HWC row (a view)."""

    def __init__(self, store: str):
        self.path = os.path.join(store, "raw.npy")
        self.labels = np.load(os.path.join(store, "labels.npy")).tolist()
        self._arr, self._pid = None, None

    def __len__(self) -> int:
        return len(self.labels)

    def get(self, i: int):
        """(HWC uint8 view, label) of sample i."""
        if self._pid != os.getpid():
            self._arr, self._pid = np.load(self.path, mmap_mode="r"), os.getpid()
        return self._arr[i], self.labels[i]

    def __getstate__(self):
        return {**self.__dict__, "_arr": None, "_pid": None}


class LmdbSource:
    """A plain LMDB (stores.write_lmdb): payload = JPEG bytes or raw pixel bytes."""

    def __init__(self, store: str):
        self.path = store
        self._env, self._pid = None, None
        env = self._open()
        with env.begin() as txn:
            self.n = int(txn.get(b"__len__"))
        env.close()
        self._env = None

    def _open(self):
        import lmdb

        return lmdb.open(self.path, readonly=True, lock=False, readahead=False, subdir=True)

    def __len__(self) -> int:
        return self.n

    def get(self, i: int):
        """(payload bytes, label) of sample i."""
        if self._pid != os.getpid():
            self._env, self._pid = self._open(), os.getpid()
        with self._env.begin(buffers=False) as txn:
            value = txn.get(b"%08d" % i)
        return value[4:], struct.unpack_from("<i", value)[0]

    def __getstate__(self):
        return {**self.__dict__, "_env": None, "_pid": None}


def sample(source, mode: str, i: int, rng=None):
    """Read sample i and do the mode's work: (CHW uint8, label)."""
    import random

    from dlpack_io.tools.bench.work import jpeg_work, raw_from_bytes, raw_work

    payload, label = source.get(i)
    rng = rng or random
    if mode == "jpeg":
        return jpeg_work(payload, rng), label
    if isinstance(payload, np.ndarray):
        return raw_work(payload, rng), label
    return raw_from_bytes(payload, rng), label
