"""Phase 2 of the Ray engine, in the driver: the local engine's Packer with shard writing
replaced by ``assemble_shard`` tasks (ray_tasks.py).

The Packer's rule (packer/cutting.py) decides where each shard ends from the sizes the
encode tasks report; each planned shard becomes one task that writes it from slices of the
segments' payload arrays, which never pass through the driver. Shards are journaled in
shard order as their tasks finish, so a killed driver resumes like a local run.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import NamedTuple

from dlpack_io.packer import ray_tasks
from dlpack_io.packer.packing import Packer
from dlpack_io.packer.pipeline import ConversionError
from dlpack_io.packer.ray_results import MAX_RETRIES, settle_tasks, task_result

log = logging.getLogger(__name__)

ASSEMBLY_CPUS = 0.5   # shard writing is mostly I/O: let it overlap encoding


class PlannedRecord(NamedTuple):
    """An encoded record as the driver knows it: where its payload is, and its facts.

    The fields after ``blob`` are, in order, an ``"ok"`` outcome of
    ray_tasks.encode_segment without its status: ``PlannedRecord(blob, *outcome[1:])``."""

    blob: object  # ObjectRef of the segment's payload array
    offset: int
    length: int
    crc: int
    height: int
    width: int
    kind: int
    orientation: int
    colour: int
    reencoded: str | None
    lossless: str | None
    source_bytes: int
    source_sha: str = ""


class RayPlanner(Packer):
    """The local packer with shard writing replaced by assembly tasks; shards are
    journaled in order as their tasks finish, at most ``max_pending`` in flight."""

    def __init__(self, dst, inputs, options, state, journal_, *, ray, max_pending: int,
                 upload=None):
        super().__init__(dst, inputs, options, state, journal_)
        self.ray, self.max_pending, self.upload = ray, max_pending, upload
        self.assemble = ray.remote(ray_tasks.assemble_shard).options(
            num_cpus=ASSEMBLY_CPUS, max_retries=MAX_RETRIES)
        self.items, self.blobs = [], {}
        self.pending: deque = deque()  # (task ref, shard number, end_input, since)
        self.planned_shards, self.planned_samples = len(state.shards), state.next_sample

    def add(self, rel: str, label: int, record: PlannedRecord, position: int) -> None:
        """Plan one encoded record into the open shard (finishing the shard before it
        when the cut rule says so)."""
        if self.cutter.starts_new_shard(record.length):
            self.finish_shard(position)
        slot = self.blobs.setdefault(record.blob, len(self.blobs))
        # the item layout ray_tasks.assemble_shard unpacks
        self.items.append((slot, record.offset, record.length, label, rel, record.crc,
                           record.height, record.width, record.kind, record.orientation,
                           record.colour, record.source_sha))
        self.count(label, record.reencoded, record.lossless)

    def has_open_shard(self) -> bool:
        """True while planned records wait for their shard's assembly task."""
        return bool(self.items)

    def finish_shard(self, end_input: int) -> None:
        """Submit the open shard's assembly task; wait for the oldest ones beyond
        ``max_pending`` (bounds the driver's memory and the cluster's queue)."""
        o = self.options
        ref = self.assemble.remote(self.dst, o.format, self.planned_shards, self.planned_samples,
                                   o.shard_size, self.items, *self.blobs, upload=self.upload)
        self.pending.append((ref, self.planned_shards, end_input, self.take_since()))
        self.planned_shards += 1
        self.planned_samples += len(self.items)
        self.items, self.blobs = [], {}
        while len(self.pending) > self.max_pending:
            self.commit_next()

    def commit_next(self) -> None:
        """Wait for the oldest assembly, then journal its shard."""
        ref, number, end_input, since = self.pending[0]
        entry = task_result(self.ray, ref, f"{self.dst}: cannot write shard {number}")
        self.pending.popleft()
        self.commit(entry, end_input, since)

    def poll(self) -> None:
        """Journal the shards whose tasks are done, in order, without waiting."""
        while self.pending and self.ray.wait([self.pending[0][0]], timeout=0)[0]:
            self.commit_next()

    def drain(self) -> None:
        """Wait for every planned shard and journal it."""
        while self.pending:
            self.commit_next()

    def abort(self) -> None:
        """Let the shards still being written finish, unjournaled (``--resume`` redoes
        them), so that no task of this conversion writes to DST after it returns."""
        settle_tasks(self.ray, [p[0] for p in self.pending], "shard writes")
        self.pending.clear()

    def keep_completed(self) -> None:
        """After a failure, journal the shards already written before it (as the local
        engine has them), then let the rest finish unjournaled."""
        try:
            self.drain()
        except ConversionError as exc:
            log.debug("after the first failure: %s", exc)
        finally:
            self.abort()
