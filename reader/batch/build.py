"""What both layouts of a batch share: the worker's build context, its scratch buffer, one
record's payload, the user's sample_transform, and the rule that turns a failing sample into
a SampleError or a skip.

:mod:`host` builds the finished layout (transforms on the host), :mod:`gather` the gathered
one (stored pixels for the device, see :mod:`device`); :mod:`jobs` owns the buffers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlpack_io.reader import nativecopy
from dlpack_io.reader.batch.plan import BatchPlan, TransformSpec, sample_error
from dlpack_io.reader.batch.skips import check_record_crc, skipped_from
from dlpack_io.reader.batch.stagetimes import timed_user
from dlpack_io.reader.decode import decode_record
from dlpack_io.reader.nativecopy import guarded_array
from dlpack_io.reader.safeio import ShardChangedError


@dataclass(frozen=True)
class BuildContext:
    """What a worker needs to build any batch (picklable: the Dataset pickles by path)."""

    dataset: object
    spec: TransformSpec
    seed: int = 0
    skip: bool = False                # on_error="skip": leave failing samples out
    verify: bool = False              # check every record's CRC-32 before using it
    sample_transform: object = None   # the user's fn(HWC uint8) -> HWC uint8, or None


class Scratch:
    """A growable per-thread decode buffer (reused, so steady state allocates nothing)."""

    def __init__(self):
        self.buffer = np.empty(0, dtype=np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        """A buffer of at least ``nbytes`` bytes."""
        if self.buffer.size < nbytes:
            self.buffer = np.empty(max(nbytes, self.buffer.size * 5 // 4), dtype=np.uint8)
        return self.buffer


def record_payload(ctx: BuildContext, plan: BatchPlan, pos: int):
    """Record ``pos``'s payload: a zero-copy view of the mapped shard, or with ``verify`` a
    checked copy (the CRC is computed on a copy made under the SIGBUS guard, so a shard
    truncated under the read is an error naming it, not a crash)."""
    shard = ctx.dataset.shards[plan.shard_ids[pos]]
    payload = shard.payload(int(plan.local[pos]))
    if ctx.verify:
        payload = guarded_array(payload)
        check_record_crc(payload, plan.entries[pos], shard.path)
    return payload


def user_pixels(ctx: BuildContext, plan: BatchPlan, pos: int, epoch: int, payload) -> np.ndarray:
    """Decode sample ``pos`` whole, run the user's sample_transform, and redraw its box for
    the new size (the flips and jitter do not depend on the size)."""
    pixels = timed_user(ctx.sample_transform, decode_record(payload, plan.entries[pos]))
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or pixels.ndim != 3 \
            or pixels.shape[2] != 3 or 0 in pixels.shape:
        got = (f"{type(pixels).__name__} {getattr(pixels, 'dtype', '')} "
               f"{getattr(pixels, 'shape', '')}")
        raise TypeError(f"sample_transform must return an (H, W, 3) uint8 ndarray, got {got}")
    idx, p = plan.indices[pos:pos + 1], plan.params
    new = ctx.spec.draw(ctx.seed, epoch, idx, [pixels.shape[0]], [pixels.shape[1]])
    p.boxes[pos] = new.boxes[0]
    if p.exact is not None:
        p.exact[pos], p.windows[pos] = new.exact[0], new.windows[0]
    return np.ascontiguousarray(pixels)


def shard_changed(exc: Exception) -> bool:
    """True for a shard changed or truncated under the reader: not one bad sample, so
    ``on_error="skip"`` must not skip it (every later read of that shard would fail too)."""
    return isinstance(exc, ShardChangedError) or nativecopy.is_mapped_file_error(exc)


def skip_or_raise(ctx: BuildContext, sample, exc: Exception, failed, pos: int) -> None:
    """Raise the SampleError for ``sample``, or record it in ``failed`` when skipping (a
    shard that changed under the reader is always raised)."""
    error = sample_error(ctx.dataset, sample, exc)
    if failed is None or not ctx.skip or shard_changed(exc):
        raise error from exc
    error.__cause__ = exc
    failed.append((pos, skipped_from(error)))


def split_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """[a, b) ranges cutting n samples into at most ``parts`` nearly equal pieces."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]
