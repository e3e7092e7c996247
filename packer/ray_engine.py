"""``--engine ray``: the local engine's plan, run as tasks on a Ray cluster.

Shards are cut by encoded size, so a task cannot simply be "one shard". The driver (this
process) therefore works in two phases, streamed:

1. ``encode_segment`` tasks encode fixed ranges of inputs (segments) in packing order; the
   payloads stay in Ray's object store, only sizes and outcomes come back to the driver.
2. The driver feeds those outcomes, in order, through the local engine's ``Packer``
   (ray_planner.py): the same reject handling and the same ShardCutter rule decide where
   each shard ends. Each planned shard becomes an ``assemble_shard`` task that writes it
   with the local writer (temp file, fsync, rename). Finished shards are journaled in
   shard order, and the driver writes the manifest last, exactly as the local engine does.

So the bytes do not depend on the engine, the cluster, segment sizes or task timing, and a
killed driver resumes from the journal like a local run. SRC must be a path every node
sees (a shared file system); DST too, or an ``s3://`` URL: each assembly task then uploads
its shard from a temporary folder of its own node (``upload``; the driver keeps the
journal in the bucket, as packer/upload.py does for the local engine).

This module is the driver's loop; ray_cluster.py connects to the cluster and binds
``pack`` to it, ray_results.py turns task failures into ConversionError, ray_tasks.py
holds what the tasks run.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections import deque

from dlpack_io.packer import ray_tasks
from dlpack_io.packer.packing import (conversion_progress, encode_options, input_item,
                                      packing_order)
from dlpack_io.packer.pipeline import ConversionError
from dlpack_io.packer.progress import Progress
from dlpack_io.packer.ray_planner import PlannedRecord, RayPlanner
from dlpack_io.packer.ray_results import MAX_RETRIES, settle_tasks, task_result

log = logging.getLogger(__name__)


def segment_size(inputs: int, cpus: int, shard_size: int, mean_bytes: float) -> int:
    """Inputs per encode task; the output never depends on it.

    Small enough that every CPU gets at least 4 tasks (balance) and that a segment, whose
    payloads move as one object, spans few shards (each shard's task fetches whole
    segments); large enough that the driver, which spends ~0.6 ms on each task, keeps up
    with the cluster: 2 inputs per CPU, at least 64.
    """
    cap = min(max(64, 2 * cpus), int(shard_size // (4 * max(mean_bytes, 1.0))))
    return max(8, min(math.ceil(inputs / (4 * cpus)), cap))


def _segments(ray, files, options, cpus: int, size: int):
    """Yield (start, outcomes, payload ref) per segment in order, keeping 2 x ``cpus``
    encode tasks queued so no worker waits for the driver. ``files`` is a sequence of
    (path, size, mtime_ns) items, sliced lazily."""
    encode = ray.remote(ray_tasks.encode_segment).options(
        num_returns=2, num_cpus=1, max_retries=MAX_RETRIES)
    enc_options = encode_options(options)
    starts = iter(range(0, len(files), size))
    queued: deque = deque()
    log.info("Ray: %d inputs in segments of %d on %d CPUs", len(files), size, cpus)
    try:
        while True:
            while len(queued) < 2 * cpus and (start := next(starts, None)) is not None:
                queued.append((start, *encode.remote(files[start:start + size], enc_options)))
            if not queued:
                return
            start, meta, blob = queued.popleft()
            span = f"{files[start][0]} .. {files[min(start + size, len(files)) - 1][0]}"
            yield start, task_result(ray, meta, f"encoding {span}"), blob
    finally:  # stopped early (an error, Ctrl-C): no encode task outlives the conversion
        settle_tasks(ray, [q[1] for q in queued], "encode tasks")


class _Items:
    """The encode items (path, size, mtime_ns) of inputs ``todo``, made per slice: a list
    of them all would hold ~250 bytes per input in the driver for the whole run."""

    def __init__(self, inputs, stats, todo):
        self.inputs, self.stats, self.todo = inputs, stats, todo

    def __len__(self) -> int:
        return len(self.todo)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [input_item(self.inputs, self.stats, i) for i in self.todo[key]]
        return input_item(self.inputs, self.stats, self.todo[key])


def _feed(planner: RayPlanner, inputs, todo, base: int, segments, progress: Progress) -> None:
    """Hand every encode outcome to the planner in packing order (``base``: the position
    of ``todo[0]``), journaling finished shards between segments."""
    for start, outcomes, blob in segments:
        for k, outcome in enumerate(outcomes):
            i = todo[start + k]
            if outcome[0] != "ok":
                planner.reject(inputs.paths[i], outcome[1])
                progress.update(1, packed=False)
                continue
            record = PlannedRecord(blob, *outcome[1:])
            planner.add(inputs.paths[i], inputs.labels[i], record, base + start + k)
            progress.update(1, record.source_bytes)
        planner.poll()


def pack(dst, inputs, stats, options, state, journal_, *, ray, cpus: int,
         upload=None) -> Progress:
    """The Ray engine's counterpart of packing.pack_local: same arguments, same effect on
    ``state`` and the journal, same Progress. ``upload``: ``(url, storage_options)`` of
    an s3:// DST, which the tasks write to directly (``dst`` is then the driver's staging
    folder, unused; ray_cluster.probe_nodes has checked that every node can write there)."""
    order = packing_order(len(inputs.paths), options)
    base = state.position
    todo = order[base:]
    mean_bytes = sum(stats[i][0] for i in todo) / max(len(todo), 1)
    size = segment_size(len(todo), cpus, options.shard_size, mean_bytes)
    progress = conversion_progress(dst, len(order), options, base)
    planner = RayPlanner(dst, inputs, options, state, journal_, ray=ray,
                         max_pending=max(2, cpus), upload=upload)
    try:
        # closed on the way out, before the handlers below: the queued encode tasks settle
        # first (a traceback would otherwise keep the generator, and them, alive)
        with contextlib.closing(_segments(ray, _Items(inputs, stats, todo), options, cpus,
                                          size)) as segments:
            _feed(planner, inputs, todo, base, segments, progress)
        planner.close(len(order))
        planner.drain()
    except ConversionError:
        planner.keep_completed()
        raise
    except OSError as exc:  # the journal, in the driver
        planner.abort()
        raise ConversionError(f"{dst}: cannot write shard ({exc}); completed shards are kept: "
                              f"fix the cause (free disk space?) and run again with "
                              f"--resume") from exc
    except BaseException:
        planner.abort()
        raise
    finally:
        progress.close()
    return progress
