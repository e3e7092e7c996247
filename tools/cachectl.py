"""What ``dlpack cache ls|du|clear`` shows and frees: the data sets kept in a cache_dir.

Returns data; tools/cli_cache.py prints it. The rules of the cache hold here too (see
reader/remote/cache.py): only real folders of this user with the names dlpack gives
(``ds-<crc>-<sha>``) are counted or removed, links are never followed, and a data set that
a running process has open (its ``.use`` lock is held, or a session lock is) is never
removed: ``clear`` takes the exclusive lock, renames the folder out of the way while holding
it and only then deletes it, so a process opening the data set at that moment starts afresh.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import uuid
from dataclasses import dataclass

from dlpack_io.reader.remote import cache as cache_mod
from dlpack_io.reader.remote import keep

KEY_RE = re.compile(r"ds-[0-9a-f]{8}-[0-9a-f]{16}")
_TRASH_RE = re.compile(r"\.trash-ds-[0-9a-f]{8}-[0-9a-f]{16}-[0-9a-f]{12}")


@dataclass
class Entry:
    """One cached data set: its folder name, URL, bytes on disk, kept records, pooled
    shards, and whether a running process has it open."""

    key: str
    url: str
    bytes: int
    records: int
    shards: int
    in_use: bool


def folder_bytes(path: str) -> int:
    """Bytes of the regular files below ``path`` (links not followed, not counted)."""
    total = 0
    for folder, _, files in os.walk(path):  # os.walk does not follow links by default
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _url(root: str) -> str:
    """The URL in ``root``'s source file, as one printable line: the file is untrusted (a
    newline or a terminal escape in it must not forge or hide lines of ``ls``)."""
    raw = cache_mod.read_file(os.path.join(root, cache_mod.SOURCE_NAME), 4096)
    if not raw:
        return "(unknown URL)"
    text = raw.decode("utf-8", "replace")
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _pooled(root: str) -> int:
    pool = os.path.join(root, "shards")
    if not cache_mod.own_dir(pool):
        return 0
    return sum(1 for n in os.listdir(pool) if not n.startswith(".")
               and stat.S_ISREG(os.lstat(os.path.join(pool, n)).st_mode))


def _sessions_alive(root: str) -> bool:
    """True when a session lock below ``root`` is held (a process has the data set open)."""
    sessions = os.path.join(root, "sessions")
    if not cache_mod.own_dir(sessions):
        return False
    for name in os.listdir(sessions):
        opened = cache_mod.open_regular(os.path.join(sessions, name, ".lock"))
        if opened is None:
            continue
        try:
            fcntl.flock(opened[0], fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return True
            raise
        finally:
            os.close(opened[0])
    return False


def _in_use(root: str) -> bool:
    fd = cache_mod.hold_use(root, exclusive=True)
    if fd is None:
        return True
    os.close(fd)
    return _sessions_alive(root)


def entries(cache_dir: str) -> list[Entry]:
    """The data sets cached in ``cache_dir``, by key (an empty list when there is none)."""
    if not cache_mod.own_dir(cache_dir):
        return []
    out = []
    for key in sorted(os.listdir(cache_dir)):
        root = os.path.join(cache_dir, key)
        if not KEY_RE.fullmatch(key) or not cache_mod.own_dir(root):
            continue
        out.append(Entry(key, _url(root), folder_bytes(root),
                         keep.usage(os.path.join(root, "records"))[1], _pooled(root),
                         _in_use(root)))
    return out


def clear(cache_dir: str, keys=None) -> tuple[list[Entry], list[Entry], list[str]]:
    """Remove the cached data sets ``keys`` (all when None) that no process has open.
    Returns (removed, left because in use, keys not found)."""
    found = {e.key: e for e in entries(cache_dir)}
    wanted = list(found) if not keys else list(keys)
    removed, busy = [], []
    for key in wanted:
        entry = found.get(key)
        if entry is None:
            continue
        root = os.path.join(cache_dir, key)
        fd = cache_mod.hold_use(root, exclusive=True)
        if fd is None or _sessions_alive(root):
            busy.append(entry)
            if fd is not None:
                os.close(fd)
            continue
        trash = os.path.join(cache_dir, f".trash-{key}-{uuid.uuid4().hex[:12]}")
        try:
            os.rename(root, trash)  # while locked: an opener now finds no folder, makes one
        finally:
            os.close(fd)
        shutil.rmtree(trash)
        removed.append(entry)
    for name in os.listdir(cache_dir):  # debris of a clear that was interrupted
        if _TRASH_RE.fullmatch(name) and cache_mod.own_dir(os.path.join(cache_dir, name)):
            shutil.rmtree(os.path.join(cache_dir, name), ignore_errors=True)
    return removed, busy, [k for k in wanted if k not in found]
