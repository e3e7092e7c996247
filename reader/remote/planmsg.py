"""Messages of the prefetch planner: a batch not ready in time, an error re-raised in the
waiting thread (kept apart from planner.py so the planner stays one screenful per job)."""
from __future__ import annotations

import logging

from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote.storage import StorageError

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
    return (f"{self.source.url}: batch {k} not ready after {waited:.1f} s: {missing} of its "
            f"{len(items)} {self.plan.mode} not in the cache yet{stall}. Check that the "
            f"endpoint ({self.store.options.get('endpoint') or 'AWS default'}) is reachable")


def rewrap(exc: BaseException, k: int) -> BaseException:
    """The planner's error, raised again in the waiting thread (same type and message)."""
    if isinstance(exc, (StorageError, fmt.FormatError, ValueError, OSError)):
        try:
            new = type(exc)(f"{exc} (while prefetching batch {k} and earlier)")
            new.__cause__ = exc
            return new
        except TypeError:
            pass
    return RuntimeError(f"prefetch failed before batch {k}: {exc!r}")
