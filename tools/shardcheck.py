"""The checks that ``dlpack verify`` runs on each shard, for a local data set and for each
shard of a remote one streamed to a temporary folder (verification.py and remoteverify.py
both import this module; neither imports the other's internals).

Per shard: a regular file of the size the manifest says, header/metadata checksums and the
header CRC recorded in the manifest, index checksum, every index entry (reader/format/
checks.py: records in order, disjoint and covering the data section, sizes within the
pixel limit, labels in range), record count, every record's CRC, zero padding; with
``decode=True`` each image is also decoded and its size checked. LMDB shards have their
B-tree checked (reader/format/checks.py) before liblmdb opens them. Every record is
copied out of the map by the native guarded copy before it is checked, so a shard truncated
while verify runs is reported, not a crash. Problems go into a :class:`VerifyReport`.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.decode import decode_record
from dlpack_io.reader.format.checks import describe_mode
from dlpack_io.reader.format.fields import decode_fields
from dlpack_io.reader.shard import guarded_copy, open_shard

MAX_LISTED_PER_SHARD = 20
EXIT_OK, EXIT_DAMAGED, EXIT_NOT_A_DATASET = 0, 1, 3  # 2 is click's usage error
EXIT_UNREACHABLE = 4  # object storage could not be read: endpoint, credentials, bucket


@dataclass
class VerifyReport:
    """What verify found: problems (each naming a file and, if any, a record)."""

    path: str
    problems: list = field(default_factory=list)
    shards_checked: int = 0
    records_checked: int = 0
    bytes_checked: int = 0
    not_a_dataset: bool = False
    retired_paths: dict = field(default_factory=dict)  # record -> source path, retired pairs'

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def add(self, where: str, problem: str, *, storage: bool = False) -> None:
        """Record one problem at ``where`` (a file, optionally with a record number);
        ``storage``: not damage but object storage that could not be read (an endpoint
        that did not answer, refused credentials, a missing bucket)."""
        self.problems.append({"where": where, "problem": problem} |
                             ({"kind": "storage"} if storage else {}))

    @property
    def exit_code(self) -> int:
        """0 intact, 1 damaged, 3 not a data set at all, 4 storage could not be read (and
        nothing that was read is damaged)."""
        if self.ok:
            return EXIT_OK
        if self.not_a_dataset:
            return EXIT_NOT_A_DATASET
        damaged = any(p.get("kind") != "storage" for p in self.problems)
        return EXIT_DAMAGED if damaged else EXIT_UNREACHABLE

    def to_dict(self) -> dict:
        """Plain-data form for --json."""
        return {"path": self.path, "ok": self.ok, "not_a_dataset": self.not_a_dataset,
                "problems": self.problems, "shards_checked": self.shards_checked,
                "records_checked": self.records_checked, "bytes_checked": self.bytes_checked,
                "exit_code": self.exit_code}


def _padding_problem(shard, j: int, gap_end: int) -> str | None:
    """Alignment padding after record ``j`` must be zero bytes: nothing may hide there."""
    entry = shard.index[j]
    start = int(entry["offset"]) + int(entry["length"]) + shard.fields_entry(j)[0]
    if gap_end - start >= fmt.RECORD_ALIGN or \
            guarded_copy(shard.span(start, gap_end)).count(0) != gap_end - start:
        return f"padding bytes {start}..{gap_end - 1} after the record are not {gap_end - start} zeros"
    return None


def _record_problem(shard, j: int, entry, decode: bool):
    """(problem or None, payload bytes) of record ``j``, read through the guarded copy."""
    try:
        payload = guarded_copy(shard.payload(j))
    except (ValueError, OSError) as exc:  # the file changed under the map while we read it
        return f"cannot read the record ({exc})", 0
    if fmt.crc32(payload) != int(entry["crc"]):
        return "record checksum mismatch: damaged data", len(payload)
    if decode:
        try:
            decode_record(payload, entry, f"{shard.path} record {j}")
        except fmt.FormatError as exc:
            return str(exc), len(payload)
    return None, len(payload)


def _fields_problem(shard, j: int, schema: dict):
    """(problem or None, bytes) of record ``j``'s field block (format 3): its CRC, then
    every value decoded against the manifest's schema (lengths, shapes, UTF-8, JSON)."""
    if not shard.has_fields:
        return (f"a format-2 shard, but the manifest declares fields {sorted(schema)}"
                if schema else None), 0
    _, crc = shard.fields_entry(j)
    try:
        block = guarded_copy(shard.fields_block(j))
    except (ValueError, OSError) as exc:
        return f"cannot read the field block ({exc})", 0
    if fmt.crc32(block) != crc:
        return "field block checksum mismatch: damaged data", len(block)
    try:
        entry = shard.index[j]
        decode_fields(block, schema, f"{shard.path} record {j}", None,
                      (entry["height"], entry["width"]))
    except fmt.FormatError as exc:
        return str(exc), len(block)
    return None, len(block)


def _check_records(shard, decode: bool, num_classes: int, report: VerifyReport, progress,
                   schema: dict | None = None) -> np.ndarray:
    """Every record of ``shard`` (its field block, the padding after it); label counts."""
    index = shard.index  # labels, sizes and layout already checked when the shard opened
    header = getattr(shard, "header", None)  # record shards: padding must be zero too
    bad = 0
    for j in range(len(index)):
        problem, nbytes = _record_problem(shard, j, index[j], decode)
        if problem is None:
            problem, field_bytes = _fields_problem(shard, j, schema or {})
            nbytes += field_bytes
        if problem is None and header is not None:
            gap_end = int(index["offset"][j + 1]) if j + 1 < len(index) else header.index_offset
            problem = _padding_problem(shard, j, gap_end)
        if problem:
            bad += 1
            if bad <= MAX_LISTED_PER_SHARD:
                report.add(f"{shard.path} record {j}", problem)
        report.records_checked += 1
        report.bytes_checked += nbytes
        progress.update(1, nbytes)
    if bad > MAX_LISTED_PER_SHARD:
        report.add(shard.path, f"{bad} damaged records in all ({MAX_LISTED_PER_SHARD} listed)")
    if num_classes == 0:  # --no-labels: every label is -1, nothing to count
        return np.zeros(0, dtype=np.int64)
    return np.bincount(index["label"], minlength=num_classes)


def check_shard(dataset, entry, manifest, decode, report, progress, max_pixels):
    """Check the shard of manifest ``entry`` in the folder ``dataset``; add each problem to
    ``report`` and return its label counts (an int64 array per class), or None when the
    shard could not be checked to the end (the problem is in ``report``). ``progress`` is a
    packer.progress.Progress advanced per record."""
    path = os.path.join(dataset, entry["name"])
    try:
        st = os.stat(path)
    except FileNotFoundError:
        report.add(path, "shard listed in the manifest is missing")
        return None
    if not stat.S_ISREG(st.st_mode):
        report.add(path, f"{describe_mode(st.st_mode)}, not a regular file")
        return None
    if st.st_size != entry["bytes"]:
        report.add(path, f"file is {st.st_size} bytes, the manifest says {entry['bytes']} "
                         f"(truncated or appended to)")
        return None
    shard = open_shard(dataset, entry, manifest["format"], num_classes=len(manifest["classes"]),
                       max_pixels=max_pixels)
    try:
        _note_retired_paths(shard.meta(), entry, manifest, report)  # meta: checksum checked
        if len(shard.index) != entry["num_samples"]:
            report.add(path, f"holds {len(shard.index)} records, the manifest says "
                             f"{entry['num_samples']}")
            return None
        return _check_records(shard, decode, len(manifest["classes"]), report, progress,
                              manifest.get("fields", {}))
    except (fmt.FormatError, FileNotFoundError) as exc:
        report.add(path, str(exc))
        return None
    except ValueError as exc:  # MappedFileError: the file shrank under the map (its metadata)
        report.add(path, f"cannot read the shard ({exc})")
        return None

def check_class_counts(manifest: dict, counts, where: str, report) -> None:
    """Add a problem when the labels counted in the shards differ from the manifest's."""
    if report.ok and counts.tolist() != manifest["class_counts"]:
        differ = [f"{name}: {c} stored, {m} in the manifest" for name, c, m in
                  zip(manifest["classes"], counts.tolist(), manifest["class_counts"]) if c != m]
        report.add(where, f"class_counts differ from the labels stored in the shards "
                          f"({'; '.join(differ[:5])})")


def _note_retired_paths(meta: dict, entry: dict, manifest: dict, report) -> None:
    """Keep in ``report`` the source path of each record of this shard that a retired pair
    names (for check_retired_sources); nothing when the shard records no paths."""
    paths, pairs = meta.get("paths"), fmt.retired_pairs(manifest)
    if not pairs or not isinstance(paths, list) or len(paths) != entry["num_samples"]:
        return
    named = np.asarray(pairs, dtype=np.int64).ravel()
    first = entry["first_sample"]
    for record in named[(named >= first) & (named < first + len(paths))].tolist():
        report.retired_paths[record] = paths[record - first]


def check_retired_sources(manifest: dict, where: str, report) -> None:
    """Add a problem when a retired ``[old, new]`` pair (reader/format/schema.py) names
    records packed from two different source paths: ``--replace-changed`` packs the same
    input again, so such a pair would show another input's image at the sample's index."""
    if not report.ok:
        return
    known = report.retired_paths
    bad = [(i, old, new) for i, (old, new) in enumerate(fmt.retired_pairs(manifest))
           if old in known and new in known and known[old] != known[new]]
    if bad:
        i, old, new = bad[0]
        report.add(where, f"retired[{i}]: record {old} ({known[old]}) is replaced by record "
                          f"{new} ({known[new]}), packed from another input; {len(bad)} "
                          f"such pair(s): the manifest's retired list is wrong (edited, or a "
                          f"packer bug); convert the source again")


def check_accounting(manifest: dict, where: str, report) -> None:
    """Add a problem when the manifest's inputs are not all packed or rejected."""
    problem = fmt.accounting_problem(manifest)
    if problem:
        report.add(where, problem)
