"""Reading files of a data set that may come from anyone, and files that may change.

Regular files only, never blocking; reads that cannot fault (``pread``) for what is
checked once at open. Copies of mapped memory are made under the native SIGBUS guard
(nativecopy.py).

A FIFO opened for reading blocks until a writer appears, forever (tar keeps FIFOs); a
symlink to /dev/zero reads without end. Every file a reader opens goes through
``format.regular.open_regular`` (O_NONBLOCK, then fstat: S_ISREG or a FormatError naming it).
"""
from __future__ import annotations

import os


from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.regular import open_regular

def read_limited(path: str, limit: int) -> bytes:
    """The whole regular file ``path``, refusing one larger than ``limit`` bytes."""
    fd, st = open_regular(path)
    try:
        if st.st_size > limit:
            raise fmt.FormatError(f"{path}: {st.st_size} bytes, more than the {limit}-byte limit "
                                  f"for this file: not a dlpack file")
        chunks, total = [], 0
        while True:  # st_size may lie (procfs-like files): read with the limit, not the size
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise fmt.FormatError(f"{path}: more than the {limit}-byte limit for this file")
        return b"".join(chunks)
    finally:
        os.close(fd)


class ShardChangedError(fmt.FormatError):
    """A shard file changed (truncated, appended to, rewritten) while it was mapped."""

    def __init__(self, path: str, change: str):
        super().__init__(f"{path}: changed on disk while this process was reading it ({change}); "
                         f"someone rewrote or truncated the data set in place: stop, let them "
                         f"finish, and restart from a checkpoint")
        self.path, self.change = path, change

    def __reduce__(self):
        return (type(self), (self.path, self.change))


def identity(st: os.stat_result) -> tuple:
    """What identifies the version of a file that was opened: device, inode, size, mtime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def pread_all(fd: int, size: int, offset: int, path: str) -> bytes:
    """Exactly ``size`` bytes at ``offset`` (a read cannot fault, unlike a mapped page)."""
    parts, done = [], 0
    while done < size:
        chunk = os.pread(fd, min(size - done, 1 << 28), offset + done)
        if not chunk:
            raise fmt.FormatError(f"{path}: file ended at {offset + done} while reading "
                                  f"{size} bytes at {offset}: the shard is truncated")
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def check_regular(path: str) -> None:
    """FileNotFoundError naming the shard, or FormatError unless it is a regular file."""
    try:
        fd, _ = open_regular(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: shard listed in the manifest is missing") from None
    os.close(fd)
