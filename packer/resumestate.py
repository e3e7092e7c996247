"""What a resumed conversion (or append) keeps: the journaled shards that are still the
files that were written and whose journal lines add up; everything after the first that
does not is redone (conversion.py and appending.py share it)."""
from __future__ import annotations

import logging

import numpy as np

from dlpack_io.packer import accounting, journal
from dlpack_io.packer.dstfiles import clear_outputs, kept_shard_paths, verify_kept_shard
from dlpack_io.packer.names import shown
from dlpack_io.packer.packing import State, packing_order
from dlpack_io.packer.pipeline import ConversionError

log = logging.getLogger(__name__)


def resume_state(dst: str, plan: dict, inputs, opts, state: State | None = None,
                 keep=frozenset()) -> State:
    """The packing State after taking over what DST's journal vouches for (none: a fresh
    start from ``state``, an empty one by default; an append passes the data set's shards
    so that new shards are numbered after them). Deletes our files in DST but the kept
    shards, ``state``'s shards and the names in ``keep``; rewrites the journal."""
    if state is None:
        state = State(class_counts=np.zeros(len(inputs.classes), dtype=np.int64))
    old_plan, done = journal.read_journal(dst)
    refused = journal.refusal(dst, old_plan, plan) if old_plan is not None else None
    if refused:
        raise ConversionError(refused)
    order = packing_order(len(inputs.paths), opts)
    for entry in accounting.accounted(done, old_plan, len(inputs.classes), dst) \
            if old_plan else []:
        if not verify_kept_shard(dst, entry["shard"]):
            log.warning("shard %s from the interrupted run is damaged; redoing from there",
                        entry["shard"]["name"])
            break
        covered = [shown(inputs.paths[i])
                   for i in order[state.position:entry["end_input"]].tolist()]
        problem = accounting.paths_problem(entry, covered,
                                           kept_shard_paths(dst, entry["shard"]))
        if problem:
            log.warning("%s: the journal line of shard %s disagrees with the shard (%s); "
                        "redoing from there", dst, entry["shard"]["name"], problem)
            break
        state.take_over(entry)
    kept = {s["name"] for s in state.shards}
    clear_outputs(dst, keep=kept | set(keep))
    journal.Journal(dst, plan, [e for e in done if e["shard"]["name"] in kept])
    return state
