"""``Writer``: a data set from samples that come from code (MosaicML's MDSWriter, LitData's
``optimize``): the same shards, checksums, temp-then-rename and manifest-last as
``dlpack convert``, with any fields beside the image and label.

    with Writer("packed/", mode="jpeg", shard_size="256MB") as w:
        w.write(image="x.jpg", label=3, caption="a cat", emb=np.zeros(512, np.float16))
"""
from __future__ import annotations

import logging
import os
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np

from dlpack_io.packer.appendbase import base_counters
from dlpack_io.packer.cutting import ShardCutter
from dlpack_io.packer.finalize import build_manifest, write_dataset_files
from dlpack_io.packer.options import PackOptions, parse_size
from dlpack_io.packer.samples import encode_sample, first_schema, note_shapes
from dlpack_io.packer.targets import check_later_mask, target_schema, writer_targets
from dlpack_io.packer.writer_append import AppendBase
from dlpack_io.packer.writers import open_writer

log = logging.getLogger(__name__)
_ENCODE_KEYS = ("mode", "size", "max_side", "quality", "validate", "non_jpeg", "max_pixels")


class Writer:
    """Write samples one by one into a new data set at ``dst`` (a local folder that is
    empty or absent). ``classes``: names of labels 0..n-1 (default: "0".."max label").
    Other keywords are ``dlpack convert``'s options (quality, max_side, size, non_jpeg,
    max_pixels, validate, jpeg_restarts). Nothing is a data set until ``close()``.

    ``append=True``: add to the data set already at ``dst`` (packer/writer_append.py):
    its options, classes (``classes`` may add names after them) and fields hold; new
    shards follow its own; a sample from a file already packed with the same content is
    not packed again (``write`` returns its index); close() writes the union manifest."""

    def __init__(self, dst, *, mode: str | None = None, format: str | None = None,
                 shard_size=None, classes=None, provenance: bool = True, append: bool = False,
                 **options):
        self.dst, self.classes, self.provenance = os.fspath(dst), classes, provenance
        given = dict(options, mode=mode, format=format, shard_size=shard_size)
        self._base = AppendBase(self.dst, given, classes) if append else None
        if self._base is None:
            _check_empty(self.dst)
            given = dict({"mode": "jpeg", "format": "record", "shard_size": "256MB"},
                         **{k: v for k, v in given.items() if v is not None}, shuffle=False)
        else:
            given, self.classes = self._base.options, self._base.classes
        if isinstance(given["shard_size"], str):
            given["shard_size"] = parse_size(given["shard_size"])
        self.options = PackOptions(**given)
        os.makedirs(self.dst, exist_ok=True)
        self._encode = {k: getattr(self.options, k) for k in _ENCODE_KEYS}
        self._encode["restarts"] = self.options.jpeg_restarts
        self._cutter = ShardCutter(self.options.format, self.options.shard_size)
        self._shard, self._shards, self._labels = None, [], []
        self._schema, self._has_label, self._first = None, None, 0
        if self._base is not None:
            self._shards, self._first = self._base.shards, self._base.num_samples
            self._schema, self._has_label = self._base.fields, self._base.has_label
        self._reencoded, self._lossless = Counter(), Counter()
        self._started, self._closed = time.monotonic(), False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:  # no manifest: what was written is not a data set
            self.abort()

    def write(self, image, label: int | None = None, **fields) -> int:
        """Add one sample; returns its index. ``image``: a path, JPEG (or PNG, ...)
        bytes, a PIL image or an HxWx3 uint8 array; ``label``: a class index or None;
        ``fields``: the rest (int, float, str, bytes, numpy array, or a JSON value). The
        first sample fixes the schema; a later one that differs raises ValueError naming
        the sample and the field before anything is written for it."""
        if self._closed:
            raise ValueError(f"{self.dst}: the Writer is closed")
        n = self._first + len(self._labels)
        where = f"{self.dst}: sample {n}"
        label = self._check_label(label, where)
        fields, seg = writer_targets(image, fields, where, self.options.max_pixels)
        if self._schema is not None:
            check_later_mask(self._schema, fields, seg, where)
        schema = target_schema(first_schema(fields, where), seg) if self._schema is None \
            else self._schema
        record, block, path = encode_sample(image, fields, schema,
                                            {"where": where, "encode": self._encode})
        seen = self._base and self._base.seen(path, record.source_sha, where)
        if seen is not None:  # this file, this content: packed already
            return self._base.sample_of(seen)
        self._schema = schema
        note_shapes(schema, fields)
        self._add(record, label, path or f"sample-{n}", block)
        if self._base is not None:
            self._base.note(path, record.source_sha, n)
            return self._base.sample_of(n)
        return n

    def _check_label(self, label, where: str) -> int:
        given = label is not None
        if self._has_label is not None and given != self._has_label:
            raise ValueError(f"{where}: label {label!r}, but the first sample "
                             f"{'had' if self._has_label else 'had no'} label; give every "
                             f"sample a label or none")
        if given and (not isinstance(label, (int, np.integer)) or isinstance(label, bool)
                      or not 0 <= label < 2**31 - 1
                      or (self.classes is not None and label >= len(self.classes))):
            bound = len(self.classes) - 1 if self.classes is not None else 2**31 - 2
            raise ValueError(f"{where}: label {label!r}: expected an integer 0..{bound}")
        self._has_label = given
        return int(label) if given else -1

    def _add(self, record, label: int, path: str, block) -> None:
        if self._cutter.starts_new_shard(len(record.payload) + len(block or b"")):
            self._shards.append(self._shard.finish())
            self._shard = None
        if self._shard is None:
            self._shard = open_writer(self.options.format, self.dst, len(self._shards),
                                      self._first + len(self._labels),
                                      self.options.shard_size)
        self._shard.add(record, label, path, block)
        self._labels.append(label)
        if record.reencoded:
            self._reencoded[record.reencoded] += 1
        if record.lossless:
            self._lossless[record.lossless] += 1

    def close(self) -> dict:
        """Finish the last shard, then write the manifest (last, atomically); returns it."""
        if self._closed:
            raise ValueError(f"{self.dst}: the Writer is closed")
        if self._shard is None and self._base is not None:  # nothing new: unchanged
            self._closed = True
            return self._base.manifest
        if self._shard is None:
            raise ValueError(f"{self.dst}: no sample was written; a data set needs one")
        self._closed = True
        self._shards.append(self._shard.finish())
        self._shard = None
        labels = np.asarray(self._labels, dtype=np.int64)
        classes = self._class_names(labels)
        counts = np.bincount(labels, minlength=len(classes)).tolist() if classes else []
        rejects = []
        if self._base is not None:  # the union's accounting starts from the data set's
            counts = self._base.class_counts(labels)
            rejects, reencoded, lossless = base_counters(self._base.manifest)
            self._reencoded.update(reencoded)
            self._lossless.update(lossless)
        inputs = SimpleNamespace(classes=classes, root=None, list_file=None, paths=labels)
        manifest = build_manifest(inputs, self.options, self._shards, rejects, self._reencoded,
                                  counts, time.monotonic() - self._started, self._lossless,
                                  provenance=self.provenance, engine="writer",
                                  fields=self._schema)
        if self._base is not None:
            manifest = self._base.union(manifest, self._shards[len(self._base.shards):])
        write_dataset_files(self.dst, manifest, rejects)
        log.info("%s: wrote %d samples in %d shards", self.dst, len(labels), len(self._shards))
        return manifest

    def _class_names(self, labels: np.ndarray) -> list:
        if not self._has_label:
            return []
        if self.classes is not None:
            return [str(c) for c in self.classes]
        return [str(i) for i in range(int(labels.max()) + 1)]

    def abort(self) -> None:
        """Drop the unfinished shard; no manifest is written (finished shards stay, as
        after an interrupted ``dlpack convert``)."""
        self._closed = True
        if self._shard is not None:
            self._shard.abort()
            self._shard = None


def _check_empty(dst: str) -> None:
    """A Writer starts a new data set: ``dst`` must be absent or an empty folder."""
    if os.path.lexists(dst) and (not os.path.isdir(dst) or os.listdir(dst)):
        raise FileExistsError(f"{dst}: exists and is not an empty folder; a Writer starts a "
                              f"new data set: give a new path or empty this one")
