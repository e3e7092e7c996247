"""Proof that a conversion journal accounts for every input it vouches for.

A journal can be damaged (a disk, a copy) or edited. Each line carries a CRC-32 of its own
canonical JSON (``seal``); a line without one, or whose CRC fails, ends what ``--resume``
believes. The lines that pass must also add up (``accounted``): shard k covers the inputs
from where shard k-1 ended to its ``end_input``, and each of them was either packed into it
or rejected, so ``end_input - previous end_input == num_samples + len(rejects)``; its first
sample follows the previous shard's last; its class counts sum to its samples. The first
line that does not add up ends what is kept: that shard and every later one are redone.
"""
from __future__ import annotations

import json
import logging
from collections import Counter

from dlpack_io.reader import format as fmt

log = logging.getLogger(__name__)
CRC_KEY = "crc32"  # a shard entry has its own "crc" (the shard's); this one is the line's


def line_crc(entry: dict) -> int:
    """CRC-32 of ``entry``'s canonical JSON, its own line checksum left out."""
    body = {k: v for k, v in entry.items() if k != CRC_KEY}
    return fmt.crc32(json.dumps(body, sort_keys=True).encode())


def seal(entry: dict) -> dict:
    """``entry`` with its line checksum (what the journal writes)."""
    return {**{k: v for k, v in entry.items() if k != CRC_KEY}, CRC_KEY: line_crc(entry)}


def unseal(entry: dict) -> dict:
    """``entry`` without its line checksum (what the journal's reader hands on)."""
    return {k: v for k, v in entry.items() if k != CRC_KEY}


def sealed(entry) -> bool:
    """True when ``entry`` is a dict whose line checksum is present and right."""
    return isinstance(entry, dict) and entry.get(CRC_KEY) == line_crc(entry)


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} is {value!r}, expected a count")
    return value


def line_problem(entry: dict, start: int, next_sample: int, num_inputs: int,
                 num_classes: int) -> str | None:
    """Why shard line ``entry`` (covering inputs from ``start``) does not add up, or None."""
    try:
        shard = entry["shard"]
        samples = _count(shard["num_samples"], "num_samples")
        end = _count(entry["end_input"], "end_input")
        rejects = entry["rejects"]
        if not isinstance(rejects, list) or any(
                not isinstance(r, list) or len(r) != 2 or not all(isinstance(x, str) for x in r)
                for r in rejects):
            return "rejects is not a list of (path, reason) pairs"
        if shard["first_sample"] != next_sample:
            return f"first_sample {shard['first_sample']!r}, expected {next_sample}"
        if not start < end <= num_inputs:
            return f"end_input {end} outside ({start}, {num_inputs}]"
        if end - start != samples + len(rejects):
            return (f"inputs {start}-{end - 1} ({end - start}) != {samples} samples + "
                    f"{len(rejects)} rejects")
        counts = [_count(c, "a class count") for c in entry["class_counts"]]
        if len(counts) != num_classes or (num_classes and sum(counts) != samples):
            return f"class_counts {counts[:8]} do not sum to its {samples} samples"
    except (KeyError, TypeError, ValueError) as exc:
        return f"malformed ({type(exc).__name__}: {exc})"
    return None


def accounted(entries: list, plan: dict, num_classes: int, where: str) -> list:
    """The leading ``entries`` (shard lines of a journal) that add up; a warning names the
    first that does not (it and all after it are redone)."""
    num_inputs = plan.get("num_inputs")
    if not isinstance(num_inputs, int):
        return []
    # an append's shards follow the data set's samples (the plan line says where)
    kept, start, next_sample = [], 0, plan.get("first_sample", 0)
    for i, entry in enumerate(entries):
        problem = line_problem(entry, start, next_sample, num_inputs, num_classes)
        if problem:
            log.warning("%s: journal line %d does not add up (%s); redoing from there", where,
                        i + 2, problem)
            break
        kept.append(entry)
        start, next_sample = entry["end_input"], next_sample + entry["shard"]["num_samples"]
    return kept


def paths_problem(entry: dict, slice_paths: list, meta_paths: list | None) -> str | None:
    """Why a journal line disagrees with the shard it vouches for, or None: the inputs it
    covers (``slice_paths``, in packing order) must be exactly the shard's own paths (its
    metadata, in order) plus the line's rejects."""
    if meta_paths is None:
        return "its shard's metadata (source paths) cannot be read"
    rejected = [r[0] for r in entry["rejects"]]
    if Counter(slice_paths) != Counter(meta_paths) + Counter(rejected):
        lost = sorted((Counter(slice_paths) - Counter(meta_paths) - Counter(rejected)))
        return (f"its inputs are not its shard's {len(meta_paths)} samples + "
                f"{len(rejected)} rejects (unaccounted: {lost[:3]})")
    packed = set(meta_paths)
    if [p for p in slice_paths if p in packed] != meta_paths:
        return "its shard holds its inputs in another order"
    return None
