"""``dlpack verify s3://bucket/prefix``: the local checks, on each shard streamed down once.

Each shard is downloaded (parallel range requests) into a temporary folder, checked with
exactly the code that checks a local data set (shardcheck.check_shard), and deleted
before the next, so the local disk needs room for one shard. Problems name the URL.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote.storage import (ObjectChangedError, StorageError, Store,
                                             run_sync)
from dlpack_io.tools.shardcheck import (VerifyReport, check_accounting, check_class_counts,
                                        check_retired_sources, check_shard)


async def download(store: Store, name: str, size: int, path: str, *, parts: int = 8,
                   part_size: int = 8 * 2**20) -> None:
    """Write object ``name`` (``size`` bytes) to ``path`` with ``parts`` ranges in flight:
    ``parts`` workers take the ranges one by one (memory does not grow with ``size``), and
    the first failure stops them all."""
    starts = iter(range(0, size, part_size))  # shared by the workers, never a list
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)

    async def worker():
        for start in starts:
            os.pwrite(fd, await store.aget_range(name, start, min(start + part_size, size)),
                      start)
    tasks = [asyncio.ensure_future(worker()) for _ in range(parts)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        os.close(fd)


def _read_manifest(store: Store, manifest_url: str, report) -> dict | None:
    """The validated manifest, or None with the problem added to ``report`` (a missing one
    marks the URL as not a data set); its size is bounded before it is read whole."""
    meta = store.head(fmt.MANIFEST_NAME)
    if meta is None:
        report.not_a_dataset = True
        report.add(manifest_url, "not found: this prefix is not a dlpack data set (an upload "
                                 "still running or interrupted, or the wrong prefix)")
        return None
    if meta["size"] > fmt.MAX_MANIFEST_BYTES:
        report.add(manifest_url, f"{meta['size']} bytes, more than the {fmt.MAX_MANIFEST_BYTES} "
                                 f"a manifest may have")
        return None
    raw = store.get_range(fmt.MANIFEST_NAME, 0, meta["size"], etag=meta["etag"])
    return fmt.validate_manifest(fmt.decode_json(raw, manifest_url), manifest_url)


def _unreadable(exc: BaseException) -> bool:
    """True when ``exc`` says the storage could not be read (endpoint, credentials, bucket,
    a server that failed every retry), not that the data set is damaged: a replaced or
    truncated object (ObjectChangedError) and bad bytes (FormatError) are damage."""
    return isinstance(exc, StorageError) and not isinstance(exc, ObjectChangedError)


def verify_remote(url: str, *, decode: bool = False, progress: bool = True,
                  max_pixels: int = fmt.DEFAULT_MAX_PIXELS):
    """Verify the data set at ``url``; returns a shardcheck.VerifyReport."""
    from dlpack_io.packer.progress import Progress

    report = VerifyReport(url)
    manifest_url = f"{url.rstrip('/')}/{fmt.MANIFEST_NAME}"
    try:
        store = Store(url)
        manifest = _read_manifest(store, manifest_url, report)
    except (fmt.FormatError, StorageError) as exc:
        report.add(manifest_url, str(exc), storage=_unreadable(exc))
        return report
    if manifest is None:
        return report
    bar = Progress(manifest["num_samples"], "verify", enabled=progress)
    counts = np.zeros(len(manifest["classes"]), dtype=np.int64)
    try:
        with tempfile.TemporaryDirectory(prefix="dlpack-verify-") as tmp:
            for entry in manifest["shards"]:
                shard_counts = _check_remote_shard(store, tmp, entry, manifest, decode, report,
                                                   bar, max_pixels)
                report.shards_checked += 1
                if shard_counts is not None:
                    counts += shard_counts
    finally:
        bar.close()
    check_class_counts(manifest, counts, manifest_url, report)
    check_accounting(manifest, manifest_url, report)
    check_retired_sources(manifest, manifest_url, report)
    return report


def _check_remote_shard(store, tmp, entry, manifest, decode, report, bar, max_pixels):
    """Download one shard into ``tmp``, check it as a local one, delete it; its label counts
    or None (as check_shard)."""
    name = fmt.check_shard_name(entry["name"], "manifest")
    where = store.where(name)
    try:
        head = store.head(name)
        if head is None:
            report.add(where, "shard listed in the manifest is missing")
            return None
        if head["size"] != entry["bytes"]:
            report.add(where, f"object is {head['size']} bytes, the manifest says "
                              f"{entry['bytes']} (truncated or replaced)")
            return None
        free = shutil.disk_usage(tmp).free
        if entry["bytes"] > free:  # checked one shard at a time, in a temporary copy
            report.add(where, f"not checked: {entry['bytes']} bytes, more than the {free} bytes "
                              f"free in {os.path.dirname(tmp)}, where verify copies one shard "
                              f"at a time; set TMPDIR to a folder with room", storage=True)
            return None
        run_sync(download(store, name, entry["bytes"], os.path.join(tmp, name)))
    except StorageError as exc:
        report.add(where, str(exc), storage=_unreadable(exc))
        return None
    except OSError as exc:  # the temporary copy, not the data set
        report.add(where, f"not checked: its temporary copy in {os.path.dirname(tmp)} could not "
                          f"be written ({exc.strerror or exc}); set TMPDIR to a folder with room",
                   storage=True)
        return None
    first = len(report.problems)
    try:
        return check_shard(tmp, entry, manifest, decode, report, bar, max_pixels)
    finally:
        for problem in report.problems[first:]:  # name the object, not the temporary copy
            problem["where"] = problem["where"].replace(os.path.join(tmp, name), where)
        os.unlink(os.path.join(tmp, name))
