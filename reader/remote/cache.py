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
either (another user or job may have planted it): see cachefs for the rules.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import stat
import uuid

from dlpack_io.reader.remote import cachefs

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
    and checked (cachefs.make_dirs). An entry planted at ``path`` is replaced, never
    followed: rename swaps the name, it does not write through a link.

    No fsync: a torn file after a crash fails its checksum on read and is fetched again.
    """
    directory = tmp_dir or os.path.dirname(path)
    cachefs.make_dirs(base or os.path.dirname(path), os.path.dirname(path))
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as f:
            f.write(data)
        try:
            os.replace(tmp, path)
        except (IsADirectoryError, NotADirectoryError) as exc:
            raise cachefs.CacheEntryError(
                f"{path}: a folder sits where the cache keeps a file ({exc.strerror}); it was "
                f"not made by dlpack and is left alone. Remove it, or use another cache_dir")
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_file(path: str, max_bytes: int) -> bytes | None:
    """Contents of cache file ``path``, or None if it is missing, not a regular file or
    larger than ``max_bytes`` (cachefs.read_file: links are never followed)."""
    return cachefs.read_file(path, max_bytes)


class DatasetCache:
    """The cache directory of one data set (``root`` = ``cache_dir/<key>``)."""

    def __init__(self, cache_dir: str, key: str):
        self.root = os.path.join(cache_dir, key)
        for _ in range(8):  # `dlpack cache clear` may move the folder away meanwhile
            for sub in ("index", "shards", "sessions"):
                cachefs.make_dirs(cache_dir, os.path.join(self.root, sub))
            self.use_fd = hold_use(self.root)
            if self.use_fd is not None:
                return
        raise cachefs.CacheEntryError(f"{self.root}: removed again and again while opening "
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
        raise cachefs.CacheEntryError(f"{path}: {exc.strerror}: not the lock file dlpack "
                                      f"makes there; remove it, or use another cache_dir")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise cachefs.CacheEntryError(f"{path}: not a regular file (not made by dlpack); "
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
        if not _SESSION_RE.fullmatch(name) or not cachefs.own_dir(path):
            continue
        opened = cachefs.open_regular(os.path.join(path, ".lock"), os.O_RDWR)
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
