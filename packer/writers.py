"""Shard writers: records in, one complete shard file out, published by rename.

A writer writes to a hidden temporary name (``.shard-NNNNN.rec.partial``) and only a
finished, fsynced shard is renamed to its final name, so a file with a final shard name is
always complete. Both writers share the index table and metadata of reader.format. Files
are opened without following links, and a shard bound for object storage is uploaded and
checked on the server (``upload_shard``).
"""
from __future__ import annotations

import errno
import os
import stat

import numpy as np

from dlpack_io.packer.scan import shown
from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote.storage import StorageError, Store

PARTIAL_SUFFIX = ".partial"  # (after a leading dot) a shard still being written


def partial_name(name: str) -> str:
    """Temporary file name of a shard while it is being written."""
    return f".{name}{PARTIAL_SUFFIX}"


def fsync_dir(path) -> None:
    """Make renames inside directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _ShardWriter:
    """Common bookkeeping: index entries, source paths, temp-then-rename publishing."""

    def __init__(self, dst, shard_number: int, first_sample: int, data_format: str):
        self.dst = str(dst)
        self.name = fmt.shard_name(shard_number, data_format)
        self.tmp_path = os.path.join(self.dst, partial_name(self.name))
        self.final_path = os.path.join(self.dst, self.name)
        self.shard_number = shard_number
        self.first_sample = first_sample
        self.entries: list[tuple] = []
        self.paths: list[str] = []
        self.sources: list[str] = []  # SHA-256 of each input file (packer/appendbase.py)
        self.data_size = 0  # payload bytes so far, padding included (record) or not (lmdb)
        self.version = fmt.PLAIN_VERSION  # FORMAT_VERSION once records carry field blocks

    def __len__(self) -> int:
        return len(self.entries)

    def _entry(self, record, label: int, offset: int, fields: bytes | None) -> tuple:
        entry = (offset, len(record.payload), label, record.crc, record.height, record.width,
                 3, record.kind, record.orientation, record.colour)
        if fields is not None:  # format 3 (reader/format/fields.py): the block after the image
            if self.entries and self.version != fmt.FORMAT_VERSION:
                raise ValueError(f"{self.tmp_path}: a record with fields after records without")
            self.version = fmt.FORMAT_VERSION
            entry += (len(fields), fmt.crc32(fields))
        return entry

    def _index_and_meta(self) -> tuple[np.ndarray, dict]:
        index = np.array(self.entries, dtype=fmt.index_dtype(self.version))
        meta = {"shard": self.shard_number, "first_sample": self.first_sample,
                "paths": self.paths}
        if all(self.sources):  # every record's input identity: what an append compares
            meta[fmt.SOURCES_KEY] = self.sources
        return index, meta

    def _publish(self) -> dict:
        os.replace(self.tmp_path, self.final_path)
        fsync_dir(self.dst)
        return {"name": self.name, "num_samples": len(self.entries),
                "first_sample": self.first_sample, "bytes": os.path.getsize(self.final_path)}

    def abort(self) -> None:
        """Drop the unfinished shard (its temp file), leaving finished shards alone.

        Never raises: it runs while another error (often disk full) is on its way up.
        """
        try:
            self._close_quietly()
        except Exception:  # flushing a buffer onto a full disk fails again; the file goes anyway
            pass
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass

    def _close_quietly(self) -> None:
        raise NotImplementedError


class RecordShardWriter(_ShardWriter):
    """Writes a ``.rec`` shard: header page, aligned records, index table, metadata."""

    def __init__(self, dst, shard_number: int, first_sample: int):
        super().__init__(dst, shard_number, first_sample, "record")
        self._file = open(create_new(self.tmp_path), "wb")
        self._file.seek(fmt.HEADER_SIZE)

    def add(self, record, label: int, path: str, fields: bytes | None = None) -> None:
        """Append one EncodedRecord with its label and source path (and its field block:
        every record of a shard has one, or none has)."""
        offset = fmt.HEADER_SIZE + self.data_size
        self._file.write(record.payload)
        size = len(record.payload) + len(fields or b"")
        if fields:
            self._file.write(fields)
        padded = fmt.align_up(size)
        if padded > size:
            self._file.write(b"\0" * (padded - size))
        self.entries.append(self._entry(record, label, offset, fields))
        self.paths.append(shown(path))  # names from the wild: recorded escaped
        self.sources.append(getattr(record, "source_sha", ""))
        self.data_size += padded

    def finish(self) -> dict:
        """Write index, metadata and header, fsync, rename; return the manifest entry."""
        index, meta = self._index_and_meta()
        index_bytes, meta_bytes = index.tobytes(), fmt.encode_meta(meta)
        page, header = fmt.pack_header(len(index), self.data_size, len(meta_bytes),
                                       fmt.crc32(index_bytes), fmt.crc32(meta_bytes), self.version)
        self._file.write(index_bytes)
        self._file.write(meta_bytes)
        self._file.seek(0)
        self._file.write(page)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return dict(self._publish(), crc=header.header_crc)

    def _close_quietly(self) -> None:
        self._file.close()


class LmdbShardWriter(_ShardWriter):
    """Writes a single-file LMDB shard: records under big-endian index keys."""

    COMMIT_BYTES = 64 * 2**20  # bound the dirty pages of one write transaction

    def __init__(self, dst, shard_number: int, first_sample: int, shard_size: int):
        import lmdb

        super().__init__(dst, shard_number, first_sample, "lmdb")
        # map_size is address space, not disk: room for an over-full last record too.
        # meminit=True: unused page space is zeroed, not leftover heap memory, so the same
        # records give the same file bytes (and no process memory leaks into the shard).
        map_size = 2 * shard_size + 2**30
        os.close(create_new(self.tmp_path))  # a fresh file: liblmdb would follow a planted link
        self._env = lmdb.open(self.tmp_path, subdir=False, map_size=map_size, lock=False,
                              sync=False, metasync=False, readahead=False, meminit=True)
        self._txn = self._env.begin(write=True)
        self._uncommitted = 0

    def add(self, record, label: int, path: str, fields: bytes | None = None) -> None:
        """Append one EncodedRecord with its label and source path (and field block)."""
        key = fmt.lmdb_record_key(len(self.entries))
        value = record.payload + fields if fields else record.payload
        self._txn.put(key, value, append=True)
        self.entries.append(self._entry(record, label, 0, fields))
        self.paths.append(shown(path))  # names from the wild: recorded escaped
        self.sources.append(getattr(record, "source_sha", ""))
        self.data_size += len(value)
        self._uncommitted += len(value)
        if self._uncommitted >= self.COMMIT_BYTES:
            self._txn.commit()
            self._txn = self._env.begin(write=True)
            self._uncommitted = 0

    def finish(self) -> dict:
        """Store index and metadata keys, sync, close, rename; return the manifest entry."""
        index, meta = self._index_and_meta()
        index_bytes = index.tobytes()
        meta_bytes = fmt.encode_meta(fmt.lmdb_meta(len(index), fmt.crc32(index_bytes), meta,
                                                   self.version))
        self._txn.put(fmt.LMDB_INDEX_KEY, index_bytes)
        self._txn.put(fmt.LMDB_META_KEY, meta_bytes)
        self._txn.commit()
        self._env.sync(True)
        self._env.close()
        with open(self.tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        return dict(self._publish(), crc=fmt.crc32(meta_bytes))

    def _close_quietly(self) -> None:
        try:
            self._txn.abort()
        finally:
            self._env.close()


def open_writer(data_format: str, dst, shard_number: int, first_sample: int, shard_size: int):
    """A writer of the given format for shard ``shard_number``."""
    if data_format == "lmdb":
        return LmdbShardWriter(dst, shard_number, first_sample, shard_size)
    return RecordShardWriter(dst, shard_number, first_sample)



# ---- files opened without following links ----------------------------------------------------
# Create and append to files in DST without ever following a symlink.
#
# A destination folder may hold entries nobody on this machine made (a copied or shared
# folder): a ``.dlpack-convert.lock`` that is a symlink to ``~/.bashrc`` must not make
# ``dlpack convert`` truncate that file. Every file the packer creates goes through
# ``create_new`` (O_CREAT | O_EXCL | O_NOFOLLOW: a fresh inode, whatever sat at that name
# before is unlinked first, never written through), and files it reopens through
# ``open_nofollow`` (O_NOFOLLOW: a symlink is an error naming the path).
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_new(path: str, mode: int = 0o644) -> int:
    """A write-only fd of a brand-new regular file at ``path`` (any old entry is unlinked:
    for a symlink that removes the link, never its target)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return os.open(path, _NEW, mode)


def open_nofollow(path: str, flags: int, mode: int = 0o644) -> int:
    """os.open with O_NOFOLLOW | O_NONBLOCK; OSError naming the path unless it is a
    regular file (a symlink, FIFO or device in DST is never ours to write)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symbolic link; dlpack never writes "
                                       f"through links in DST: remove it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file; remove it")
    os.set_blocking(fd, True)
    return fd


# ---- a shard uploaded to object storage ------------------------------------------------------
# One shard in object storage: upload it and check the object against the journal's
# entry. Used by the local engine's upload thread (upload.py) and by the Ray engine's shard
# tasks (engines.py), which upload from their own node.
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
