"""Where an epoch stands, for ``Loader.state_dict``: exact resume, also on another world size.

An epoch's reading is a list of *segments*. A segment is (world_size, batch_size,
drop_last, batches): the ranks of one job split a sequence of samples with
``order.rank_part`` and each consumed ``batches`` batches of its part. The first segment
splits the epoch order; a job that resumes with another world size (or batch size) starts
a new segment over what is left: the epoch order minus every sample the earlier segments
consumed, in epoch order. So:

* resuming with the same settings continues each rank's part exactly where it stopped
  (the same batches an uninterrupted run yields);
* resuming with W' ranks instead of W reads every remaining sample exactly once and none of
  the consumed ones again; the next epoch is the normal W'-rank order.

Ranks advance in lockstep (every rank yields the same number of batches), so the state is
the same on every rank: save rank 0's, load it on every rank of the new job.
"""
from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass

import numpy as np

from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch import statecheck

STATE_VERSION = 2
# Settings that decide the epoch order itself: a state can only continue the same order.
ORDER_KEYS = ("num_samples", "seed", "shuffle", "block_size", "block_window", "subset")


@dataclass(frozen=True)
class Segment:
    """A stretch of an epoch read by one job configuration."""

    world_size: int
    batch_size: int
    drop_last: bool
    batches: int     # batches every rank consumed in this segment

    def same_split(self, world_size: int, batch_size: int, drop_last: bool) -> bool:
        """True when a job with these settings splits the sequence the same way."""
        return (self.world_size, self.batch_size, self.drop_last) == \
            (world_size, batch_size, bool(drop_last))


def consumed_mask(sequence: np.ndarray, seg: Segment) -> np.ndarray:
    """Boolean mask over ``sequence``: the samples the ranks of ``seg`` consumed."""
    n = len(sequence)
    mask = np.zeros(n, dtype=bool)
    for rank in range(seg.world_size):
        start, _ = order_mod.rank_bounds(n, rank, seg.world_size, seg.batch_size, seg.drop_last)
        _, bounds = order_mod.rank_part(sequence, rank, seg.world_size, seg.batch_size,
                                        seg.drop_last)
        taken = int(bounds[min(seg.batches, len(bounds) - 1)])
        mask[start:start + taken] = True
    return mask


def remaining(sequence: np.ndarray, segments) -> np.ndarray:
    """``sequence`` minus everything the ``segments`` consumed, in order."""
    for seg in segments:
        sequence = sequence[~consumed_mask(sequence, seg)]
    return sequence


def subset_digest(positions) -> int | None:
    """A checksum of a Loader's ``indices`` (None for the whole data set)."""
    if positions is None:
        return None
    return zlib.crc32(np.ascontiguousarray(positions, dtype=np.int64).tobytes()) & 0xFFFFFFFF


def make_state(identity: dict, epoch: int, segments) -> dict:
    """The ``state_dict`` of a loader (JSON-friendly)."""
    return {"version": STATE_VERSION, "epoch": int(epoch),
            "segments": [asdict(s) for s in segments], **identity}


def parse_state(state: dict, identity: dict, items: int | None = None) -> tuple[int, list]:
    """(epoch, segments) of a saved state; raises ValueError when it cannot continue this
    loader's order, or names the key that is not what a saved state holds (statecheck:
    types and ranges, ``items`` = samples in the loader's epoch, default num_samples).
    Version-1 states (one segment implied) are accepted."""
    if not isinstance(state, dict):
        raise ValueError(f"loader state is a {type(state).__name__}, expected the dict "
                         f"Loader.state_dict() returns")
    items = int(identity["num_samples"] if items is None else items)
    version = statecheck.check_int(state, "version", 1, STATE_VERSION)
    if version == 1:
        segments = [Segment(*statecheck.check_segment(state, "loader state", items, "batch"))]
    else:
        segments = [Segment(*s) for s in statecheck.check_segments(state, items)]
    diff = {}
    for k, v in identity.items():
        saved = state.get(k, None)
        try:
            differs = bool(saved != v)
        except Exception:  # an array or an object whose comparison fails: not ours
            differs = True
        if differs:
            diff[k] = (saved if len(repr(saved)) < 80 else repr(saved)[:77] + "...", v)
    if diff:
        raise ValueError(f"loader state does not match this loader (saved, current): {diff}; "
                         f"the epoch order would differ")
    return statecheck.check_int(state, "epoch", 0, statecheck.MAX_EPOCH), segments
