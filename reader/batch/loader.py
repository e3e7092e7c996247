"""``Loader``: shuffled, transformed batches of a packed Dataset, as torch tensors.

    with Loader(ds, batch_size=256, num_workers=2, device="cuda", dtype=torch.float16,
                transforms=[RandomResizedCrop(224), RandomHorizontalFlip(),
                            Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))]
                ) as loader:
        for epoch in range(num_epochs):
            loader.set_epoch(epoch)     # optional: each new iteration starts the next epoch
            for images, labels in loader: ...

What a batch holds is a pure function of (seed, epoch, rank, world_size, batch_size,
drop_last, indices) -- see order.py and resume.py -- and its random transforms a pure
function of (seed, epoch, sample index): never of num_workers or worker kind. One batch
goes plan (plan.py) -> host pixels (host.py or gather.py, in the workers of engine.py) -> finish
(device.py). docs/loader.md has the details.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import fields as dataclass_fields

import numpy as np

from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch import resume, sources
from dlpack_io.reader.batch.compat import (DataLoaderAttributes, pin_ok, pinned,
                                           refuse_dataloader_only)
from dlpack_io.reader.batch.autotune import Tuner
from dlpack_io.reader.batch.engine import make_engine
from dlpack_io.reader.batch.targets import Assembler
from dlpack_io.reader.batch.options import (OPTION_DOCS, LoaderOptions, resolve_device,
                                            use_device_transforms)
from dlpack_io.reader.batch.plan import compile_spec
from dlpack_io.reader.batch.recipes import BatchFinish, place_transforms
from dlpack_io.reader.batch.skips import SkipAccount
from dlpack_io.reader.batch.stats import LogSchedule
from dlpack_io.reader.batch.statsclock import StatsClock

log = logging.getLogger(__name__)


_D = LoaderOptions  # the defaults live in LoaderOptions alone; the signature reads them


class Loader(DataLoaderAttributes):
    """Shuffled, transformed batches of ``dataset`` (a Dataset, a torch Subset of one, or a
    Mixture of data sets: sources.py) as
    ``(images, labels)`` tensors, ``(images, labels, indices)`` with ``return_index=True``.

    Every option is keyword-only; they are listed below (``OPTION_DOCS`` of
    options.py, beside their defaults), and docs/loader.md has the long form.

    Epochs: each new iteration reads the epoch after the last one iterated (as DataLoader
    reshuffles on every ``iter``); ``set_epoch(e)`` chooses the next one exactly.
    """

    def __init__(self, dataset, *, batch_size: int = _D.batch_size, shuffle=_D.shuffle,
                 seed: int = _D.seed, num_workers: int = _D.num_workers,
                 drop_last: bool = _D.drop_last, transforms=_D.transforms,
                 sample_transform=_D.sample_transform, dtype=_D.dtype, device=_D.device,
                 indices=_D.indices, rank: int | None = _D.rank,
                 world_size: int | None = _D.world_size, prefetch: int | None = _D.prefetch,
                 worker_kind: str = _D.worker_kind, timeout: float | None = _D.timeout,
                 on_error: str = _D.on_error, return_index: bool = _D.return_index,
                 device_transforms: bool | None = _D.device_transforms,
                 reduced_decode: bool = _D.reduced_decode, block_size: int = _D.block_size,
                 block_window: int = _D.block_window, log_every=_D.log_every,
                 pin_memory: bool = _D.pin_memory, prefetch_factor: int | None = _D.prefetch_factor,
                 persistent_workers: bool = _D.persistent_workers, fields: tuple = _D.fields,
                 pad: bool = _D.pad, pad_multiple: int = _D.pad_multiple,
                 mask_pad_value: int = _D.mask_pad_value, options: LoaderOptions | None = None,
                 **dataloader_only):
        args = locals()
        names = [f.name for f in dataclass_fields(LoaderOptions)]
        refuse_dataloader_only(dataloader_only, names)
        given = {name: args[name] for name in names}
        if options is not None and any(v is not getattr(_D, k) for k, v in given.items()):
            raise TypeError("pass either options=LoaderOptions(...) or keyword options, not both")
        self.options = opts = options if options is not None else LoaderOptions(**given)
        self.dataset, self.subset = sources.unwrap(dataset, opts.indices)
        self.fields = sources.check_fields(self.dataset, opts.fields)
        self.spec = compile_spec(opts.transforms, dtype=opts.dtype,
                                 reduced_decode=opts.reduced_decode, pad=opts.pad_stride)
        self.device = resolve_device(opts.device)
        wanted = use_device_transforms(opts.device_transforms, self.device) \
            and opts.sample_transform is None
        self.device_transforms = place_transforms(self.spec, wanted, opts.device_transforms)
        self._batch = Assembler(self.dataset, self.fields, self.spec, opts, self.device_transforms)
        self._finish = BatchFinish(self.spec, opts.seed, len(self.dataset.classes),
                                   self.device_transforms)
        self._world = (opts.rank, opts.world_size)
        self.rank, self.world_size = order_mod.resolve_world(opts.rank, opts.world_size)
        self.skipped = SkipAccount()
        self._stats = StatsClock(0, opts.worker_kind, self.device)  # Tuner: the setting
        self._tune = Tuner(opts, self._stats.setting)  # "auto": settled on the first batches
        self._tune.engines.make = lambda o, d=self.dataset, s=self.spec, dev=self.device, \
            t=self.device_transforms: make_engine(o, d, s, dev, t)  # no cycle through self
        self._tune.engines.stop = self._stats.stop_engine  # their workers' CPU is counted
        self._log = LogSchedule(opts.log_every)
        self._consumer = threading.get_ident()  # the thread that iterates (updated per epoch)
        self._pin = pin_ok(opts.pin_memory, self.device)
        self.epoch, self._advance = 0, False  # True: self.epoch's iteration started (next: +1)
        self._restored = None          # (epoch, segments) from load_state_dict
        self._cursor = None            # (epoch, segments before this run, world, batch, total)
        self._engine = None            # engine.Engine (job, workers, finisher), kept across epochs
        self._tickets = 0              # batches ever submitted (the runners' batch ids)

    # ---- sizes and order -------------------------------------------------------------
    def __len__(self) -> int:
        """Batches the next iteration yields (what is left of a restored epoch)."""
        rank, world = order_mod.resolve_world(*self._world)
        epoch = self.epoch + self._advance
        base, start = self._resume_point(epoch, world)
        n = len(self._sequence(epoch, base))
        return order_mod.batches_per_rank(n, world, self.options.batch_size,
                                          self.options.drop_last) - start

    def _num_items(self) -> int:
        return sources.epoch_items(self.dataset, self.subset)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        return sources.epoch_positions(self.dataset, self.subset, self.options, epoch)

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

    def _resolve_world(self):
        self.rank, self.world_size = order_mod.recheck_world(self._world, self.rank,
                                                             self.world_size)

    def _plan_epoch(self, epoch: int):
        """(rank's samples, batch bounds, segments before this run, first batch)."""
        self._resolve_world()
        base, start = self._resume_point(epoch, self.world_size)
        self._restored = None
        seq = self._sequence(epoch, base)
        o = self.options
        part, bounds = order_mod.rank_part(seq, self.rank, self.world_size, o.batch_size,
                                           o.drop_last)
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
            self._swap(self._tune.options)
        self._consumer = threading.get_ident()
        token = self._stats.start_epoch(epoch, self._clock_pids(), asked)
        prefetch, clean = None, False
        try:
            prefetch = self.dataset.start_prefetch(batches[start:])
            self._stats.fetching(prefetch)
            yield from self._deliver(batches, start, prefetch, epoch)
            clean = True
            if self._advance and self.epoch == epoch:  # finished: loader.epoch is the next
                self.epoch, self._advance = epoch + 1, False
            self.skipped.report()
            if not self.options.persistent_workers and self._stats.live == 1:
                self._close_engine()
        finally:  # the workers stay while another iterator of this Loader is under way
            alone = self._stats.end_epoch(self._clock_pids(), prefetch, token)
            if prefetch is not None:
                prefetch.close()
            if not clean and alone:  # abandoned mid-epoch (break, exception): drop them
                self._close_engine()

    def _deliver(self, batches, start, prefetch, epoch):
        ticket0, self._tickets = self._tickets, self._tickets + len(batches)
        clock = self._stats  # cuts the loop's time at next(): handed() ... asked()
        for k, hb, images, labels in self._tune.deliver(self._engine, self._swap, batches, start,
                                                        ticket0, prefetch, epoch, clock.delivered):
            self.skipped.add(hb.skipped)
            clock.delivered_sets(sources.set_counts(self.dataset, hb.indices))
            self._cursor = self._cursor[:3] + (k + 1, len(batches))
            if not len(hb.indices) and len(batches[k]):  # on_error="skip" left nothing
                continue
            if self._finish.active:
                images, labels = self._finish(images, labels, hb.indices, epoch,
                                              int(batches[k][0]))
            batch = self._batch(images, labels, hb.indices, epoch)  # targets.py
            batch = pinned(batch) if self._pin else batch
            clock.handed()  # all of the above was inside next(): the loop waited for it
            yield batch
            clock.asked()  # outside next() since the hand-over: the training step
            if self._log.due(clock.epoch.batches):
                log.info("Loader: %s", self.stats())

    def stats(self):
        """Is training waiting for data? A ``LoaderStats`` of this (or the last) epoch so far,
        the run's in ``.run``; ``str()`` is one line with a verdict (docs/loader.md)."""
        return self._stats.snapshot(self._clock_pids(),
                                    threading.get_ident() == self._consumer)

    # ---- resources ---------------------------------------------------------------------
    def _swap(self, opts):  # the engine for concrete options (autotune.py: parked or new)
        engine, self._engine = self._engine, None
        self._engine = self._tune.engines.swap(engine, opts)
        return self._engine

    def _close_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            self._stats.stop_engine(engine)  # closed, its worker processes' CPU counted
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
        return self.worker_pids() + self._tune.engines.pids()

    def __repr__(self) -> str:
        o = self.options
        where = "device" if self.device_transforms else "host"
        return (f"Loader({self.dataset!r}, batch_size={o.batch_size}, shuffle={o.shuffle!r}, "
                f"num_workers={o.num_workers} {o.worker_kind}s, rank={self.rank}/"
                f"{self.world_size}, device={self.device}, transforms on the {where})")


Loader.__doc__ += OPTION_DOCS  # help(Loader) lists every option where its default lives
