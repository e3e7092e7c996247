"""Where a batch's worker time goes, per stage (``loader.stats()``: plan_s, decode_s, ...).

Each built batch carries a small float64 vector of worker seconds, one entry per stage of
``STAGES``, filled where the work happens (jobs.py) and summed by the stats clock when the
batch is delivered, whichever runner built it (threads write their part's own row, so no
two threads add to one number; processes send the vector back with the batch's metadata).

* ``plan``: index lookups and the random draws of the batch (``plan_batch``);
* ``decode``: reading the records and decoding them, with the crop / resize and the copy
  to CHW (one fused C call per JPEG: they cannot be timed apart without slowing it down);
  on the device path, gathering the stored pixels;
* ``user``: the user's ``sample_transform`` (Python that may hold the GIL);
* ``transforms``: the host transforms after the pixels (AutoAugment family, colour jitter,
  normalise and cast, RandomErasing).

Two clock reads per stage per part (a part is many samples): well under a microsecond per
image.
"""
from __future__ import annotations

import threading
import time

import numpy as np

STAGES = ("plan", "decode", "user", "transforms")
PLAN, DECODE, USER, TRANSFORMS = range(len(STAGES))
_local = threading.local()


def new(rows: int = 1) -> np.ndarray:
    """A zeroed (rows, stages) table: one row per part of a batch."""
    return np.zeros((max(1, rows), len(STAGES)), dtype=np.float64)


def user_seconds() -> float:
    """Seconds this thread has spent in the user's sample_transform so far."""
    return getattr(_local, "user", 0.0)


def timed_user(fn, pixels):
    """``fn(pixels)``, its seconds added to this thread's user_seconds()."""
    t0 = time.perf_counter()
    try:
        return fn(pixels)
    finally:
        _local.user = user_seconds() + time.perf_counter() - t0


def totals(table) -> np.ndarray | None:
    """Seconds per stage of a batch's table (None stays None)."""
    return None if table is None else np.asarray(table, dtype=np.float64).reshape(
        -1, len(STAGES)).sum(axis=0)
