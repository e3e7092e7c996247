"""File operations on the cache directory that never trust what they find there.

``cache_dir`` may be shared with other users and jobs, so any entry in it may have been
planted before we run: a symbolic link to a folder or file elsewhere, a FIFO, a device, a
file of the wrong size or with the wrong bytes. The rules, applied by every cache access:

* folders below ``cache_dir`` are created 0700 and used only when ``lstat`` shows a real
  folder (not a link) owned by this user; anything else is an error naming the path;
* files are opened with O_NOFOLLOW | O_NONBLOCK and used only when ``fstat`` shows a regular
  file of a plausible size (a link, FIFO or device is a cache miss, never followed, never
  read, never waited on), and their bytes are trusted only after their checksums pass;
* nothing is deleted through a path we did not create (see cache.remove_stale_sessions).
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import stat

from dlpack_io.reader.safeio import ShardChangedError

log = logging.getLogger(__name__)

_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class CacheEntryError(OSError):
    """A folder of the cache is not one we can trust (a link, not a folder, another user's)."""


def check_dir(path: str) -> os.stat_result:
    """``lstat`` of ``path`` if it is a real folder owned by this user (else
    CacheEntryError); a folder of ours that others may write is made 0700 first."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise CacheEntryError(f"{path}: is {kind} where the cache keeps a folder of its own; "
                              f"it was not made by dlpack and is not followed. Remove it, or "
                              f"use another cache_dir (DLPACK_CACHE_DIR)")
    if st.st_uid != os.geteuid():
        raise CacheEntryError(f"{path}: belongs to user id {st.st_uid}, not to this user "
                              f"({os.geteuid()}); a cache folder must be our own. Use a "
                              f"cache_dir of your own (DLPACK_CACHE_DIR), see docs/remote.md")
    if st.st_mode & 0o022:
        os.chmod(path, 0o700, follow_symlinks=False)  # others could plant entries in it
    return st


def own_dir(path: str) -> bool:
    """True when ``path`` is a folder (not a link to one) owned by this user; False when it
    is anything else or gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def make_dirs(base: str, path: str) -> None:
    """Create ``path`` (0700) and every missing folder between ``base`` and it, checking
    each (check_dir); ``base`` itself is trusted (the caller created or checked it)."""
    rel = os.path.relpath(path, base)
    if rel == ".":
        return
    if rel.startswith(".."):
        raise ValueError(f"{path}: not below the cache folder {base}")
    current = base
    for part in rel.split(os.sep):
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            check_dir(current)


def open_regular(path: str, flags: int = os.O_RDONLY) -> tuple[int, os.stat_result] | None:
    """(fd, fstat) of regular file ``path`` opened without following a link; None when it
    is missing or is not a regular file (a link, FIFO, device, folder: logged, untouched)."""
    try:
        fd = os.open(path, flags | _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EACCES, errno.EPERM):
            log.warning("%s: not a regular file of ours (%s); ignored, not followed", path,
                        exc.strerror)
            return None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        log.warning("%s: not a regular file (mode %o); ignored, not read", path, st.st_mode)
        return None
    return fd, st


def read_file(path: str, max_bytes: int) -> bytes | None:
    """Contents of regular file ``path``; None when missing, not a regular file, or larger
    than ``max_bytes`` (then a warning names it: it cannot be what we wrote)."""
    opened = open_regular(path)
    if opened is None:
        return None
    fd, st = opened
    try:
        if st.st_size > max_bytes:
            log.warning("%s: %d bytes, more than the %d it can hold; ignored", path,
                        st.st_size, max_bytes)
            return None
        chunks, left = [], st.st_size
        while left > 0:  # the size is bounded above; a file that shrinks just ends early
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def pread_exact(path: str, offset: int, length: int, size: int) -> bytes | None:
    """``length`` bytes at ``offset`` of regular file ``path`` if it is exactly ``size``
    bytes long (a whole shard); None otherwise (missing, not regular, wrong size)."""
    opened = open_regular(path)
    if opened is None:
        return None
    fd, st = opened
    try:
        if st.st_size != size:
            log.warning("%s: %d bytes, the shard has %d; ignored", path, st.st_size, size)
            return None
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def link_open_file(fd: int, st, path: str, target: str) -> None:
    """Link the file open as ``fd`` (``fstat`` ``st``) at ``target``, exclusively; never
    another file that ``path`` names by now. FileNotFoundError when it has no name left."""
    try:  # Linux: linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N links the open file itself
        fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        fds = None
    if fds is not None:
        try:  # src_dir_fd: linkat, not link (which would link the /proc entry itself)
            os.link(str(fd), target, src_dir_fd=fds, follow_symlinks=True)
        finally:
            os.close(fds)
        return
    if not os.path.samestat(os.lstat(path), st):  # elsewhere: the name, if it is still ours
        raise FileNotFoundError(f"{path}: replaced by another file")
    os.link(path, target, follow_symlinks=False)


def map_readonly(fd: int, size: int, path: str):
    """A read-only ``mmap`` of ``size`` bytes of the file open as ``fd`` (at ``path``), or
    None with a warning naming it when mmap itself fails (no address space left, a file
    system that cannot map): the caller falls back and closes what it opened."""
    try:
        return mmap.mmap(fd, size, prot=mmap.PROT_READ)
    except (OSError, ValueError) as exc:
        log.warning("%s: cannot be mapped (%s); it is not used", path, exc)
        return None


def stamp_of(st) -> tuple:
    """What a stamp of a verified file holds: inode, size, mtime and ctime (ns). ctime too:
    a file edited in place whose mtime was set back (touch -r) has a new ctime, which no
    user can set; a link or unlink changes it as well (then the file is checked again)."""
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def path_stamp(path: str):
    """``stamp_of`` the entry at ``path`` (not followed), or None when there is none."""
    try:
        return stamp_of(os.lstat(path))
    except FileNotFoundError:
        return None


def fd_stamp(fd: int):
    """``stamp_of`` the file open as ``fd`` (the inode, whatever its name now names), or
    None when ``fd`` cannot be read."""
    try:
        return stamp_of(os.fstat(fd))
    except OSError:
        return None


class OwnedFd(int):
    """A descriptor closed when nothing refers to it any more (a thread still comparing
    its ``fd_stamp`` keeps it open: no other file can take its number meanwhile)."""

    def __del__(self):
        try:
            os.close(self)
        except (OSError, TypeError):  # closed already, or at interpreter exit
            pass


def unlink_if_same(path: str, fd: int) -> None:
    """Remove ``path`` if it still names the file open as ``fd``."""
    try:
        if os.path.samestat(os.lstat(path), os.fstat(fd)):
            os.unlink(path)
    except FileNotFoundError:
        pass


def check_size(fd: int, size: int, path: str) -> None:
    """ShardChangedError naming ``path`` unless the file open as ``fd`` still has ``size``
    bytes (a file cut, or grown, under a process that maps it)."""
    now = os.fstat(fd).st_size
    if now != size:
        raise ShardChangedError(path, f"{now} bytes, the shard has {size}")


def discard(path: str, why: str) -> bool:
    """Remove our cache file ``path`` (the entry only: a link is never followed) after its
    bytes failed their checksum, with a warning naming it. True when this call removed it
    (False: another thread or process found the same damage first)."""
    log.warning("%s: %s; discarded from the cache, fetched again", path, why)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def pwrite_all(fd: int, data, at: int) -> None:
    """Write all of ``data`` at offset ``at`` of ``fd`` (pwrite may write less)."""
    view = memoryview(data)
    while len(view):
        done = os.pwrite(fd, view, at)
        view, at = view[done:], at + done


def preallocate(fd: int, size: int) -> None:
    """Reserve the blocks of the ``size`` bytes of a file about to be filled by many writes
    (``posix_fallocate``: the file system allocates them once, not page by page as the
    writes come; reads still give zeros until written). Best effort where a file system
    cannot; a full disk (ENOSPC) raises."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise
        log.debug("posix_fallocate: %s; the file fills page by page", exc.strerror)
