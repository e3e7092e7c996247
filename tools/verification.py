"""``dlpack verify``: prove that every byte with meaning in a data set is intact.

Checks, in order: the manifest (schema and its own checksum), then each shard: present,
the size the manifest says, header/metadata checksums and the header CRC recorded in the
manifest, index checksum and bounds, record count, every record's CRC, labels in range,
class counts; with ``decode=True`` each image is also decoded and its size checked.
Returns data; the CLI prints it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.decode import decode_record
from dlpack_io.reader.manifest import load_manifest
from dlpack_io.reader.shard import open_shard

MAX_LISTED_PER_SHARD = 20


@dataclass
class VerifyReport:
    """What verify found: problems (each naming a file and, if any, a record)."""

    path: str
    problems: list = field(default_factory=list)
    shards_checked: int = 0
    records_checked: int = 0
    bytes_checked: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def add(self, where: str, problem: str) -> None:
        """Record one problem at ``where`` (a file, optionally with a record number)."""
        self.problems.append({"where": where, "problem": problem})

    def to_dict(self) -> dict:
        """Plain-data form for --json."""
        return {"path": self.path, "ok": self.ok, "problems": self.problems,
                "shards_checked": self.shards_checked, "records_checked": self.records_checked,
                "bytes_checked": self.bytes_checked}


def _padding_problem(shard, j: int, gap_end: int) -> str | None:
    """Alignment padding after record ``j`` must be zero bytes: nothing may hide there."""
    entry = shard.index[j]
    start = int(entry["offset"]) + int(entry["length"])
    if gap_end - start >= fmt.RECORD_ALIGN or any(shard.span(start, gap_end)):
        return f"padding bytes {start}..{gap_end - 1} after the record are not {gap_end - start} zeros"
    return None


def _check_records(shard, decode: bool, num_classes: int, report: VerifyReport, progress) -> np.ndarray:
    index = shard.index
    header = getattr(shard, "header", None)  # record shards: padding must be zero too
    bad = 0
    for j in range(len(index)):
        gap_end = None
        if header is not None:
            gap_end = int(index["offset"][j + 1]) if j + 1 < len(index) else header.index_offset
        entry = index[j]
        payload = shard.payload(j)
        problem = None
        if fmt.crc32(payload) != int(entry["crc"]):
            problem = "record checksum mismatch: damaged data"
        elif not 0 <= int(entry["label"]) < num_classes:
            problem = f"label {int(entry['label'])} outside 0..{num_classes - 1}"
        elif decode:
            try:
                decode_record(payload, entry, f"{shard.path} record {j}")
            except fmt.FormatError as exc:
                problem = str(exc)
        if problem:
            bad += 1
            if bad <= MAX_LISTED_PER_SHARD:
                report.add(f"{shard.path} record {j}", problem)
        if problem is None and gap_end is not None:
            problem = _padding_problem(shard, j, gap_end)
            if problem:
                bad += 1
                report.add(f"{shard.path} record {j}", problem)
        report.records_checked += 1
        report.bytes_checked += len(payload)
        progress.update(1, len(payload))
    if bad > MAX_LISTED_PER_SHARD:
        report.add(shard.path, f"{bad} damaged records in all ({MAX_LISTED_PER_SHARD} listed)")
    return np.bincount(index["label"].clip(0, max(num_classes - 1, 0)), minlength=num_classes)


def _check_shard(dataset, entry, manifest, decode, report, progress):
    path = os.path.join(dataset, entry["name"])
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        report.add(path, "shard listed in the manifest is missing")
        return None
    if size != entry["bytes"]:
        report.add(path, f"file is {size} bytes, the manifest says {entry['bytes']} "
                         f"(truncated or appended to)")
        return None
    shard = open_shard(dataset, entry, manifest["format"])
    try:
        shard.meta()  # checks the metadata checksum
        if len(shard.index) != entry["num_samples"]:
            report.add(path, f"holds {len(shard.index)} records, the manifest says "
                             f"{entry['num_samples']}")
            return None
        return _check_records(shard, decode, len(manifest["classes"]), report, progress)
    except (fmt.FormatError, FileNotFoundError) as exc:
        report.add(path, str(exc))
        return None


def verify(dataset, *, decode: bool = False, progress: bool = True) -> VerifyReport:
    """Check a data set folder; return a VerifyReport (``report.ok`` when intact)."""
    from dlpack_io.packer.progress import Progress
    from dlpack_io.reader.storage import is_remote

    if is_remote(dataset):  # s3://: each shard streamed down and checked the same way
        from dlpack_io.tools.remoteverify import verify_remote

        return verify_remote(dataset, decode=decode, progress=progress)
    dataset = os.fspath(dataset)
    report = VerifyReport(dataset)
    try:
        manifest = load_manifest(dataset)
    except (fmt.FormatError, FileNotFoundError) as exc:
        report.add(os.path.join(dataset, fmt.MANIFEST_NAME), str(exc))
        return report
    bar = Progress(manifest["num_samples"], "verify", enabled=progress)
    counts = np.zeros(len(manifest["classes"]), dtype=np.int64)
    try:
        for entry in manifest["shards"]:
            shard_counts = _check_shard(dataset, entry, manifest, decode, report, bar)
            report.shards_checked += 1
            if shard_counts is not None:
                counts += shard_counts
    finally:
        bar.close()
    if report.ok and counts.tolist() != manifest["class_counts"]:
        report.add(os.path.join(dataset, fmt.MANIFEST_NAME),
                   f"class_counts {manifest['class_counts']} differ from the labels stored in "
                   f"the shards {counts.tolist()}")
    return report
