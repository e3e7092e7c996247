"""One shard in object storage: upload it and check the object against the journal's
entry. Used by the local engine's upload thread (upload.py) and by the Ray engine's shard
tasks (ray_tasks.py), which upload from their own node."""
from __future__ import annotations

import os

from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote.storage import StorageError, Store


def upload_shard(store: Store, staging: str, entry: dict) -> None:
    """Upload one finished shard, check it on the server, delete the local copy."""
    path = os.path.join(staging, entry["name"])
    store.put_file(entry["name"], path)
    if not remote_shard_ok(store, entry):
        raise StorageError(f"{store.where(entry['name'])}: the uploaded object does not match "
                           f"the shard that was written (size or header checksum)")
    os.unlink(path)


def remote_shard_ok(store: Store, entry: dict) -> bool:
    """The object is the shard the journal describes: size, and header CRC for records."""
    head = store.head(entry["name"])
    if head is None or head["size"] != entry["bytes"]:
        return False
    if not entry["name"].endswith(fmt.SHARD_SUFFIX["record"]):
        return True
    page = store.get_range(entry["name"], 0, fmt.HEADER_SIZE)
    try:
        header = fmt.unpack_header(page, entry["bytes"], store.where(entry["name"]))
    except fmt.FormatError:
        return False
    return header.header_crc == entry["crc"]


def remote_shard_paths(store: Store, entry: dict) -> list | None:
    """The source paths a record shard in the bucket lists in its own metadata (checked
    against its header's CRC; two range requests, bounded by the header the journal's size
    vouches for), or None when they cannot be read or the shard is LMDB (its metadata is
    not at a known range)."""
    meta = remote_shard_meta(store, entry)
    paths = None if meta is None else meta.get("paths")
    return paths if isinstance(paths, list) else None


def remote_shard_meta(store: Store, entry: dict) -> dict | None:
    """A record shard's metadata dict in the bucket (remote_shard_paths' two range
    requests), or None when it cannot be read or the shard is LMDB."""
    if not entry["name"].endswith(fmt.SHARD_SUFFIX["record"]):
        return None
    try:
        page = store.get_range(entry["name"], 0, fmt.HEADER_SIZE)
        header = fmt.unpack_header(page, entry["bytes"], store.where(entry["name"]))
        meta = store.get_range(entry["name"], header.meta_offset,
                               header.meta_offset + header.meta_size)
        if fmt.crc32(meta) != header.meta_crc:
            return None
        return fmt.decode_json(meta, store.where(entry["name"]))
    except (fmt.FormatError, StorageError):
        return None

