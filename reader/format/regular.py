"""Open a file of a data set only when it is a regular file: a FIFO planted in its place would
block a reader forever, a device or a directory would feed it bytes no writer made. Used by
every reader of shard and manifest files and by the LMDB structure check, and (``open_input``,
``read_input``) by the packer for everything it reads as input: images, sidecars, masks,
lists, COCO files, the destination's own shards during an append.
"""
from __future__ import annotations

import errno
import os
import stat

from dlpack_io.reader.format.spec import FormatError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def describe_mode(mode: int) -> str:
    """'a FIFO (named pipe)', 'a directory', ... for a st_mode that is not a regular file."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class NotRegularFile(OSError):
    """An input that is a FIFO, a device, a socket or a directory (``strerror`` says which)."""


class InputTooLarge(OSError):
    """An input larger than its reader takes (``strerror`` says how large, and the limit)."""


def open_input(path) -> tuple[int, os.stat_result]:
    """(fd, fstat) of ``path`` opened read-only without blocking (a FIFO opens at once,
    with no writer); NotRegularFile naming what it is unless it is a regular file. Links
    are followed: what they lead to must be a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{describe_mode(st.st_mode)}, not a regular "
                                               f"file", os.fspath(path))
        os.set_blocking(fd, True)  # regular files never block; later reads are plain reads
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_input(path, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (open_input), at most ``limit``: a larger
    one is InputTooLarge, found from its size before anything is read."""
    fd, st = open_input(path)
    with open(fd, "rb") as f:
        if limit is not None and st.st_size > limit:
            raise InputTooLarge(errno.EFBIG, f"{st.st_size} bytes, more than the {limit} "
                                             f"read from one such file", os.fspath(path))
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:  # grew since fstat
        raise InputTooLarge(errno.EFBIG, f"more than the {limit} bytes read from one such "
                                         f"file", os.fspath(path))
    return data


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """(fd, fstat) of ``path`` opened read-only; FormatError unless it is a regular file.

    Symlinks are followed (data sets assembled from links are legitimate); what they lead
    to must be a regular file. Raises FileNotFoundError when ``path`` does not exist.
    """
    try:
        return open_input(path)
    except NotRegularFile as exc:
        raise FormatError(f"{path}: {exc.strerror}; a data set holds only regular files "
                          f"(re-copy it)") from None
