"""``dlpack verify``: prove that every byte with meaning in a data set is intact.

Checks, in order: the manifest (schema and its own checksum), then each shard
(shardcheck.check_shard: file, checksums, index entries, every record's CRC, padding, with
``decode=True`` every image), then the class counts, the accounting of inputs and that
each retired pair names two records of one source path (shardcheck.check_retired_sources).
A data set at s3://bucket/prefix is checked by remoteverify.verify_remote, each shard
streamed down and checked the same way.
Returns data; the CLI prints it.
"""
from __future__ import annotations

import os

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.dataset import NotADatasetError, load_manifest

# The exit codes are imported to be read here too: verify's callers (the CLI, tests) know
# this module, not where the report is defined.
from dlpack_io.tools.shardcheck import (EXIT_DAMAGED, EXIT_NOT_A_DATASET, EXIT_OK,  # noqa: F401
                                        VerifyReport, check_accounting, check_class_counts,
                                        check_retired_sources, check_shard)


def verify(dataset, *, decode: bool = False, progress: bool = True,
           max_pixels: int = fmt.DEFAULT_MAX_PIXELS) -> VerifyReport:
    """Check a data set folder; return a VerifyReport (``report.ok`` when intact,
    ``report.not_a_dataset`` when the folder has no manifest at all)."""
    from dlpack_io.packer.progress import Progress
    from dlpack_io.reader.remote.clouds import is_remote

    if is_remote(dataset):  # s3://: each shard streamed down and checked the same way
        # imported here: a local verify needs none of the object-storage wing
        from dlpack_io.tools.remoteverify import verify_remote

        return verify_remote(dataset, decode=decode, progress=progress, max_pixels=max_pixels)
    dataset = os.fspath(dataset)
    report = VerifyReport(dataset)
    try:
        manifest = load_manifest(dataset)
    except (fmt.FormatError, FileNotFoundError) as exc:
        report.not_a_dataset = isinstance(exc, NotADatasetError) or not os.path.isdir(dataset)
        report.add(os.path.join(dataset, fmt.MANIFEST_NAME), str(exc))
        return report
    bar = Progress(manifest["num_samples"], "verify", enabled=progress)
    counts = np.zeros(len(manifest["classes"]), dtype=np.int64)
    try:
        for entry in manifest["shards"]:
            shard_counts = check_shard(dataset, entry, manifest, decode, report, bar, max_pixels)
            report.shards_checked += 1
            if shard_counts is not None:
                counts += shard_counts
    finally:
        bar.close()
    check_class_counts(manifest, counts, os.path.join(dataset, fmt.MANIFEST_NAME), report)
    check_accounting(manifest, os.path.join(dataset, fmt.MANIFEST_NAME), report)
    check_retired_sources(manifest, os.path.join(dataset, fmt.MANIFEST_NAME), report)
    return report
