"""``Loader``: shuffled, transformed batches of a packed Dataset, as torch tensors.

    with Loader(ds, batch_size=256, num_workers=2, device="cuda", dtype=torch.float16,
                transforms=[RandomResizedCrop(224), RandomHorizontalFlip(),
                            Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))]
                ) as loader:
        for epoch in range(num_epochs):
            loader.set_epoch(epoch)
            for images, labels in loader: ...

What a batch holds is a pure function of (seed, epoch, rank, world_size, batch_size,
drop_last, indices) -- see order.py and resume.py -- and its random transforms a pure
function of (seed, epoch, sample index): never of num_workers or worker kind. One batch
goes plan (batchplan.py) -> host pixels (hostbuild.py, in the runners' workers) -> finish
(devicefinish.py). docs/loader.md has the details.
"""
from __future__ import annotations

import logging

import numpy as np

from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch import resume
from dlpack_io.reader.batch.plan import compile_spec
from dlpack_io.reader.batch.buffers import BufferPool
from dlpack_io.reader.batch.device import DeviceFinisher, HostFinisher
from dlpack_io.reader.batch.host import BuildContext
from dlpack_io.reader.batch.jobs import FinishedJob, GatherJob
from dlpack_io.reader.batch.options import (LoaderOptions, resolve_device, unwrap_subset,
                                            use_device_transforms)
from dlpack_io.reader.batch.processes import ProcessRunner
from dlpack_io.reader.batch.runners import SerialRunner, ThreadRunner
from dlpack_io.reader.batch.skips import SkipAccount

log = logging.getLogger(__name__)


def _stage(runner, finisher, ticket):
    """Take a built batch early and start its copy to the device, so that the copy overlaps
    the training step on the batch before it; a failure is returned, raised when it is due."""
    try:
        hb = runner.get(ticket)
    except Exception as exc:  # noqa: BLE001 - delivered in order, one batch later
        return exc
    finisher.stage(hb)
    return hb


class Loader:
    """Batches of ``dataset`` as ``(images, labels)`` (``(images, labels, indices)`` with
    ``return_index=True``). Options: :class:`dlpack_io.reader.batch.options.LoaderOptions`
    (keyword-only), or ``options=LoaderOptions(...)``; docs/loader.md describes each."""

    def __init__(self, dataset, *, options: LoaderOptions | None = None, **kwargs):
        if options is not None and kwargs:
            raise TypeError("pass either options=LoaderOptions(...) or keyword options, not both")
        self.options = opts = options if options is not None else LoaderOptions(**kwargs)
        self.dataset, self.subset = unwrap_subset(dataset, opts.indices)
        self.spec = compile_spec(opts.transforms, dtype=opts.dtype,
                                 reduced_decode=opts.reduced_decode)
        self.device = resolve_device(opts.device)
        self.device_transforms = use_device_transforms(opts.device_transforms, self.device) \
            and opts.sample_transform is None
        self._world = (opts.rank, opts.world_size)
        self.rank, self.world_size = order_mod.resolve_world(opts.rank, opts.world_size)
        self.skipped = SkipAccount()
        self.epoch = 0
        self._restored = None          # (epoch, segments) from load_state_dict
        self._cursor = None            # (epoch, segments before this run, world, batch, total)
        self._engine = None            # (job, runner, finisher), kept across epochs
        self._tickets = 0              # batches ever submitted (the runners' batch ids)

    # ---- sizes and order -------------------------------------------------------------
    def __len__(self) -> int:
        """Batches the next iteration yields (what is left of a restored epoch)."""
        rank, world = order_mod.resolve_world(*self._world)
        base, start = self._resume_point(self.epoch, world)
        n = len(self._sequence(self.epoch, base))
        return order_mod.batches_per_rank(n, world, self.options.batch_size,
                                          self.options.drop_last) - start

    def _num_items(self) -> int:
        return len(self.dataset) if self.subset is None else len(self.subset)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        o = self.options
        sizes = [s["num_samples"] for s in self.dataset.manifest["shards"]] \
            if self.subset is None else None
        positions = order_mod.epoch_order(self._num_items(), o.shuffle, o.seed, epoch, sizes,
                                          o.block_size, o.block_window)
        return positions if self.subset is None else self.subset[positions]

    def _sequence(self, epoch: int, segments) -> np.ndarray:
        return resume.remaining(self._epoch_order(epoch), segments)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The global sample indices this rank reads in ``epoch`` (a whole epoch), in order."""
        rank, world = order_mod.resolve_world(*self._world)
        part, bounds = order_mod.rank_part(self._epoch_order(self.epoch if epoch is None
                                                             else epoch), rank, world,
                                           self.options.batch_size, self.options.drop_last)
        return part[:bounds[-1]]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate (a position restored for that epoch is kept)."""
        if epoch < 0:
            raise ValueError(f"epoch {epoch} must be >= 0")
        self.epoch = int(epoch)

    # ---- resume ----------------------------------------------------------------------
    def _identity(self) -> dict:
        o = self.options
        return {"num_samples": len(self.dataset), "seed": o.seed, "shuffle": o.shuffle,
                "block_size": o.block_size, "block_window": o.block_window,
                "subset": resume.subset_digest(self.subset)}

    def state_dict(self) -> dict:
        """Where the loader stands; the same on every rank (save one for the whole job).
        After the last batch of an epoch it points at the start of the next epoch."""
        if self._restored is not None:  # restored and not iterated since
            return resume.make_state(self._identity(), *self._restored)
        if self._cursor is None:
            return resume.make_state(self._identity(), self.epoch, [])
        epoch, segments, world, position, total = self._cursor
        if position >= total:
            return resume.make_state(self._identity(), epoch + 1, [])
        o = self.options
        seg = resume.Segment(world, o.batch_size, bool(o.drop_last), position)
        return resume.make_state(self._identity(), epoch, list(segments) + [seg])

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (saved by this job or by one with another world size,
        batch size or worker count): the next iteration reads what is left of its epoch."""
        epoch, segments = resume.parse_state(state, self._identity())
        self._restored = (epoch, segments)
        self.epoch = epoch

    def _resume_point(self, epoch: int, world: int):
        """(segments already read, first batch) for iterating ``epoch`` with ``world`` ranks."""
        if self._restored is None or self._restored[0] != epoch or not self._restored[1]:
            return [], 0
        segments = self._restored[1]
        last = segments[-1]
        if last.same_split(world, self.options.batch_size, self.options.drop_last):
            return segments[:-1], last.batches
        return segments, 0

    # ---- iteration -------------------------------------------------------------------
    def __iter__(self):
        return self._run(self.epoch)

    def _resolve_world(self):
        rank, world = order_mod.resolve_world(*self._world)
        if (rank, world) != (self.rank, self.world_size):
            log.warning("Loader: rank/world_size changed from %d/%d at construction to %d/%d "
                        "(torch.distributed initialised after the Loader was built); using "
                        "%d/%d", self.rank, self.world_size, rank, world, rank, world)
            self.rank, self.world_size = rank, world

    def _plan_epoch(self, epoch: int):
        """(rank's samples, batch bounds, segments before this run, first batch)."""
        self._resolve_world()
        base, start = self._resume_point(epoch, self.world_size)
        self._restored = None
        seq = self._sequence(epoch, base)
        o = self.options
        part, bounds = order_mod.rank_part(seq, self.rank, self.world_size, o.batch_size,
                                           o.drop_last)
        total = len(bounds) - 1
        if total == 0 and len(seq):
            log.warning("Loader: rank %d of %d gets %d of %d samples, fewer than one batch of "
                        "%d with drop_last=True: this epoch yields nothing on this rank",
                        self.rank, self.world_size, len(part), len(seq), o.batch_size)
        if total and int(np.min(np.diff(bounds))) == 0:
            log.warning("Loader: rank %d of %d has too few samples to fill all %d batches: "
                        "some are empty, so every rank yields the same number",
                        self.rank, self.world_size, total)
        return part, bounds, base, min(start, total)

    def _make_engine(self):
        o = self.options
        ctx = BuildContext(self.dataset, self.spec, o.seed, o.on_error == "skip",
                           bool(self.dataset.verify_checksums), o.sample_transform)
        cuda = self.device.type == "cuda"
        if self.device_transforms:
            job = GatherJob(ctx, o.in_flight + 2, pin=cuda)
            finisher = DeviceFinisher(self.spec, self.device)
        else:
            job = FinishedJob(ctx, BufferPool(2 * o.in_flight + 4, pin_memory=cuda),
                              o.num_workers)
            finisher = HostFinisher(self.device)
        if o.num_workers == 0:
            runner = SerialRunner(job)
        elif o.worker_kind == "process":
            runner = ProcessRunner(job, o.num_workers, job.slot_bytes(o.batch_size),
                                   o.in_flight + 1, timeout=o.timeout, describe=self.dataset.where)
            if self.device_transforms:
                finisher.pin(runner.slot_buffers())  # slots are read by the device copy
        else:
            runner = ThreadRunner(job, o.num_workers, timeout=o.timeout,
                                  describe=self.dataset.where)
        return job, runner, finisher

    def _run(self, epoch: int):
        part, bounds, base, start = self._plan_epoch(epoch)
        self._cursor = (epoch, base, self.world_size, start, len(bounds) - 1)
        self.skipped.start_epoch(epoch)
        batches = [part[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]
        if self._engine is None:
            self._engine = self._make_engine()
        job, runner, finisher = self._engine
        prefetch = self.dataset.start_prefetch(batches[start:])
        clean = False
        try:
            yield from self._deliver(batches, start, runner, finisher, prefetch, epoch)
            clean = True
            self.skipped.report()
        finally:
            if prefetch is not None:
                prefetch.close()
            if not clean:  # abandoned mid-epoch (break, exception): drop the workers
                self._close_engine()

    def _deliver(self, batches, start, runner, finisher, prefetch, epoch):
        o, total = self.options, len(batches)
        ticket0, self._tickets = self._tickets, self._tickets + total
        # Remote data: thread workers read records as the prefetcher lands them (they wait
        # per record in this process); worker processes only read the local cache, so a
        # batch goes to them once its records are all there (the next one due: waited for;
        # later ones: only when already complete, so the first batch is not held up).
        gated = prefetch is not None and isinstance(runner, ProcessRunner)
        submitted, staged = start, None
        for k in range(start, total):
            finisher.reclaim()
            while submitted < min(total, k + o.in_flight):
                if not runner.can_submit():
                    if submitted > k:
                        break  # batch k is on its way; the rest waits for free slots
                    finisher.reclaim(block=True)  # slots held by finished device copies
                if gated and submitted > k and not prefetch.ready(submitted - start):
                    break
                if gated:
                    prefetch.wait(submitted - start)
                runner.submit(ticket0 + submitted, batches[submitted], epoch)
                submitted += 1
            if prefetch is not None:
                prefetch.wait(k - start)  # the batch due next: the prefetcher may overcommit
            if staged is None and not runner.ready(ticket0 + k):
                finisher.reclaim(block=True)  # a worker may be waiting for a held buffer
            hb = staged if staged is not None else runner.get(ticket0 + k)
            if isinstance(hb, BaseException):  # batch k failed while it was being staged
                raise hb
            staged = None
            if k + 1 < submitted and runner.ready(ticket0 + k + 1):
                staged = _stage(runner, finisher, ticket0 + k + 1)
            images, labels = finisher.finish(hb)
            if prefetch is not None:
                prefetch.release(k - start)
            self.skipped.add(hb.skipped)
            self._cursor = self._cursor[:3] + (k + 1, total)
            if not len(hb.indices) and len(batches[k]):  # on_error="skip" left nothing
                continue
            yield (images, labels, hb.indices) if o.return_index else (images, labels)

    # ---- resources ---------------------------------------------------------------------
    def _close_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            job, runner, finisher = engine
            finisher.close()  # copies in flight finish before their slots go away
            runner.close()

    def close(self) -> None:
        """Stop the workers and free the buffers (the Loader can still iterate again)."""
        self._close_engine()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._close_engine()
        except Exception:  # interpreter shutdown: nothing left to release reliably
            pass

    def worker_pids(self) -> list[int]:
        """Process ids of the running worker processes (empty for threads)."""
        return [] if self._engine is None else list(self._engine[1].pids)

    def __repr__(self) -> str:
        o = self.options
        where = "device" if self.device_transforms else "host"
        return (f"Loader({self.dataset!r}, batch_size={o.batch_size}, shuffle={o.shuffle!r}, "
                f"num_workers={o.num_workers} {o.worker_kind}s, rank={self.rank}/"
                f"{self.world_size}, device={self.device}, transforms on the {where})")
