"""How many bytes and files are kept under a records folder (keep.py), counted on disk:
regular files of ours only, nothing followed (a recount when the ledger is missing or
damaged, and ``dlpack cache``'s report)."""
from __future__ import annotations

import os
import stat

from dlpack_io.reader import format as fmt


def usage(records_dir: str) -> tuple[int, int]:
    """(bytes, files) of kept records under ``records_dir``: regular files of ours only,
    temporary files and links not counted, nothing followed."""
    total = files = 0
    try:
        shards = os.listdir(records_dir)
    except FileNotFoundError:
        return 0, 0
    for shard in shards:
        folder = os.path.join(records_dir, shard)
        if shard.endswith(".shard") and shard[:-6].isdigit():  # assembled (assembled.py)
            st = os.lstat(folder)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                total, files = total + st.st_size, files + _records_in(folder, st.st_size)
            continue
        if not shard.isdigit() or not stat.S_ISDIR(os.lstat(folder).st_mode):
            continue
        for name in os.listdir(folder):
            st = os.lstat(os.path.join(folder, name))
            if name.isdigit() and stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                total, files = total + st.st_size, files + 1
    return total, files


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
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() else 0
