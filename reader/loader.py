"""``Loader``: shuffled, transformed batches of a packed Dataset, as torch tensors.

    loader = Loader(ds, batch_size=256, shuffle="global", seed=0, num_workers=2,
                    crop=RandomResizedCrop(224), flip_h=0.5, device="cuda",
                    mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), dtype=torch.float16)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader: ...

What a batch holds is a pure function of (seed, epoch, rank, world_size, batch_size,
drop_last) -- see :mod:`dlpack_io.reader.order` -- and its random crops and flips a pure
function of (seed, epoch, sample index): never of num_workers or worker kind. That is
what makes ``state_dict``/``load_state_dict`` exact. docs/loader.md has the details.
"""
from __future__ import annotations

import logging

import torch

from dlpack_io.reader import order as order_mod
from dlpack_io.reader.assemble import Pipeline
from dlpack_io.reader.buffers import BufferPool
from dlpack_io.reader.jobs import CpuJob, CpuProcJob, DeviceJob, DeviceProcJob, slot_bytes
from dlpack_io.reader.procworkers import ProcessWorkers
from dlpack_io.reader.skips import SkipAccount, check_on_error
from dlpack_io.reader.transforms import CROPS, check_probability
from dlpack_io.reader.workers import SerialWorkers, ThreadWorkers

log = logging.getLogger(__name__)
WORKER_KINDS = ("thread", "process")
STATE_VERSION = 1


class Loader:
    """Batches of ``dataset`` as ``(images, labels)`` (``+ indices`` with return_index).

    Args (keyword-only after ``dataset``):
        batch_size, drop_last: batch size; drop the last partial batch of each rank.
        shuffle: "global" (True), "block" (shard-local quasi-random) or None/False.
        seed: seed of the order and of the random transforms.
        num_workers: worker threads/processes (0: build batches in the calling thread).
        worker_kind: "thread" (default, measured faster) or "process".
        prefetch: batches in flight (default 2 x num_workers, at least 2).
        rank, world_size: this process's share; default torch.distributed's, else 0/1.
        crop: RandomResizedCrop / RandomCrop / CenterCrop or None (images of one size).
        flip_h, flip_v: flip probabilities.
        mean, std: normalisation for float dtypes (float = (px / 255 - mean) / std).
        dtype: output dtype, torch.uint8 (raw pixels) or a float dtype.
        device: "cpu" or "cuda[:n]": where the batches are delivered.
        transform_on: "host" or "device" (default: "device" for CUDA, else "host"):
            where crop/flip/normalise run; "device" uses dlpack_io.kernels.
        reduced_decode: decode JPEGs at reduced DCT scale when the crop allows.
        return_index: also yield each batch's global sample indices (int64 ndarray).
        on_error: "raise" (default): an unreadable sample raises SampleError when its batch
            is due; "skip": it is left out of its batch (which comes out shorter; a batch
            left empty is not yielded) and listed in ``loader.skipped``.
        block_size, block_window: geometry of the "block" shuffle.
    """

    def __init__(self, dataset, *, batch_size: int = 256, shuffle="global", seed: int = 0,
                 num_workers: int = 2, drop_last: bool = True, crop=None, flip_h: float = 0.0,
                 flip_v: float = 0.0, mean=None, std=None, dtype=torch.uint8, device="cpu",
                 rank=None, world_size=None, prefetch=None, worker_kind: str = "thread",
                 transform_on=None, reduced_decode: bool = True, return_index: bool = False,
                 on_error: str = "raise", block_size: int = order_mod.DEFAULT_BLOCK_SIZE,
                 block_window: int = order_mod.DEFAULT_WINDOW):
        if batch_size < 1 or num_workers < 0 or seed < 0:
            raise ValueError(f"batch_size {batch_size} must be >= 1, num_workers "
                             f"{num_workers} >= 0, seed {seed} >= 0")
        if worker_kind not in WORKER_KINDS:
            raise ValueError(f"worker_kind {worker_kind!r}: expected one of {WORKER_KINDS}")
        if crop is not None and not isinstance(crop, CROPS):
            raise TypeError(f"crop must be RandomResizedCrop, RandomCrop, CenterCrop or None, "
                            f"got {crop!r}")
        if (mean is None) != (std is None):
            raise ValueError("give mean and std together")
        if dtype == torch.uint8 and mean is not None:
            raise ValueError("mean/std normalisation needs a float dtype (e.g. torch.float16); "
                             "dtype=torch.uint8 gives raw pixels")
        self.dataset, self.batch_size, self.drop_last = dataset, int(batch_size), bool(drop_last)
        self.shuffle, self.seed = order_mod.check_shuffle(shuffle), int(seed)
        self.num_workers, self.worker_kind = int(num_workers), worker_kind
        self.prefetch = max(2, 2 * self.num_workers) if prefetch is None else int(prefetch)
        if self.prefetch < 1:
            raise ValueError(f"prefetch {prefetch}: expected >= 1")
        self.rank, self.world_size = order_mod.resolve_world(rank, world_size)
        self.device = torch.device(device)
        self.transform_on = transform_on or ("device" if self.device.type == "cuda" else "host")
        if self.transform_on not in ("host", "device"):
            raise ValueError(f"transform_on {transform_on!r}: expected 'host' or 'device'")
        self.pipe = Pipeline(dataset, crop, check_probability("flip_h", flip_h),
                             check_probability("flip_v", flip_v), self.seed,
                             None if mean is None else tuple(mean),
                             None if std is None else tuple(std), dtype, bool(reduced_decode),
                             check_on_error(on_error),
                             bool(getattr(dataset, "verify_checksums", False)))
        self.skipped, self.return_index = SkipAccount(), bool(return_index)
        self.block_size, self.block_window = int(block_size), int(block_window)
        self.epoch, self._start, self._position = 0, 0, 0
        self._pool, self._active = None, None

    # ---- order -------------------------------------------------------------------------
    def _shard_sizes(self):
        return [s["num_samples"] for s in self.dataset.manifest["shards"]]

    def indices(self, epoch: int | None = None):
        """The sample indices this rank reads in ``epoch`` (default: the current one)."""
        return order_mod.rank_order(
            len(self.dataset), shuffle=self.shuffle, seed=self.seed,
            epoch=self.epoch if epoch is None else epoch, rank=self.rank,
            world_size=self.world_size, batch_size=self.batch_size, drop_last=self.drop_last,
            shard_sizes=self._shard_sizes(), block_size=self.block_size, window=self.block_window)

    def __len__(self) -> int:
        start, end = order_mod.rank_bounds(len(self.dataset), self.rank, self.world_size,
                                           self.batch_size, self.drop_last)
        return order_mod.num_batches(end - start, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate (keeps a position restored for that same epoch)."""
        if epoch < 0:
            raise ValueError(f"epoch {epoch} must be >= 0")
        if epoch != self.epoch:
            self._start = 0
        self.epoch = int(epoch)

    # ---- resume ------------------------------------------------------------------------
    def _identity(self) -> dict:
        return {"num_samples": len(self.dataset), "seed": self.seed, "shuffle": self.shuffle,
                "batch_size": self.batch_size, "drop_last": self.drop_last, "rank": self.rank,
                "world_size": self.world_size, "block_size": self.block_size,
                "block_window": self.block_window}

    def state_dict(self) -> dict:
        """Where the loader stands: epoch and batches consumed in it, plus the settings
        that decide the order (checked by load_state_dict)."""
        return {"version": STATE_VERSION, "epoch": self.epoch, "batch": self._position,
                **self._identity()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next iteration yields exactly the batches an
        uninterrupted run would have yielded after it (num_workers may differ)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')!r}, expected "
                             f"{STATE_VERSION}")
        mine = self._identity()
        diff = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if diff:
            raise ValueError(f"loader state does not match this loader (saved, current): "
                             f"{diff}; the order would differ")
        self.epoch, self._start = int(state["epoch"]), int(state["batch"])
        self._position = self._start

    # ---- iteration ---------------------------------------------------------------------
    def __iter__(self):
        start, self._start = self._start, 0
        return self._run(self.epoch, start)

    def _buffer_pool(self) -> BufferPool:
        if self._pool is None:
            self._pool = BufferPool(capacity=2 * self.prefetch + 4)
        return self._pool

    def _make(self):
        """(job, workers) for this loader's path and worker kind."""
        on_device = self.transform_on == "device"
        if self.worker_kind == "process" and self.num_workers > 0:
            job = (DeviceProcJob(self.pipe, self.device) if on_device
                   else CpuProcJob(self.pipe, self._buffer_pool()))
            size = slot_bytes(self.pipe, self.batch_size, on_device)
            workers = ProcessWorkers(job.build, job.finish, self.num_workers, size,
                                     self.prefetch, describe=self.dataset.where)
            return job, workers
        job = (DeviceJob(self.pipe, self.device, self.prefetch + 1) if on_device
               else CpuJob(self.pipe, self._buffer_pool(), self.num_workers))
        if self.num_workers == 0:
            return job, SerialWorkers(job.split)
        return job, ThreadWorkers(job.split, self.num_workers)

    def _run(self, epoch: int, start: int):
        order = self.indices(epoch)
        total = order_mod.num_batches(len(order), self.batch_size, self.drop_last)
        self._position = start
        self.skipped.start_epoch(epoch)
        job, workers = self._make()
        self._active = workers
        try:
            submitted = start
            for k in range(start, total):
                while submitted < min(total, k + self.prefetch):
                    part = order[order_mod.batch_slice(submitted, len(order), self.batch_size)]
                    workers.submit(submitted, part, epoch)
                    submitted += 1
                if hasattr(job, "reclaim"):
                    job.reclaim()
                images, labels, idx, skipped = job.deliver(workers.get(k))
                self.skipped.add(skipped)
                if not len(idx):  # on_error="skip" left nothing of this batch
                    self._position = k + 1
                    continue
                if images.device != self.device:  # host transforms, device output
                    images, labels = images.to(self.device), labels.to(self.device)
                self._position = k + 1
                yield (images, labels, idx) if self.return_index else (images, labels)
            self.skipped.report()
        finally:
            self._active = None
            workers.close()

    def worker_pids(self) -> list[int]:
        """Process ids of the running worker processes (empty for threads)."""
        return list(getattr(self._active, "pids", []))

    def __repr__(self) -> str:
        return (f"Loader({self.dataset!r}, batch_size={self.batch_size}, shuffle={self.shuffle!r}, "
                f"num_workers={self.num_workers} {self.worker_kind}s, rank={self.rank}/"
                f"{self.world_size}, device={self.device}, transforms on {self.transform_on})")
