"""``Loader``: shuffled, transformed batches of a packed Dataset, as torch tensors.

    with Loader(ds, batch_size=256, num_workers=2, device="cuda", dtype=torch.float16,
                transforms=[RandomResizedCrop(224), RandomHorizontalFlip(),
                            Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))]
                ) as loader:
        for epoch in range(num_epochs):
            loader.set_epoch(epoch)     # optional: each new iteration starts the next epoch
            for images, labels in loader: ...

One batch goes through four stages, composed here and nowhere else:

    order   which samples, in which batches: a pure function of (seed, epoch, rank,
            world_size, batch_size, drop_last, indices) (order.py, sources.py; resume.py
            continues a saved epoch)
    plan    per-sample parameters, drawn once (plan.py, from the transforms of
            reader/transforms/)
    build   decode and host transforms into the batch buffer, in the workers (build.py or
            gather.py, run by workers.py)
    finish  device copy and kernels, batch-level transforms, the fields (finish.py,
            fields.py)

:func:`make_engine` composes plan + build + finish for one worker setting; the delivery
loop (pipeline.py) runs them and its clock observes them (``loader.stats()``).
``num_workers="auto"`` wraps that loop while it measures (autotune.py) and is absent from it
otherwise. A batch's random transforms are a pure function of (seed, epoch, sample index):
never of num_workers or worker kind. docs/loader.md has the details.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
import zlib

import numpy as np

from dlpack_io.reader.batch import buckets as buckets_mod
from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch import resume, sources
from dlpack_io.reader.batch.autotune import Tuner
from dlpack_io.reader.batch.build import BuildContext, FinishedJob
from dlpack_io.reader.batch.errors import SkipAccount
from dlpack_io.reader.batch.fields import Assembler
from dlpack_io.reader.batch.finish import (BatchFinish, BufferPool, DeviceFinisher, HostFinisher,
                                           pin_ok, pinned, place_transforms)
from dlpack_io.reader.batch.gather import GatherJob
from dlpack_io.reader.batch.options import (AUTO, OPTION_DOCS, LoaderOptions, Order, Output,
                                            Workers, options_from, resolve_device,
                                            use_device_transforms)
from dlpack_io.reader.batch.pipeline import Engine, StatsClock, deliver
from dlpack_io.reader.batch.plan import compile_spec
from dlpack_io.reader.batch.stats import LogSchedule
from dlpack_io.reader.batch.workers import ProcessRunner, SerialRunner, ThreadRunner
from dlpack_io.reader.mixture import Mixture

log = logging.getLogger(__name__)
_D = LoaderOptions  # the defaults live in LoaderOptions alone; the signature reads them


# ---- the stages, composed ---------------------------------------------------------------
def make_engine(o: LoaderOptions, dataset, spec, device, device_transforms: bool) -> Engine:
    """The stages for LoaderOptions ``o`` reading ``dataset`` with compiled ``spec``: the
    build job (host transforms into finished batches, or stored pixels gathered for the
    device), the workers that run it and the finisher that delivers its batches."""
    ctx = BuildContext(dataset, spec, o.seed, o.workers.on_error == "skip",
                       bool(dataset.verify_checksums), o.sample_transform)
    cuda = device.type == "cuda"
    if device_transforms:
        job = GatherJob(ctx, o.in_flight + 2, pin=cuda)
        finisher = DeviceFinisher(spec, device)
    else:
        job = FinishedJob(ctx, BufferPool(2 * o.in_flight + 4, pin_memory=cuda), o.num_workers)
        finisher = HostFinisher(device)
    w = o.workers
    if o.num_workers == 0:
        runner = SerialRunner(job)
    elif w.kind == "process":
        slot = job.slot_bytes(min(o.batch_size, max(1, len(dataset))))  # no batch is larger
        check_slots(o, slot, o.in_flight + 1)
        runner = ProcessRunner(job, o.num_workers, slot, o.in_flight + 1, timeout=w.timeout,
                               describe=dataset.where)
        if device_transforms:
            finisher.pin(runner.slot_buffers())  # slots are read by the device copy
    elif w.kind == "ray":  # actors on a Ray cluster run a job of their own, made there
        from dlpack_io.reader.batch.rayworkers import RayRunner

        remote = functools.partial(GatherJob, ctx, 1, False) if device_transforms else \
            functools.partial(FinishedJob, ctx, None, 1)
        slot = job.slot_bytes(min(o.batch_size, max(1, len(dataset))))
        runner = RayRunner(job, remote, o.num_workers, slot, o.in_flight + 1,
                           address=w.ray_address, actor_options=w.ray_options,
                           timeout=w.timeout, describe=dataset.where)
    else:
        runner = ThreadRunner(job, o.num_workers, timeout=w.timeout, describe=dataset.where)
    return Engine(job, runner, finisher)


def check_slots(o: LoaderOptions, slot_bytes: int, slots: int) -> None:
    """Refuse, before anything is mapped, process-worker batch slots that could not fit:
    more than half of this machine's memory (a batch_size or prefetch far too large)."""
    total = slot_bytes * slots
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not on this platform: no bound to check against
        return
    if total > memory // 2:
        raise ValueError(f"Loader: batch_size {o.batch_size} with worker kind 'process' needs "
                         f"{slots} shared batch slots of {slot_bytes} bytes ({total} bytes), "
                         f"more than half of this machine's {memory} bytes of memory; lower "
                         f"batch_size, prefetch ({o.in_flight} batches in flight) or the "
                         f"output size")


def check_bucketing(o: LoaderOptions) -> None:
    """What buckets cannot be combined with: a sample_transform (the bucket comes from the
    stored size, which the function may change) and, for aspect buckets, padding (every
    batch has its bucket's size already)."""
    if o.buckets is None:
        return
    name = type(o.buckets).__name__
    if o.sample_transform is not None:
        raise ValueError(f"buckets={name}(...) with a sample_transform: a batch's bucket comes "
                         f"from the stored sizes, which the function may change; apply it to "
                         f"the delivered batch instead")
    if o.output.pad and not hasattr(o.buckets, "sizes_of"):
        raise ValueError(f"buckets={name}(...) gives every batch its bucket's size: leave "
                         f"Output(pad=True) out (TokenBudget pads)")


class Loader:
    """Shuffled, transformed batches of ``dataset`` (a Dataset, a torch Subset of one, or a
    Mixture of data sets: sources.py) as ``(images, labels)`` tensors (the ``fields`` asked
    for; ``(..., indices)`` with ``output=Output(return_index=True)``).

    Every option is keyword-only; they are listed below (made from LoaderOptions, Order,
    Workers and Output in options.py, beside their defaults), and docs/loader.md has the
    long form.

    Epochs: each new iteration reads the epoch after the last one iterated (as DataLoader
    reshuffles on every ``iter``); ``set_epoch(e)`` chooses the next one exactly.
    """

    def __init__(self, dataset, *, batch_size: int = _D.batch_size, shuffle=_D.shuffle,
                 seed: int = _D.seed, num_workers=_D.num_workers,
                 drop_last: bool = _D.drop_last, transforms=_D.transforms,
                 sample_transform=_D.sample_transform, dtype=_D.dtype, device=_D.device,
                 fields: tuple = _D.fields, rank: int | None = _D.rank,
                 world_size: int | None = _D.world_size, buckets=_D.buckets,
                 order: Order | None = None,
                 workers: Workers | None = None, output: Output | None = None,
                 **compat):
        given = {k: v for k, v in locals().items() if k not in ("self", "dataset", "compat")}
        self.options = o = options_from(given, compat)
        self._prefetch_factor = compat.get("prefetch_factor")  # as asked: DataLoader's name
        self.dataset, self.subset = sources.unwrap(dataset, o.order.indices)
        self.fields = sources.check_fields(self.dataset, o.fields, o.buckets)
        check_bucketing(o)
        w = o.workers
        self.spec = compile_spec(o.transforms, dtype=o.dtype, reduced_decode=w.reduced_decode,
                                 pad=o.pad_stride, buckets=o.buckets)
        self.device = resolve_device(o.device)
        wanted = use_device_transforms(w.device_transforms, self.device) \
            and o.sample_transform is None
        self.device_transforms = place_transforms(self.spec, wanted, w.device_transforms)
        self._batch = Assembler(self.dataset, self.fields, self.spec, o, self.device_transforms,
                                sources.public_indices)
        self._finish = BatchFinish(self.spec, o.seed, len(self.dataset.classes),
                                   self.device_transforms)
        self._world = (o.rank, o.world_size)
        self.rank, self.world_size = order_mod.resolve_world(o.rank, o.world_size)
        self.skipped = SkipAccount()
        self._mixture = isinstance(self.dataset, Mixture)
        fixed = AUTO not in (o.num_workers, w.prefetch) or o.num_workers == 0
        self._stats = StatsClock(o.num_workers if fixed else 0, w.kind, self.device)
        self._tune = None if fixed else self._tuner()  # "auto": settled on the first batches
        self._log = LogSchedule(w.log_every) if w.log_every is not None else None
        self._consumer = threading.get_ident()  # the thread that iterates (updated per epoch)
        self._pin = pin_ok(o.output.pin_memory, self.device)
        self.epoch, self._advance = 0, False  # True: self.epoch's iteration started (next: +1)
        self._restored = None          # (epoch, segments) from load_state_dict
        self._cursor = None            # (epoch, segments before this run, world, batch, total)
        self._engine = None            # pipeline.Engine, kept across epochs
        self._tickets = 0              # batches ever submitted (the runners' batch ids)
        self._plans = {}               # bucketed splits of recent sequences (_plan_ranks)

    def _tuner(self) -> Tuner:
        tune = Tuner(self.options, self._stats.setting)
        tune.engines.make = lambda o, d=self.dataset, s=self.spec, dev=self.device, \
            t=self.device_transforms: make_engine(o, d, s, dev, t)  # no cycle through self
        tune.engines.stop = self._stats.stop_engine  # their workers' CPU is counted
        return tune

    # ---- DataLoader's attribute names ---------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def batch_size(self) -> int:
        """Samples per batch (the last batch of a rank may hold fewer unless drop_last)."""
        return self.options.batch_size

    @property
    def num_workers(self):
        """Worker threads, processes or Ray actors (0: batches are built in the calling
        thread)."""
        return self.options.num_workers

    @property
    def drop_last(self) -> bool:
        """Whether each rank's short last batch is dropped."""
        return bool(self.options.drop_last)

    @property
    def pin_memory(self) -> bool:
        """Whether CPU batches are delivered in pinned memory (as asked)."""
        return bool(self.options.output.pin_memory)

    @property
    def prefetch_factor(self) -> int | None:
        """Batches in flight per worker, as asked (None: ``prefetch`` or its default)."""
        return self._prefetch_factor

    @property
    def persistent_workers(self) -> bool:
        """Whether workers are kept from one epoch to the next."""
        return bool(self.options.workers.persistent)

    # ---- sizes and order -------------------------------------------------------------
    def __len__(self) -> int:
        """Batches the next iteration yields (what is left of a restored epoch)."""
        rank, world = order_mod.resolve_world(*self._world)
        epoch = self.epoch + self._advance
        base, start = self._resume_point(epoch, world)
        seq = self._sequence(epoch, base)
        if self.options.buckets is not None:
            return len(self._rank_part(seq, 0, world)[1]) - 1 - start
        return order_mod.batches_per_rank(len(seq), world, self.options.batch_size,
                                          self.options.drop_last) - start

    def _num_items(self) -> int:
        return sources.epoch_items(self.dataset, self.subset)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        return sources.epoch_positions(self.dataset, self.subset, self.options, epoch)

    def _sequence(self, epoch: int, segments) -> np.ndarray:
        return resume.remaining(self._epoch_order(epoch), segments, self._plan_ranks())

    def _plan_ranks(self):
        """The bucketed split (buckets.plan_ranks bound to this Loader, the last few kept:
        len(), indices() and the epoch ask for the same one), None for fixed batches."""
        if self.options.buckets is None:
            return None

        def plan(sequence, world, batch_size, drop_last):
            key = (zlib.crc32(np.ascontiguousarray(sequence)), len(sequence), world,
                   batch_size, bool(drop_last))
            if key not in self._plans:
                while len(self._plans) >= 4:
                    self._plans.pop(next(iter(self._plans)))
                self._plans[key] = buckets_mod.plan_ranks(self.options.buckets, sequence,
                                                          self._sizes, world, batch_size,
                                                          drop_last)
            return self._plans[key]
        return plan

    def _sizes(self, sequence):
        """(heights, widths) the index stores for the samples of ``sequence``."""
        entries = self.dataset.lookup(sequence)[2]
        return entries["height"], entries["width"]

    def _rank_part(self, sequence, rank: int, world: int):
        """(``rank``'s samples in order, batch boundaries): order.py's cut, or the buckets'."""
        o = self.options
        if o.buckets is None:
            return order_mod.rank_part(sequence, rank, world, o.batch_size, o.drop_last)
        positions, bounds = self._plan_ranks()(sequence, world, o.batch_size, o.drop_last)[rank]
        return sequence[positions], bounds

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The global sample indices this rank reads in ``epoch`` (a whole epoch), in order."""
        rank, world = order_mod.resolve_world(*self._world)
        part, bounds = self._rank_part(self._epoch_order(self.epoch if epoch is None else epoch),
                                       rank, world)
        return part[:bounds[-1]]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads (a position restored for that epoch is
        kept); without it, each iteration reads the epoch after the last one iterated."""
        if epoch < 0:
            raise ValueError(f"epoch {epoch} must be >= 0")
        if (int(epoch), False) != (self.epoch, self._advance):
            self._cursor = None  # state_dict now points at the start of ``epoch``
        self.epoch, self._advance = int(epoch), False

    # ---- resume ----------------------------------------------------------------------
    def _identity(self) -> dict:
        return sources.identity(self.dataset, self.subset, self.options)

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
        epoch, segments = resume.parse_state(state, self._identity(), self._num_items())
        self._restored = (epoch, segments)
        self.epoch, self._advance, self._cursor = epoch, False, None

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
        if self._advance:  # the last iteration started (finished or not) self.epoch
            self.epoch, self._advance = self.epoch + 1, False
        return self._run(self.epoch)

    def _plan_epoch(self, epoch: int):
        """(rank's samples, batch bounds, segments before this run, first batch)."""
        self.rank, self.world_size = order_mod.recheck_world(self._world, self.rank,
                                                             self.world_size)
        base, start = self._resume_point(epoch, self.world_size)
        self._restored = None
        seq = self._sequence(epoch, base)
        o = self.options
        part, bounds = self._rank_part(seq, self.rank, self.world_size)
        order_mod.warn_short_share(part, len(seq), bounds, self.rank, self.world_size,
                                   o.batch_size)
        return part, bounds, base, min(start, len(bounds) - 1)

    def _run(self, epoch: int):
        asked = time.perf_counter()  # the first next(): planning and start-up are waiting too
        part, bounds, base, start = self._plan_epoch(epoch)
        self._advance = True
        self._cursor = (epoch, base, self.world_size, start, len(bounds) - 1)
        self.skipped.start_epoch(epoch)
        batches = [part[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]
        if self._engine is None:
            self._swap(self.options if self._tune is None else self._tune.options)
        self._consumer = threading.get_ident()
        token = self._stats.start_epoch(epoch, self._clock_pids(), asked)
        prefetch, clean = None, False
        try:
            if not self._engine.runner.opens_data:  # Ray actors fetch their own records
                prefetch = self.dataset.start_prefetch(batches[start:])
            self._stats.fetching(prefetch)
            yield from self._deliver(batches, start, prefetch, epoch)
            clean = True
            if self._advance and self.epoch == epoch:  # finished: loader.epoch is the next
                self.epoch, self._advance = epoch + 1, False
            self.skipped.report()
            if not self.options.workers.persistent and self._stats.live == 1:
                self._close_engine()
        finally:  # the workers stay while another iterator of this Loader is under way
            alone = self._stats.end_epoch(self._clock_pids(), prefetch, token)
            if prefetch is not None:
                prefetch.close()
            if not clean and alone:  # abandoned mid-epoch (break, exception): drop them
                self._close_engine()

    def _built(self, batches, start, prefetch, epoch):
        """The pipeline's (k, built batch, images, labels), through the tuner only while
        num_workers="auto" is still measuring or checking its choice."""
        ticket0, self._tickets = self._tickets, self._tickets + len(batches)
        clock = self._stats
        if self._tune is None or (self._tune.settled and self._tune.check is None):
            in_flight = self.options.in_flight if self._tune is None else \
                self._tune.options.in_flight
            return deliver(self._engine, batches, start, ticket0, prefetch, epoch, in_flight,
                           clock.delivered)
        return self._tune.deliver(self._engine, self._swap, batches, start, ticket0, prefetch,
                                  epoch, clock.delivered)

    def _deliver(self, batches, start, prefetch, epoch):
        clock = self._stats  # cuts the loop's time at next(): handed() ... asked()
        plain = self._batch.plain and not self._batch.return_index
        for k, hb, images, labels in self._built(batches, start, prefetch, epoch):
            if hb.skipped:
                self.skipped.add(hb.skipped)
            if self._mixture:
                clock.delivered_sets(sources.set_counts(self.dataset, hb.indices))
            self._cursor = self._cursor[:3] + (k + 1, len(batches))
            if not len(hb.indices) and len(batches[k]):  # on_error="skip" left nothing
                continue
            if self._finish.active:
                images, labels = self._finish(images, labels, hb.indices, epoch,
                                              int(batches[k][0]))
            batch = (images, labels) if plain else self._batch(images, labels, hb.indices,
                                                               epoch)
            batch = pinned(batch) if self._pin else batch
            clock.handed()  # all of the above was inside next(): the loop waited for it
            yield batch
            clock.asked()  # outside next() since the hand-over: the training step
            if self._log is not None and self._log.due(clock.epoch.batches):
                log.info("Loader: %s", self.stats())

    def stats(self):
        """Is training waiting for data? A ``LoaderStats`` of this (or the last) epoch so far,
        the run's in ``.run``; ``str()`` is one line with a verdict (docs/loader.md)."""
        return self._stats.snapshot(self._clock_pids(),
                                    threading.get_ident() == self._consumer)

    # ---- resources ---------------------------------------------------------------------
    def _swap(self, opts):
        """The engine for concrete options: new (or, under "auto", a parked one)."""
        engine, self._engine = self._engine, None
        if self._tune is not None:
            self._engine = self._tune.engines.swap(engine, opts)
            return self._engine
        if engine is not None:
            self._stats.stop_engine(engine)
        self._engine = make_engine(opts, self.dataset, self.spec, self.device,
                                   self.device_transforms)
        return self._engine

    def _close_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            self._stats.stop_engine(engine)  # closed, its worker processes' CPU counted
        if self._tune is not None:
            self._tune.engines.close()  # the candidates' engines parked between their turns

    def close(self) -> None:
        """Stop the workers and free the buffers (the Loader can still iterate again)."""
        self._close_engine()

    def __del__(self):
        try:
            self._close_engine()
        except Exception:  # interpreter shutdown: nothing left to release reliably
            pass

    def worker_pids(self) -> list[int]:
        """Process ids of the running worker processes (empty for threads)."""
        return [] if self._engine is None else list(self._engine.runner.pids)

    def _clock_pids(self) -> list[int]:
        """Every live worker process: the running engine's and auto's parked ones'."""
        parked = [] if self._tune is None else self._tune.engines.pids()
        return self.worker_pids() + parked

    def __repr__(self) -> str:
        o = self.options
        where = "device" if self.device_transforms else "host"
        return (f"Loader({self.dataset!r}, batch_size={o.batch_size}, shuffle={o.shuffle!r}, "
                f"num_workers={o.num_workers} {o.workers.kind} workers, rank={self.rank}/"
                f"{self.world_size}, device={self.device}, transforms on the {where})")


Loader.__doc__ += OPTION_DOCS  # help(Loader) lists every option where its default lives
