"""``Writer(dst, append=True)``: what the Writer starts from when it adds samples to an
existing data set (packer/appendbase.py holds the rules it shares with ``convert
--append``): the data set's options, classes, field schema, shards and sample count; the
identity (source path + SHA-256) of every sample it holds, so that a sample written again
from the same file is not packed twice; and the union manifest with its history entry.
"""
from __future__ import annotations

import numpy as np

from dlpack_io.packer import appendbase as base_
from dlpack_io.packer.names import shown
from dlpack_io.reader import format as fmt


class AppendBase:
    """The data set a Writer appends to, read once when the Writer opens."""

    def __init__(self, dst: str, given: dict, classes):
        self.manifest = base_.read_base(dst)
        m = self.manifest
        self.options = base_.append_options(m, given)
        old = list(m["classes"])
        if classes is not None and [str(c) for c in classes][:len(old)] != old:
            raise ValueError(f"{dst}: classes {list(classes)[:5]}... must start with the data "
                             f"set's classes {old[:5]}... (old labels are never renumbered)")
        self.classes = [str(c) for c in classes] if classes is not None else old
        self.fields = m.get("fields") or None
        self.has_label = bool(old)  # a data set without classes takes no labels
        self.known = base_.known_inputs(base_.shard_metas(dst, m["shards"]),
                                        fmt.retired_records(fmt.retired_pairs(m)))
        self.duplicates = 0
        self._sample_of = None  # record number -> sample index, when records are retired
        records = fmt.sample_records(m["num_samples"], fmt.retired_pairs(m))
        if records is not None:
            self._sample_of = np.full(m["num_samples"], -1, dtype=np.int64)
            self._sample_of[records] = np.arange(len(records))

    def sample_of(self, record: int) -> int:
        """The sample index readers give record number ``record`` (the same number unless
        the data set retires records: reader/format/retired.py); a record written now
        follows every old one."""
        if self._sample_of is None:
            return record
        if record >= len(self._sample_of):
            return record - len(fmt.retired_pairs(self.manifest))
        return int(self._sample_of[record])

    @property
    def shards(self) -> list:
        """The data set's shard entries (the new shards are numbered after them)."""
        return list(self.manifest["shards"])

    @property
    def num_samples(self) -> int:
        """Samples already in the data set (the first new sample's index)."""
        return self.manifest["num_samples"]

    def seen(self, path: str, sha: str, where: str) -> int | None:
        """The index of the sample already packed from file ``path`` with content ``sha``
        (None: not packed yet); ValueError when that path was packed with other content
        (a Writer does not replace records: ``convert --append --replace-changed`` does)."""
        if not path:
            return None
        hashes = self.known.get(shown(path))
        if hashes is None:
            return None
        if sha in hashes:
            self.duplicates += 1
            return hashes[sha]
        if None in hashes:  # packed before hashes were recorded: known by path only
            self.duplicates += 1
            return hashes[None]
        raise ValueError(f"{where}: {path} was packed before with other content (sample "
                         f"{min(hashes.values())}); a data set's samples are immutable: "
                         f"write it under another name, or pack a new data set")

    def note(self, path: str, sha: str, index: int) -> None:
        """Remember a sample written now (the same file written twice is packed once)."""
        if path:
            self.known.setdefault(shown(path), {})[sha] = index

    def class_counts(self, labels: np.ndarray) -> list:
        """Counts per class of the union: the data set's plus the new samples'."""
        counts = np.zeros(len(self.classes), dtype=np.int64)
        counts[:len(self.manifest["class_counts"])] = self.manifest["class_counts"]
        if len(labels) and self.classes:
            counts += np.bincount(labels, minlength=len(self.classes))[:len(self.classes)]
        return counts.tolist()

    def union(self, built: dict, new_shards: list) -> dict:
        """The manifest after the append (``built``: build_manifest over all shards)."""
        new_classes = self.classes[len(self.manifest["classes"]):]
        entry = base_.history_entry(self.manifest, new_shards, new_classes,
                                    {"inputs": sum(s["num_samples"] for s in new_shards),
                                     "duplicates": self.duplicates, "changed": 0,
                                     "unverified": 0}, None)
        return base_.union_manifest(self.manifest, built, entry)
