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

import numbers
import zlib
from dataclasses import asdict, dataclass

import numpy as np

from dlpack_io.reader.batch import order as order_mod

STATE_VERSION = 2
# Settings that decide the epoch order itself: a state can only continue the same order.
ORDER_KEYS = ("num_samples", "seed", "shuffle", "block_size", "block_window", "subset")
# Settings a state holds only when the loader had them (batches of every shape)
OPTIONAL_KEYS = ("buckets",)


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


def consumed_mask(sequence: np.ndarray, seg: Segment, plan=None) -> np.ndarray:
    """Boolean mask over ``sequence``: the samples the ranks of ``seg`` consumed. ``plan``
    (batches of every shape: buckets.plan_ranks, bound to the Loader's bucketing) splits
    the sequence in its place of order.rank_part."""
    n = len(sequence)
    mask = np.zeros(n, dtype=bool)
    if plan is not None:
        for positions, bounds in plan(sequence, seg.world_size, seg.batch_size, seg.drop_last):
            mask[positions[:int(bounds[min(seg.batches, len(bounds) - 1)])]] = True
        return mask
    for rank in range(seg.world_size):
        start, _ = order_mod.rank_bounds(n, rank, seg.world_size, seg.batch_size, seg.drop_last)
        _, bounds = order_mod.rank_part(sequence, rank, seg.world_size, seg.batch_size,
                                        seg.drop_last)
        taken = int(bounds[min(seg.batches, len(bounds) - 1)])
        mask[start:start + taken] = True
    return mask


def remaining(sequence: np.ndarray, segments, plan=None) -> np.ndarray:
    """``sequence`` minus everything the ``segments`` consumed, in order."""
    for seg in segments:
        sequence = sequence[~consumed_mask(sequence, seg, plan)]
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
    loader's order, or names the key that is not what a saved state holds (the checks at the
    end of this module: types and ranges, ``items`` = samples in the loader's epoch, default
    num_samples). Version-1 states (one segment implied) are accepted; a setting that only
    some loaders have (``buckets``) must be absent or the same on both sides."""
    if not isinstance(state, dict):
        raise ValueError(f"loader state is a {type(state).__name__}, expected the dict "
                         f"Loader.state_dict() returns")
    items = int(identity["num_samples"] if items is None else items)
    version = check_int(state, "version", 1, STATE_VERSION)
    if version == 1:
        segments = [Segment(*check_segment(state, "loader state", items, "batch"))]
    else:
        segments = [Segment(*s) for s in check_segments(state, items)]
    diff = {}
    for k in OPTIONAL_KEYS:
        if k not in identity and state.get(k) is not None:
            diff[k] = (state[k] if len(repr(state[k])) < 80 else repr(state[k])[:77] + "...",
                       None)
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
    return check_int(state, "epoch", 0, MAX_EPOCH), segments


# ---- a state handed to load_state_dict, checked before anything uses it ------------------
# Checks of a loader state handed to ``Loader.load_state_dict`` before anything uses it.
#
# A state may come from a file someone edited, from another program, or be damaged: every
# field is checked for its type and range here, in time proportional to the number of fields
# (never to a value in the state), and a bad one is a ValueError naming the key, the value and
# what was expected. Positions are bounded by what this loader can actually have read.
MAX_EPOCH = 2**40          # far beyond any training run; keeps seeds and counters in int64
MAX_WORLD_SIZE = 2**20     # ranks of one job
MAX_SEGMENTS = 1024        # resumes with another world or batch size within one epoch


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_int(state: dict, key: str, low: int, high: int, where: str = "loader state") -> int:
    """``state[key]`` as an int in [low, high]; ValueError naming the key otherwise (bools,
    floats and strings are not integers here)."""
    if key not in state:
        raise ValueError(f"{where}: key {key!r} is missing; this is not a state saved by "
                         f"Loader.state_dict()")
    value = state[key]
    # numpy integers are Integral too (a state built with numpy arithmetic); bools are not
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{where}: {key!r} is {_show(value)} ({type(value).__name__}), "
                         f"expected an integer in [{low}, {high}]")
    value = int(value)
    if not low <= value <= high:
        shown = value if value.bit_length() <= 128 else f"an integer of {value.bit_length()} bits"
        raise ValueError(f"{where}: {key!r} is {shown}, expected an integer in [{low}, {high}]"
                         f"; this state was not saved by a loader over this data set")
    return value


def check_bool(state: dict, key: str, where: str = "loader state") -> bool:
    """``state[key]`` as a bool (True/False only; 0 and 1 are accepted too)."""
    if key not in state:
        raise ValueError(f"{where}: key {key!r} is missing; this is not a state saved by "
                         f"Loader.state_dict()")
    value = state[key]
    if value not in (True, False) or not isinstance(value, (bool, int)):
        raise ValueError(f"{where}: {key!r} is {_show(value)}, expected true or false")
    return bool(value)


def check_segment(raw, where: str, items: int, batches_key: str) -> tuple[int, int, bool, int]:
    """(world_size, batch_size, drop_last, batches) of one saved segment over a sequence of
    ``items`` samples; ValueError naming the key otherwise."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is {_show(raw)}, expected a mapping with world_size, "
                         f"batch_size, drop_last and {batches_key}")
    world = check_int(raw, "world_size", 1, MAX_WORLD_SIZE, where)
    batch = check_int(raw, "batch_size", 1, max(1, items), where)
    drop_last = check_bool(raw, "drop_last", where)
    # every rank read at most its share: ceil(ceil(items / world) / batch) batches
    most = -(-(-(-items // world)) // batch)
    batches = check_int(raw, batches_key, 0, most, where)
    return world, batch, drop_last, batches


def check_segments(state: dict, items: int) -> list:
    """The raw (world, batch, drop_last, batches) tuples of a version-2 state."""
    segments = state.get("segments")
    if not isinstance(segments, list):
        raise ValueError(f"loader state: 'segments' is {_show(segments)}, expected a list")
    if len(segments) > MAX_SEGMENTS:
        raise ValueError(f"loader state: 'segments' has {len(segments)} entries, expected at "
                         f"most {MAX_SEGMENTS}")
    return [check_segment(s, f"loader state segments[{i}]", items, "batches")
            for i, s in enumerate(segments)]
