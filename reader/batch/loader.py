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
goes plan (plan.py) -> host pixels (host.py or gather.py, in the workers of engine.py) -> finish
(device.py). docs/loader.md has the details.
"""
from __future__ import annotations

import logging
from dataclasses import fields as dataclass_fields

import numpy as np

from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch import resume
from dlpack_io.reader.batch.engine import deliver, make_engine
from dlpack_io.reader.batch.fieldbatch import DEFAULT_FIELDS, assemble, check_fields
from dlpack_io.reader.batch.options import (LoaderOptions, resolve_device, unwrap_subset,
                                            use_device_transforms)
from dlpack_io.reader.batch.plan import compile_spec
from dlpack_io.reader.batch.skips import SkipAccount

log = logging.getLogger(__name__)


_D = LoaderOptions  # the defaults live in LoaderOptions alone; the signature reads them


class Loader:
    """Shuffled, transformed batches of ``dataset`` (a Dataset, or a torch Subset of one) as
    ``(images, labels)`` tensors, ``(images, labels, indices)`` with ``return_index=True``.

    Every option is keyword-only (docs/loader.md, "Options", has the long form):

    batch_size: samples per batch.
    shuffle: "global"/True (a full permutation), "block" (shard-local, for data sets
        larger than RAM), False/None/"none" (storage order).
    seed: seeds the order and the random transforms.
    num_workers: worker threads or processes; 0 builds batches in the calling thread.
    drop_last: as torch's DataLoader: True drops each rank's short last batch.
    transforms: the fused transforms (RandomResizedCrop, ..., Normalize), in order.
    sample_transform: your fn(HWC uint8 ndarray) -> HWC uint8 ndarray, run in the workers
        before ``transforms``.
    dtype: torch.uint8 (default) or float16/bfloat16/float32 (float32 with Normalize).
    device: where batches are delivered; "cuda" means cuda:LOCAL_RANK under torchrun.
    indices: read only these global sample indices (a split).
    rank, world_size: this process's share; None: torch.distributed's, else torchrun's.
    prefetch: batches in flight; None: 2 x num_workers (at least 2).
    worker_kind: "thread" or "process".
    timeout: seconds to wait for one batch before LoaderTimeout; None waits.
    on_error: "raise" a SampleError for an unreadable sample, or "skip" it.
    return_index: also yield each batch's global sample indices.
    device_transforms: None: on the GPU for CUDA, else on the host; False: on the host.
    reduced_decode: decode JPEGs at a reduced DCT scale where a resize allows it.
    block_size, block_window: the geometry of shuffle="block".
    fields: what each batch holds, in order: "image", "label" and the data set's fields
        (``ds.fields``), e.g. ("image", "caption"); default ("image", "label").
    options: a LoaderOptions holding all of the above instead (not both).
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
                 block_window: int = _D.block_window, fields: tuple = _D.fields,
                 options: LoaderOptions | None = None):
        args = locals()
        given = {f.name: args[f.name] for f in dataclass_fields(LoaderOptions)}
        if options is not None and any(v is not getattr(_D, k) for k, v in given.items()):
            raise TypeError("pass either options=LoaderOptions(...) or keyword options, not both")
        self.options = opts = options if options is not None else LoaderOptions(**given)
        self.dataset, self.subset = unwrap_subset(dataset, opts.indices)
        self.fields = check_fields(self.dataset, opts.fields)
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
        self._engine = None            # engine.Engine (job, workers, finisher), kept across epochs
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

    def _run(self, epoch: int):
        part, bounds, base, start = self._plan_epoch(epoch)
        self._cursor = (epoch, base, self.world_size, start, len(bounds) - 1)
        self.skipped.start_epoch(epoch)
        batches = [part[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]
        if self._engine is None:
            o = self.options
            self._engine = make_engine(o, self.dataset, self.spec, self.device,
                                       self.device_transforms)
        prefetch = self.dataset.start_prefetch(batches[start:])
        clean = False
        try:
            yield from self._deliver(batches, start, prefetch, epoch)
            clean = True
            self.skipped.report()
        finally:
            if prefetch is not None:
                prefetch.close()
            if not clean:  # abandoned mid-epoch (break, exception): drop the workers
                self._close_engine()

    def _deliver(self, batches, start, prefetch, epoch):
        ticket0, self._tickets = self._tickets, self._tickets + len(batches)
        for k, hb, images, labels in deliver(self._engine, batches, start, ticket0, prefetch,
                                             epoch, self.options.in_flight):
            self.skipped.add(hb.skipped)
            self._cursor = self._cursor[:3] + (k + 1, len(batches))
            if not len(hb.indices) and len(batches[k]):  # on_error="skip" left nothing
                continue
            out = (images, labels) if self.fields == DEFAULT_FIELDS else \
                assemble(self.dataset, self.fields, images, labels, hb.indices)
            yield (*out, hb.indices) if self.options.return_index else out

    # ---- resources ---------------------------------------------------------------------
    def _close_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

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
        return [] if self._engine is None else list(self._engine.runner.pids)

    def __repr__(self) -> str:
        o = self.options
        where = "device" if self.device_transforms else "host"
        return (f"Loader({self.dataset!r}, batch_size={o.batch_size}, shuffle={o.shuffle!r}, "
                f"num_workers={o.num_workers} {o.worker_kind}s, rank={self.rank}/"
                f"{self.world_size}, device={self.device}, transforms on the {where})")
