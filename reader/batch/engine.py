"""The machinery behind one Loader: a build job, the workers that run it and the finisher
that puts batches on their device (an :class:`Engine`, kept across epochs), and the delivery
loop that keeps batches in flight and yields them in order.

The loop keeps ``in_flight`` batches submitted, gates batches of a remote data set on the
prefetcher where workers cannot fetch (processes), and starts the next batch's device copy
before the current batch is yielded, so that the copy overlaps the training step.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import NamedTuple

from dlpack_io.reader.batch.buffers import BufferPool
from dlpack_io.reader.batch.build import BuildContext
from dlpack_io.reader.batch.device import DeviceFinisher, HostFinisher
from dlpack_io.reader.batch.jobs import FinishedJob, GatherJob
from dlpack_io.reader.batch.processes import ProcessRunner
from dlpack_io.reader.batch.runners import SerialRunner, ThreadRunner


@dataclass
class Engine:
    """A Loader's job, runner (workers) and finisher."""

    job: object
    runner: object
    finisher: object

    def close(self) -> None:
        """Stop the workers; copies in flight finish before their slots go away."""
        self.finisher.close()
        self.runner.close()


def make_engine(o, dataset, spec, device, device_transforms: bool) -> Engine:
    """The Engine for LoaderOptions ``o`` reading ``dataset`` with compiled ``spec``."""
    ctx = BuildContext(dataset, spec, o.seed, o.on_error == "skip",
                       bool(dataset.verify_checksums), o.sample_transform)
    cuda = device.type == "cuda"
    if device_transforms:
        job = GatherJob(ctx, o.in_flight + 2, pin=cuda)
        finisher = DeviceFinisher(spec, device)
    else:
        job = FinishedJob(ctx, BufferPool(2 * o.in_flight + 4, pin_memory=cuda), o.num_workers)
        finisher = HostFinisher(device)
    if o.num_workers == 0:
        runner = SerialRunner(job)
    elif o.worker_kind == "process":
        slot = job.slot_bytes(min(o.batch_size, max(1, len(dataset))))  # no batch is larger
        check_slots(o, slot, o.in_flight + 1)
        runner = ProcessRunner(job, o.num_workers, slot, o.in_flight + 1, timeout=o.timeout,
                               describe=dataset.where)
        if device_transforms:
            finisher.pin(runner.slot_buffers())  # slots are read by the device copy
    else:
        runner = ThreadRunner(job, o.num_workers, timeout=o.timeout, describe=dataset.where)
    return Engine(job, runner, finisher)


def check_slots(o, slot_bytes: int, slots: int) -> None:
    """Refuse, before anything is mapped, process-worker batch slots that could not fit:
    more than half of this machine's memory (a batch_size or prefetch far too large)."""
    total = slot_bytes * slots
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not on this platform: no bound to check against
        return
    if total > memory // 2:
        raise ValueError(f"Loader: batch_size {o.batch_size} with worker_kind='process' needs "
                         f"{slots} shared batch slots of {slot_bytes} bytes ({total} bytes), "
                         f"more than half of this machine's {memory} bytes of memory; lower "
                         f"batch_size, prefetch ({o.in_flight} batches in flight) or the "
                         f"output size")


def stage_next(runner, finisher, ticket):
    """Take a built batch early and start its copy to the device, so that the copy overlaps
    the training step on the batch before it; a failure is returned, raised when it is due."""
    try:
        hb = runner.get(ticket)
    except Exception as exc:  # noqa: BLE001 - delivered in order, one batch later
        return exc
    finisher.stage(hb)
    return hb


def timed_wait(prefetch, k: int) -> float:
    """``prefetch.wait(k)``: the seconds it took (records still on their way from storage)."""
    t0 = time.perf_counter()
    prefetch.wait(k)
    return time.perf_counter() - t0


def deliver(engine: Engine, batches, start: int, ticket0: int, prefetch, epoch: int,
            in_flight: int, on_batch=None):
    """Run ``batches[start:]`` (runner tickets from ``ticket0 + start``) and yield
    ``(k, built batch, images, labels)`` in order; ``prefetch`` (or None) is the remote
    data set's prefetch of ``batches[start:]``. ``on_batch(images, finish_s, depth, stages,
    fetch_wait_s)`` hears of each batch: its size, the seconds its finish took, the built
    batches behind it, its workers' seconds per stage (stagetimes.py) and the seconds this
    loop waited for its records to arrive from object storage."""
    runner, finisher, total = engine.runner, engine.finisher, len(batches)
    # Remote data: thread workers read records as the prefetcher lands them (they wait
    # per record in this process); worker processes only read the local cache, so a
    # batch goes to them once its records are all there (the next one due: waited for;
    # later ones: only when already complete, so the first batch is not held up).
    gated = prefetch is not None and isinstance(runner, ProcessRunner)
    submitted, staged = start, None
    for k in range(start, total):
        finisher.reclaim()
        fetch_wait = 0.0  # seconds this batch waited for records from object storage
        while submitted < min(total, k + in_flight):
            if not runner.can_submit():
                if submitted > k:
                    break  # batch k is on its way; the rest waits for free slots
                finisher.reclaim(block=True)  # slots held by finished device copies
            if gated and submitted > k and not prefetch.ready(submitted - start):
                break
            if gated:
                fetch_wait += timed_wait(prefetch, submitted - start)
            runner.submit(ticket0 + submitted, batches[submitted], epoch)
            submitted += 1
        if prefetch is not None:  # the batch due next: the prefetcher may overcommit
            fetch_wait += timed_wait(prefetch, k - start)
        if staged is None and not runner.ready(ticket0 + k):
            finisher.reclaim(block=True)  # a worker may be waiting for a held buffer
        hb = staged if staged is not None else runner.get(ticket0 + k)
        if isinstance(hb, BaseException):  # batch k failed while it was being staged
            raise hb
        staged = None
        if k + 1 < submitted and runner.ready(ticket0 + k + 1):
            staged = stage_next(runner, finisher, ticket0 + k + 1)
        t0 = time.perf_counter()
        images, labels = finisher.finish(hb)
        if on_batch is not None:
            on_batch(len(hb.indices), time.perf_counter() - t0,
                     sum(runner.ready(ticket0 + j) for j in range(k + 1, submitted)),
                     hb.stages, fetch_wait)
        yield k, hb, images, labels
        if prefetch is not None:  # after the consumer read the batch's fields from the cache
            prefetch.release(k - start)


class Shifted:
    """A remote prefetch handle seen from batch ``offset`` of its batches (None: no remote)."""

    def __new__(cls, prefetch, offset: int):
        if prefetch is None or offset == 0:
            return prefetch
        return super().__new__(cls)

    def __init__(self, prefetch, offset: int):
        self.inner, self.offset = prefetch, offset

    def wait(self, k: int, timeout: float | None = None) -> None:
        """The inner handle's wait for batch ``k + offset``."""
        self.inner.wait(k + self.offset, timeout)

    def ready(self, k: int) -> bool:
        """The inner handle's ready for batch ``k + offset``."""
        return self.inner.ready(k + self.offset)

    def release(self, k: int) -> None:
        """The inner handle's release of batch ``k + offset``."""
        self.inner.release(k + self.offset)


class Run(NamedTuple):
    """One epoch's delivery as the tuner (autotune.py) cuts it into turns: the arguments of
    ``deliver`` that stay the same from one turn to the next."""

    batches: list
    start: int
    ticket0: int
    prefetch: object
    epoch: int
    on_batch: object

    def shifted(self, k: int):
        """The remote prefetch handle as seen from batch ``k`` (None: a local data set)."""
        return Shifted(self.prefetch, k - self.start)
