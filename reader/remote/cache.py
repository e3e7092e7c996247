"""The local cache of a remote data set: verified bytes only, published by atomic rename.

Layout under ``cache_dir`` (default ``$DLPACK_CACHE_DIR`` or ``~/.cache/dlpack``)::

    <key>/manifest.json                 the manifest (key = its CRC + SHA-256: a changed data
                                        set at the same URL gets a new key, never mixed)
    <key>/index/<shard>.idx             header page + index + metadata of a record shard
    <key>/shards/<shard>                whole shards (fetch mode "shards"), kept for reuse
    <key>/sessions/<id>/.lock           one per open remote Dataset, flock'ed while it lives
    <key>/sessions/<id>/r/<k>/<j>       record j of shard k (fetch mode "records")
    <key>/sessions/<id>/s/<shard>       hard link pinning a whole shard for this session

Every file is written under a temporary name in the same directory and renamed into place
only after its checksums passed, so a reader never sees a partial file. Several processes
may share ``cache_dir``: each open Dataset has its own session (records are never shared
between sessions, so one process's eviction cannot pull a file from under another), whole
shards are shared through hard links (a pinned shard's inode lives on while any session
links it), and sessions of dead processes are removed by the next one to start. Nothing
secret is ever written here: no credentials, no signed URLs. Nothing found here is trusted
either (another user or job may have planted it): the file rules below say how."""
from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import mmap
import os
import re
import shutil
import stat
import uuid

from dlpack_io.reader.shard import ShardChangedError

# File operations on the cache directory that never trust what they find there.
#
# ``cache_dir`` may be shared with other users and jobs, so any entry in it may have been
# planted before we run: a symbolic link to a folder or file elsewhere, a FIFO, a device, a
# file of the wrong size or with the wrong bytes. The rules, applied by every cache access:
#
# * folders below ``cache_dir`` are created 0700 and used only when ``lstat`` shows a real
#   folder (not a link) owned by this user; anything else is an error naming the path;
# * files are opened with O_NOFOLLOW | O_NONBLOCK and used only when ``fstat`` shows a regular
#   file of a plausible size (a link, FIFO or device is a cache miss, never followed, never
#   read, never waited on), and their bytes are trusted only after their checksums pass;
# * nothing is deleted through a path we did not create (see cache.remove_stale_sessions).

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


log = logging.getLogger(__name__)

DEFAULT_LIMIT_CAP = 20 * 2**30  # default cache_limit: this, or half the free space if less
SOURCE_NAME = "source.url"  # the data set's URL, beside its manifest (shown by `dlpack cache ls`)


def default_cache_dir() -> str:
    """``$DLPACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/dlpack``, else ``~/.cache/dlpack``."""
    if os.environ.get("DLPACK_CACHE_DIR"):
        return os.environ["DLPACK_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "dlpack")


def make_cache_dir(cache_dir: str) -> None:
    """Create ``cache_dir`` (0700) if needed; an OSError naming it as the cache folder and
    the fix when it cannot be (a file there, a read-only or missing parent)."""
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        if not os.path.isdir(cache_dir):
            raise FileExistsError(errno.EEXIST, "not a folder")
    except OSError as exc:
        raise type(exc)(exc.errno, f"cache_dir {cache_dir}: cannot be used as the cache "
                                   f"folder ({exc.strerror}); pass cache_dir= (or set "
                                   f"DLPACK_CACHE_DIR) to a folder you can write") from exc


def default_limit(cache_dir: str) -> int:
    """DEFAULT_LIMIT_CAP or half the free space of the cache's file system, if smaller."""
    st = os.statvfs(cache_dir)
    return min(DEFAULT_LIMIT_CAP, st.f_bavail * st.f_frsize // 2)


def dataset_key(manifest_bytes: bytes, crc: int) -> str:
    """Cache directory name of a data set: its manifest checksum plus a SHA-256 prefix."""
    return f"ds-{crc:08x}-{hashlib.sha256(manifest_bytes).hexdigest()[:16]}"


def publish(path: str, data, *, tmp_dir: str | None = None, base: str | None = None) -> None:
    """Write ``data`` to ``path`` atomically (temp name in the same directory, then rename);
    missing folders from ``base`` (default: the file's own folder) down are created 0700
    and checked (make_dirs). An entry planted at ``path`` is replaced, never
    followed: rename swaps the name, it does not write through a link.

    No fsync: a torn file after a crash fails its checksum on read and is fetched again.
    """
    directory = tmp_dir or os.path.dirname(path)
    make_dirs(base or os.path.dirname(path), os.path.dirname(path))
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as f:
            f.write(data)
        try:
            os.replace(tmp, path)
        except (IsADirectoryError, NotADirectoryError) as exc:
            raise CacheEntryError(
                f"{path}: a folder sits where the cache keeps a file ({exc.strerror}); it was "
                f"not made by dlpack and is left alone. Remove it, or use another cache_dir")
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class DatasetCache:
    """The cache directory of one data set (``root`` = ``cache_dir/<key>``)."""

    def __init__(self, cache_dir: str, key: str):
        self.root = os.path.join(cache_dir, key)
        for _ in range(8):  # `dlpack cache clear` may move the folder away meanwhile
            for sub in ("index", "shards", "sessions"):
                make_dirs(cache_dir, os.path.join(self.root, sub))
            self.use_fd = hold_use(self.root)
            if self.use_fd is not None:
                return
        raise CacheEntryError(f"{self.root}: removed again and again while opening "
                                      f"it (a 'dlpack cache clear' loop?)")

    def close(self) -> None:
        """Let `dlpack cache clear` remove this data set's folder again."""
        if self.use_fd is not None:
            os.close(self.use_fd)
            self.use_fd = None

    def index_path(self, shard_name: str) -> str:
        """Cached header + index + metadata of a shard."""
        return os.path.join(self.root, "index", shard_name + ".idx")

    def pool_path(self, shard_name: str) -> str:
        """Shared whole-shard file."""
        return os.path.join(self.root, "shards", shard_name)

    def pool_usage(self) -> list[tuple[str, int, float, int]]:
        """(name, bytes, mtime, link count) of every whole shard in the shared pool."""
        out = []
        pool = os.path.join(self.root, "shards")
        for name in os.listdir(pool):
            if name.startswith("."):
                continue
            try:
                st = os.lstat(os.path.join(pool, name))
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue  # not ours: never counted, never trimmed
            out.append((name, st.st_size, st.st_mtime, st.st_nlink))
        return out


def hold_use(root: str, *, exclusive: bool = False) -> int | None:
    """An fd of ``root/.use`` flock'ed shared (a Dataset holds it while open) or, with
    ``exclusive``, exclusive without waiting (`dlpack cache clear`: None when in use). None
    too when ``root`` was moved away after we opened it (open it again)."""
    path = os.path.join(root, ".use")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CacheEntryError(f"{path}: {exc.strerror}: not the lock file dlpack "
                                      f"makes there; remove it, or use another cache_dir")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CacheEntryError(f"{path}: not a regular file (not made by dlpack); "
                                          f"remove it, or use another cache_dir")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
        if os.path.samestat(os.fstat(fd), os.lstat(path)):
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


class Session:
    """One open remote Dataset's private corner of the cache, alive while its lock is held."""

    def __init__(self, cache: DatasetCache, sid: str | None = None):
        self.cache = cache
        sessions = os.path.join(cache.root, "sessions")
        self.owner = sid is None
        if sid is None:
            remove_stale_sessions(sessions)
            sid = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._lock_fd = _create_locked(sessions, sid)
        else:
            if not _SESSION_RE.fullmatch(sid):
                raise ValueError(f"cache session {sid!r}: not a session name dlpack makes")
            self._lock_fd = None  # attached from another process: the owner holds the lock
        self.sid = sid
        self.dir = os.path.join(sessions, sid)
        self._pid = os.getpid()

    def record_path(self, shard: int, record: int) -> str:
        """Where record ``record`` of shard number ``shard`` lives in this session."""
        return os.path.join(self.dir, "r", str(shard), str(record))

    def pin_path(self, shard_name: str) -> str:
        """This session's hard link to a whole shard of the pool."""
        return os.path.join(self.dir, "s", shard_name)

    def tmp_dir(self) -> str:
        """Directory for temporary files that are renamed into this session."""
        return self.dir

    def close(self) -> None:
        """Remove the session directory and drop its lock (owner process only)."""
        if not self.owner or self._pid != os.getpid() or self._lock_fd is None:
            return
        shutil.rmtree(self.dir, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = None


def _create_locked(sessions: str, sid: str) -> int:
    """Create ``sessions/sid`` with its lock file already flock'ed (built under a temporary
    name, then renamed, so a sweeper never sees a session without its lock held)."""
    tmp = os.path.join(sessions, f".new-{sid}")
    os.mkdir(tmp, 0o700)
    fd = os.open(os.path.join(tmp, ".lock"),
                 os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(tmp, os.path.join(sessions, sid))
    return fd


# the names Session gives its folders (and their temporary names while being built)
_SESSION_RE = re.compile(r"(?:\.new-)?[0-9]+-[0-9a-f]{8}")


def remove_stale_sessions(sessions: str) -> list[str]:
    """Delete session folders whose lock nobody holds (their process died). Only entries
    that look like ours are touched: a name Session gives, a real folder (never a link)
    owned by this user, with a regular ``.lock`` file; anything else is left alone."""
    removed = []
    for name in os.listdir(sessions):
        path = os.path.join(sessions, name)
        if not _SESSION_RE.fullmatch(name) or not own_dir(path):
            continue
        opened = open_regular(os.path.join(path, ".lock"), os.O_RDWR)
        if opened is None:
            if name.startswith(".new-"):
                continue  # being created right now (or debris: next sweep after it ages)
            shutil.rmtree(path, ignore_errors=True)  # a real folder: rmtree never follows links
            removed.append(name)
            continue
        fd = opened[0]
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            continue  # alive
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    if removed:
        log.info("removed %d cache sessions of processes that are gone", len(removed))
    return removed
