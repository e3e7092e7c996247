"""What a conversion may find, keep and delete in its destination folder.

Only files this tool writes are ever deleted: shards, their partial temp files, the
manifest, the rejects file and temp files of atomic writes. Anything else is left alone.
"""
from __future__ import annotations

import os
import re

from dlpack_io.packer.finalize import TMP_INFIX
from dlpack_io.packer.journal import JOURNAL_NAME, JOURNAL_TMP_NAME, LOCK_NAME
from dlpack_io.packer.pipeline import ConversionError
from dlpack_io.packer.writers import PARTIAL_SUFFIX
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.inputstat import INPUTSTAT_NAME
from dlpack_io.reader.format.regular import open_regular


def _either(*names: str) -> str:
    return "(" + "|".join(re.escape(n) for n in names) + ")"


# Built from the names' owners (format, writers, finalize, journal) so that a renamed file
# can never be left out of what a cleanup may delete. ("shard-NNNNN" is fmt.shard_name's.)
_OURS = re.compile(rf"^(\.?shard-\d{{5,}}{_either(*fmt.SHARD_SUFFIX.values())}"
                   rf"({re.escape(PARTIAL_SUFFIX)})?"
                   rf"|{_either(fmt.MANIFEST_NAME, fmt.REJECTS_NAME, INPUTSTAT_NAME)}({re.escape(TMP_INFIX)}\d+)?"
                   rf"|{_either(JOURNAL_NAME, JOURNAL_TMP_NAME)})$")


def not_empty_error(where: str, names) -> ConversionError:
    """The refusal to convert into a non-empty destination (a folder or an s3:// prefix)
    without --resume or --overwrite, naming a few of the ``names`` found there."""
    return ConversionError(f"{where} is not empty ({', '.join(sorted(names)[:3])}...); pass "
                           f"--resume to finish an interrupted conversion or --overwrite "
                           f"to replace what is there")


def existing_entries(dst) -> list[str]:
    """Names in ``dst`` other than our lock file (the folder need not exist)."""
    try:
        return [n for n in os.listdir(dst) if n != LOCK_NAME]
    except FileNotFoundError:
        return []


def clear_outputs(dst, keep=frozenset()) -> list[str]:
    """Delete our files in ``dst`` except the shards named in ``keep`` and the journal
    (when anything is kept); return the names deleted."""
    removed = []
    for name in existing_entries(dst):
        if not _OURS.match(name) or name in keep or (keep and name == JOURNAL_NAME):
            continue
        os.unlink(os.path.join(dst, name))
        removed.append(name)
    return removed


def verify_kept_shard(dst, entry: dict) -> bool:
    """Cheap check that a journaled shard is still the file we wrote: its size, and the
    CRC the manifest will carry (record shards: of the header; LMDB shards: of the
    metadata value, read after the B-tree was checked). Record bytes are not re-read."""
    path = os.path.join(dst, entry["name"])
    try:
        size = os.path.getsize(path)
        if size != entry["bytes"]:
            return False
        if entry["name"].endswith(fmt.SHARD_SUFFIX["record"]):
            fd, _ = open_regular(path)  # a FIFO in DST must not block us under its lock
            with open(fd, "rb") as f:
                header = fmt.unpack_header(f.read(fmt.HEADER_SIZE), size, path)
            return header.header_crc == entry["crc"]
        meta = _lmdb_meta(path)
        return meta is not None and fmt.crc32(meta) == entry["crc"]
    except (OSError, fmt.FormatError):
        return False


def kept_shard_paths(dst, entry: dict) -> list | None:
    """The source paths a kept shard's own metadata lists (checked against its CRC), or
    None when they cannot be read: what a journal line's accounting is compared with."""
    meta = kept_shard_meta(dst, entry)
    paths = None if meta is None else meta.get("paths")
    return paths if isinstance(paths, list) else None


def kept_shard_meta(dst, entry: dict) -> dict | None:
    """A shard's own metadata dict (checked against its CRC), or None when it cannot be
    read (record shards: the header's metadata CRC; LMDB: the B-tree checked first)."""
    path = os.path.join(dst, entry["name"])
    try:
        if entry["name"].endswith(fmt.SHARD_SUFFIX["record"]):
            fd, st = open_regular(path)  # a FIFO in DST must not block us under its lock
            with open(fd, "rb") as f:
                size = st.st_size
                header = fmt.unpack_header(f.read(fmt.HEADER_SIZE), size, path)
                meta = os.pread(f.fileno(), header.meta_size, header.meta_offset)
            if fmt.crc32(meta) != header.meta_crc:
                return None
        else:
            meta = _lmdb_meta(path)
        return None if meta is None else fmt.decode_json(meta, path)
    except (OSError, fmt.FormatError):
        return None


def _lmdb_meta(path: str):
    """An LMDB shard's metadata value (None if it has none); FormatError when its
    structure is damaged (checked before liblmdb reads it)."""
    import lmdb

    from dlpack_io.reader.format.lmdbcheck import check_lmdb

    check_lmdb(path)
    try:
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False,
                        max_readers=1)
    except lmdb.Error:
        return None
    try:
        with env.begin(buffers=False) as txn:
            meta = txn.get(fmt.LMDB_META_KEY)
    except lmdb.Error:
        return None
    finally:
        env.close()
    return meta


def check_src_dst(src, dst) -> None:
    """Refuse a DST that is SRC, lies inside SRC, or contains SRC (after resolving links).

    Packing into the source tree makes the next conversion of SRC find the data set as an
    extra class; packing over the source lets --overwrite delete what it reads.
    """
    s, d = os.path.realpath(src), os.path.realpath(dst)
    if d == s:
        why = "DST is the source folder itself"
    elif d.startswith(s.rstrip(os.sep) + os.sep):
        why = (f"DST lies inside the source folder ({s}): the next conversion of SRC would "
               f"pack the data set's own files as an extra class")
    elif s.startswith(d.rstrip(os.sep) + os.sep):
        why = f"the source folder lies inside DST ({d}): --overwrite would delete the inputs"
    else:
        return
    raise ConversionError(f"{dst}: {why}; choose a DST outside SRC (for example next to it)")
