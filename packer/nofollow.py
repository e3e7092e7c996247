"""Create and append to files in DST without ever following a symlink.

A destination folder may hold entries nobody on this machine made (a copied or shared
folder): a ``.dlpack-convert.lock`` that is a symlink to ``~/.bashrc`` must not make
``dlpack convert`` truncate that file. Every file the packer creates goes through
``create_new`` (O_CREAT | O_EXCL | O_NOFOLLOW: a fresh inode, whatever sat at that name
before is unlinked first, never written through), and files it reopens through
``open_nofollow`` (O_NOFOLLOW: a symlink is an error naming the path).
"""
from __future__ import annotations

import errno
import os
import stat

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
