"""Open a file of a data set only when it is a regular file: a FIFO planted in its place would
block a reader forever, a device or a directory would feed it bytes no writer made. Used by
every reader of shard and manifest files and by the LMDB structure check.
"""
from __future__ import annotations

import os
import stat

from dlpack_io.reader.format.spec import FormatError

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
            raise FormatError(f"{path}: {describe_mode(st.st_mode)}, not a regular file; a "
                                  f"data set holds only regular files (re-copy it)")
        os.set_blocking(fd, True)  # regular files never block; later reads are plain reads
    except BaseException:
        os.close(fd)
        raise
    return fd, st
