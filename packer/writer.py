"""``Writer``: a data set from samples that come from code (MosaicML's MDSWriter, LitData's
``optimize``): the same shards, checksums, temp-then-rename and manifest-last as
``dlpack convert``, with any fields beside the image and label.

    with Writer("packed/", mode="jpeg", shard_size="256MB") as w:
        w.write(image="x.jpg", label=3, caption="a cat", emb=np.zeros(512, np.float16))
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np

from dlpack_io.packer import appendbase as appendbase_mod
from dlpack_io.packer.appendbase import base_counters
from dlpack_io.packer.encode import encode_file, image_bytes
from dlpack_io.packer.finalize import build_manifest, write_dataset_files
from dlpack_io.packer.options import PackOptions, parse_size
from dlpack_io.packer.packing import ShardCutter
from dlpack_io.packer.records import RejectedInput
from dlpack_io.packer.scan import shown
from dlpack_io.packer.targets import check_later_mask, target_schema, writer_targets
from dlpack_io.packer.writers import open_writer
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format import crc32
from dlpack_io.reader.format.fields import check_field_name, encode_fields, spec_of

log = logging.getLogger(__name__)
_ENCODE_KEYS = ("mode", "size", "max_side", "quality", "validate", "non_jpeg", "max_pixels")


class Writer:
    """Write samples one by one into a new data set at ``dst`` (a local folder that is
    empty or absent). ``classes``: names of labels 0..n-1 (default: "0".."max label").
    The other keywords are ``dlpack convert``'s options of the same names (None: their
    default, docs/convert.md; on append, the data set's own). Nothing is a data set until
    ``close()``.

    ``append=True``: add to the data set already at ``dst``:
    its options, classes (``classes`` may add names after them) and fields hold; new
    shards follow its own; a sample from a file already packed with the same content is
    not packed again (``write`` returns its index); close() writes the union manifest."""

    def __init__(self, dst, *, mode: str | None = None, format: str | None = None,
                 shard_size=None, quality: int | None = None, size: int | None = None,
                 max_side: int | None = None, non_jpeg: str | None = None,
                 max_pixels: int | None = None, validate: bool | None = None,
                 jpeg_restarts: bool | None = None, classes=None, provenance: bool = True,
                 append: bool = False):
        self.dst, self.classes, self.provenance = os.fspath(dst), classes, provenance
        options = dict(quality=quality, size=size, max_side=max_side, non_jpeg=non_jpeg,
                       max_pixels=max_pixels, validate=validate, jpeg_restarts=jpeg_restarts)
        given = dict({k: v for k, v in options.items() if v is not None},  # None: not given
                     mode=mode, format=format, shard_size=shard_size)
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



# ---- Writer(append=True) ---------------------------------------------------------------------
# ``Writer(dst, append=True)``: what the Writer starts from when it adds samples to an
# existing data set (packer/appendbase.py holds the rules it shares with ``convert
# --append``): the data set's options, classes, field schema, shards and sample count; the
# identity (source path + SHA-256) of every sample it holds, so that a sample written again
# from the same file is not packed twice; and the union manifest with its history entry.
class AppendBase:
    """The data set a Writer appends to, read once when the Writer opens."""

    def __init__(self, dst: str, given: dict, classes):
        self.manifest = appendbase_mod.read_base(dst)
        m = self.manifest
        self.options = appendbase_mod.append_options(m, given)
        old = list(m["classes"])
        if classes is not None and [str(c) for c in classes][:len(old)] != old:
            raise ValueError(f"{dst}: classes {list(classes)[:5]}... must start with the data "
                             f"set's classes {old[:5]}... (old labels are never renumbered)")
        self.classes = [str(c) for c in classes] if classes is not None else old
        self.fields = m.get("fields") or None
        self.has_label = bool(old)  # a data set without classes takes no labels
        self.known = appendbase_mod.known_inputs(appendbase_mod.shard_metas(dst, m["shards"]),
                                        fmt.retired_records(fmt.retired_pairs(m)))
        self.duplicates = 0
        self._sample_of = None  # record number -> sample index, when records are retired
        records = fmt.sample_records(m["num_samples"], fmt.retired_pairs(m))
        if records is not None:
            self._sample_of = np.full(m["num_samples"], -1, dtype=np.int64)
            self._sample_of[records] = np.arange(len(records))

    def sample_of(self, record: int) -> int:
        """The sample index readers give record number ``record`` (the same number unless
        the data set retires records: reader/format/schema.py); a record written now
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
        entry = appendbase_mod.history_entry(self.manifest, new_shards, new_classes,
                                    {"inputs": sum(s["num_samples"] for s in new_shards),
                                     "duplicates": self.duplicates, "changed": 0,
                                     "unverified": 0}, None)
        return appendbase_mod.union_manifest(self.manifest, built, entry)



# ---- a sample from code made into a record ---------------------------------------------------
# One sample from code (``Writer.write``) made ready for a shard: the image as record
# bytes and the fields as a field block, every check done before anything is written.
def first_schema(fields: dict, where: str) -> dict:
    """The field schema the first sample fixes: name -> spec (arrays keep their shape
    until a later sample differs)."""
    schema = {}
    for name in sorted(fields):
        try:
            check_field_name(name, where)
        except Exception as exc:  # FormatError: say it as the value error it is here
            raise ValueError(str(exc)) from None
        schema[name] = spec_of(fields[name], f"{where} field {name!r}")
    return schema


def note_shapes(schema: dict, fields: dict) -> None:
    """Forget an array field's fixed shape once a sample's differs (it becomes null)."""
    for name, spec in schema.items():
        if spec["type"] == "array" and spec["shape"] is not None \
                and list(np.shape(fields[name])) != spec["shape"]:
            spec["shape"] = None


def encode_sample(image, fields: dict, schema: dict, options) -> tuple:
    """(EncodedRecord with its CRC, field block or None, path) of one sample; ValueError
    naming the sample and the field when anything does not fit."""
    where = options["where"]
    block = encode_fields(fields, schema, where) if schema else None
    data, path = image_bytes(image, where)
    encode = options["encode"]
    if not isinstance(image, (str, os.PathLike, bytes, bytearray, memoryview)) and \
            encode.get("non_jpeg") == "keep":  # pixels from code: raw records, as given
        encode = dict(encode, non_jpeg="raw")
    try:
        record = encode_file(data, **encode)
    except RejectedInput as exc:
        raise ValueError(f"{where}: image {path or '(bytes)'} cannot be packed: {exc}") from None
    record = dataclasses.replace(record, source_bytes=len(data), crc=crc32(record.payload),
                                 source_sha=hashlib.sha256(data).hexdigest())
    return record, block, path
