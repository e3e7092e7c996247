"""Messages of the prefetch planner: a batch not ready in time, an error re-raised in the
waiting thread (kept apart from planner.py so the planner stays one screenful per job)."""
from __future__ import annotations

import copy
import logging


log = logging.getLogger("dlpack_io.reader.remote.planner")


def warn_overcommit(url: str, limit: int, need: int) -> None:
    """A consumer blocks on a batch while the batches before it (not yet released) fill
    cache_limit: the planner holds ``need`` bytes anyway (beats a deadlock); say so."""
    log.warning("%s: cache_limit %s bytes is smaller than the %s bytes of the batches the "
                "loader keeps in flight; holding them anyway (raise cache_limit to let the "
                "prefetcher run ahead)", url, f"{limit:,}", f"{need:,}")


def timeout_message(self, k: int, waited: float, missing: int) -> str:
    """Why batch ``k`` of planner ``self`` (``missing`` items absent) is not ready after
    ``waited`` seconds."""
    items = self.plan.needs[k]
    stall = ""
    if self.waiting_budget is not None and self.waiting_budget <= k:
        stall = (f"; the prefetcher is waiting for cache space (cache_limit "
                 f"{self.limit:,} bytes, {self.held:,} held by batches not yet released): "
                 f"release delivered batches or raise cache_limit")
    if getattr(self, "_waiting", None):  # fullcache.py: ranges fetched, waiting for room
        return (f"{self.source.url}: batch {k} not ready after {waited:.1f} s: {missing} of "
                f"its {len(items)} {self.plan.mode} not in the cache yet; the cache_dir "
                f"{self.source.cache_dir} is full and {len(self._waiting)} fetched ranges wait "
                f"for room there: free space there, or pass another cache_dir")
    return (f"{self.source.url}: batch {k} not ready after {waited:.1f} s: {missing} of its "
            f"{len(items)} {self.plan.mode} not in the cache yet{stall}. Check that the "
            f"endpoint ({self.store.options.get('endpoint') or 'AWS default'}) is reachable")


def rewrap(exc: BaseException, k: int) -> BaseException:
    """The planner's error, raised again in the waiting thread: the same type (a caller that
    catches ``ShardChangedError``, ``StorageError`` or ``OSError`` still catches it), its
    attributes (``errno``, ``path``...) and its message, plus which batch was waited for."""
    note = f"(while prefetching batch {k} and earlier)"
    if not isinstance(exc, Exception):  # a cancelled task, an interrupt: never re-raised
        return RuntimeError(f"prefetch failed before batch {k}: {exc!r}")  # as such here
    new = _same_kind(exc)
    if new is None:  # cannot be copied: the very exception, with a note for tracebacks
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        return exc
    if isinstance(new, OSError) and new.errno is not None and new.strerror:
        new.strerror = f"{new.strerror} {note}"  # str(): [Errno n] strerror (errno kept)
    else:
        new.args = (f"{exc} {note}",)
    new.__cause__ = exc
    return new


def _same_kind(exc: BaseException):
    """A fresh copy of ``exc`` (same type, args and attributes), or None."""
    try:
        new = copy.copy(exc)  # __reduce__: keeps what the constructor needs
        if type(new) is type(exc):
            return new
    except Exception:  # a constructor whose arguments are not its args
        pass
    try:
        cls = type(exc)
        new = cls.__new__(cls, *exc.args)  # no __init__: the args as they are
        if isinstance(exc, OSError):
            new.errno, new.strerror, new.filename = exc.errno, exc.strerror, exc.filename
        new.__dict__.update(getattr(exc, "__dict__", {}))
        return new
    except Exception:
        return None
