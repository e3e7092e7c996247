"""Checks of a loader state handed to ``Loader.load_state_dict`` before anything uses it.

A state may come from a file someone edited, from another program, or be damaged: every
field is checked for its type and range here, in time proportional to the number of fields
(never to a value in the state), and a bad one is a ValueError naming the key, the value and
what was expected. Positions are bounded by what this loader can actually have read.
"""
from __future__ import annotations

import numbers

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
