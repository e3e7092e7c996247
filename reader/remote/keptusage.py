"""How many bytes and files are kept under a records folder (keep.py), counted on disk:
regular files of ours only, nothing followed (a recount when the ledger is missing or
damaged, and ``dlpack cache``'s report). Entries removed while they are counted (another
process's ``dlpack cache clear``) are skipped, never an error."""
from __future__ import annotations

import os
import stat

from dlpack_io.reader import format as fmt


def usage(records_dir: str) -> tuple[int, int]:
    """(bytes, files) of kept records under ``records_dir``: regular files of ours only,
    temporary files and links not counted, nothing followed (a shard still growing counts
    its size, as the ledger does, and no records)."""
    try:
        names = os.listdir(records_dir)
    except FileNotFoundError:
        return 0, 0
    return usage_of(records_dir, names)


def usage_of(records_dir: str, names) -> tuple[int, int]:
    """(bytes, files) of the entries ``names`` listed in ``records_dir``. Another process
    may have removed any of them since (``dlpack cache clear``): those count nothing. A
    shard assembled as ``<k>.shard`` counts once, as the ledger does: its ``<k>.grow`` (a
    second name of the same file) and ``<k>/`` (record files about to be removed) are not
    counted again."""
    total = files = 0
    assembled = set()  # its .grow (the same file) and record files (being removed) count 0
    for shard in sorted(names, key=lambda name: not name.endswith(".shard")):
        folder = os.path.join(records_dir, shard)
        st = _lstat(folder)
        if st is None or shard.removesuffix(".grow") in assembled:
            continue
        if shard.endswith(".shard") and shard[:-6].isdigit():  # assembled (assembled.py)
            if _regular_ours(st):
                total, files = total + st.st_size, files + _records_in(folder, st.st_size)
                assembled.add(shard[:-6])
            continue
        if shard.endswith(".grow") and shard[:-5].isdigit():  # filling (growing.py): bytes
            total += st.st_size if _regular_ours(st) else 0  # on the ledger, records not yet
            continue
        if not shard.isdigit() or not stat.S_ISDIR(st.st_mode):
            continue
        try:
            kept = os.listdir(folder)
        except FileNotFoundError:
            continue
        for name in kept:
            st = _lstat(os.path.join(folder, name)) if name.isdigit() else None
            if st is not None and _regular_ours(st):
                total, files = total + st.st_size, files + 1
    return total, files


def _lstat(path: str):
    """``lstat`` of ``path``, or None when it was removed since it was listed."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _regular_ours(st) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _records_in(path: str, size: int) -> int:
    """Records of an assembled shard, from its header page (0 when it is not valid)."""
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as f:
            return fmt.unpack_header(f.read(fmt.HEADER_SIZE), size, path).num_records
    except (OSError, fmt.FormatError):
        return 0


def counted_size(path: str) -> int:
    """The bytes ``usage`` counts for the kept file at ``path``: its size when it is a
    regular file of ours, else 0 (a link or a planted file is never on the ledger)."""
    st = _lstat(path)
    return st.st_size if st is not None and _regular_ours(st) else 0
