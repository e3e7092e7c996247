"""What the Ray engine's tasks run: plain functions of plain data (this module never
imports ray, so they are tested, and can be debugged, without a cluster).

Phase 1, ``encode_segment``: encode a fixed range of inputs exactly as the local engine's
workers do (``encode.encode_path``) and return the per-input outcome (small, goes to the
driver) and the payloads concatenated into one array (large, stays in Ray's object store).
Phase 2, ``assemble_shard``: write one shard, planned by the driver with the local rule,
from slices of those arrays through the local engine's own writer, which publishes it by
rename. A retried attempt first removes what a killed attempt left.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile

import numpy as np

from dlpack_io.packer.encode import encode_path
from dlpack_io.packer.records import EncodedRecord
from dlpack_io.packer.writers import open_writer, partial_name
from dlpack_io.reader import format as fmt

PROBE_PREFIX = ".dlpack-probe-"  # name of the objects probe_store writes and deletes


def encode_segment(items: list, options: dict) -> tuple[list, np.ndarray]:
    """Encode ``items`` ((path, size, mtime_ns) each); return (outcomes, payloads).

    Outcome per input, in order: ``("ok", offset, length, crc, height, width, kind,
    orientation, colour, reencoded, lossless, source_bytes, source_sha)`` with the payload at
    ``payloads[offset:offset + length]``, or ``("reject", reason)`` with the local engine's
    reason.
    """
    outcomes, parts, offset = [], [], 0
    for item in items:
        status, value = encode_path(item, options)
        if status != "ok":
            outcomes.append((status, value))
            continue
        length = len(value.payload)
        outcomes.append(("ok", offset, length, value.crc, value.height, value.width,
                         value.kind, value.orientation, value.colour, value.reencoded,
                         value.lossless, value.source_bytes, value.source_sha))
        parts.append(value.payload)
        offset += length
    return outcomes, np.frombuffer(b"".join(parts), dtype=np.uint8)


def assemble_shard(dst, data_format: str, shard_number: int, first_sample: int,
                   shard_size: int, items: list, *payloads, upload=None) -> dict:
    """Write shard ``shard_number``; return its manifest entry (the local writer's).

    ``items`` are ``(array, offset, length, label, path, crc, height, width, kind,
    orientation, colour, source_sha)`` in shard order, ``array`` indexing ``payloads`` (encode_segment's
    arrays, which Ray hands over without copying). ``upload``: ``(url, storage_options)``
    of an s3:// DST; the shard is then written under a temporary folder here (``dst`` is
    not used) and uploaded, and the local copy removed.
    """
    if upload is None:
        return _write_shard(dst, data_format, shard_number, first_sample, shard_size, items,
                            payloads)
    from dlpack_io.packer.remoteshard import upload_shard
    from dlpack_io.reader.remote.storage import Store

    url, storage_options = upload
    staging = tempfile.mkdtemp(prefix="dlpack-ray-shard-")
    try:
        entry = _write_shard(staging, data_format, shard_number, first_sample, shard_size,
                             items, payloads)
        upload_shard(Store(url, storage_options=storage_options), staging, entry)
        return entry
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def probe_store(url: str, storage_options: dict | None) -> str:
    """Write and delete a small object under ``url`` from this node; returns the node's
    host name. Raises StorageError when this node cannot write there."""
    from dlpack_io.reader.remote.storage import Store

    store = Store(url, storage_options=storage_options)
    name = f"{PROBE_PREFIX}{socket.gethostname()}-{os.getpid()}"
    store.put(name, b"dlpack: can this node write here?")
    store.delete(name)
    return socket.gethostname()


def _write_shard(dst, data_format, shard_number, first_sample, shard_size, items,
                 payloads) -> dict:
    stale = os.path.join(dst, partial_name(fmt.shard_name(shard_number, data_format)))
    try:  # a killed attempt's temp file: LMDB would reopen it instead of starting afresh
        os.unlink(stale)
    except FileNotFoundError:
        pass
    writer = open_writer(data_format, dst, shard_number, first_sample, shard_size)
    try:
        views = [memoryview(p) for p in payloads]
        for array, offset, length, label, path, crc, height, width, kind, orientation, \
                colour, *sha in items:  # sha: [the input's SHA-256], absent in older items
            record = EncodedRecord(views[array][offset:offset + length], height, width, kind,
                                   crc=crc, orientation=orientation, colour=colour,
                                   source_sha=sha[0] if sha else "")
            writer.add(record, label, path)
        return writer.finish()
    except BaseException:  # cancelled, disk full...: no temp file stays behind
        writer.abort()
        raise
