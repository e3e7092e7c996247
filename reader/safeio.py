"""Open files of a data set that may come from anyone: regular files only, never blocking.

A FIFO opened for reading blocks until a writer appears, forever (tar keeps FIFOs); a
symlink to /dev/zero reads without end. Every file a reader opens goes through
``open_regular`` (O_NONBLOCK, then fstat: S_ISREG or a FormatError naming it).
"""
from __future__ import annotations

import os
import stat

from dlpack_io.reader import format as fmt

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def describe_mode(mode: int) -> str:
    """'a FIFO (named pipe)', 'a directory', ... for a st_mode that is not a regular file."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """(fd, fstat) of ``path`` opened read-only; FormatError unless it is a regular file.

    Symlinks are followed (data sets assembled from links are legitimate); what they lead
    to must be a regular file. Raises FileNotFoundError when ``path`` does not exist.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise fmt.FormatError(f"{path}: {describe_mode(st.st_mode)}, not a regular file; a "
                                  f"data set holds only regular files (re-copy it)")
        os.set_blocking(fd, True)  # regular files never block; later reads are plain reads
    except BaseException:
        os.close(fd)
        raise
    return fd, st


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
