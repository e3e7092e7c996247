"""The two kinds of work a loader worker does, one class per output layout.

* :class:`FinishedJob`: transforms on the host; the batch comes out finished (CHW, the
  output dtype) in a recycled tensor.
* :class:`GatherJob`: transforms on the device; the batch comes out as stored pixels
  gathered into one flat (pinned) buffer plus geometry, for devicefinish.py.

Both offer the same two faces to the runners (runners.py):
  * threads / serial: ``split(k, indices, epoch) -> (parts, finalize)``: each part is a
    callable taking the calling thread's ``state`` dict (scratch buffers, progress);
    ``finalize()`` runs once all parts succeeded and returns the HostBatch;
  * processes: ``slot_bytes(batch_size)``; ``build(slot, progress, state, indices, epoch)``
    in the worker, writing into a shared slot and returning small metadata;
    ``collect(slot, meta, release)`` in the consumer, returning the HostBatch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dlpack_io.reader.batch import padding
from dlpack_io.reader.batch.buffers import BufferPool, SlotPool
from dlpack_io.reader.batch.build import BuildContext, Scratch, split_ranges
from dlpack_io.reader.batch.gather import GatherMeta, gather_batch, gather_bytes
from dlpack_io.reader.batch.autoaugment import augment_rows
from dlpack_io.reader.batch.erasing import erase_rows
from dlpack_io.reader.batch.host import epilogue_rows, fill_range
from dlpack_io.reader.batch.plan import plan_batch
from dlpack_io.reader.batch.skips import keep_mask


def _noop() -> None:
    return None


def plan_checked(ctx: BuildContext, indices, epoch: int):
    """The batch's plan, after checking that the shards it reads were not changed in place
    since this process mapped them (two system calls per shard: cheap, once per batch)."""
    plan = plan_batch(ctx.spec, ctx.dataset, indices, seed=ctx.seed, epoch=epoch, skip=ctx.skip)
    ctx.dataset.check_unchanged(plan.shard_ids)
    return plan


@dataclass
class HostBatch:
    """One batch as the workers hand it to the consumer."""

    labels: np.ndarray              # (N,) int64
    indices: np.ndarray             # (N,) global sample indices
    skipped: list                   # Skipped entries (on_error="skip")
    images: object = None           # finished layout: (N, 3, oh, ow) tensor, output dtype
    data: object = None             # gathered layout: flat uint8 tensor (the bytes in use)
    meta: GatherMeta | None = None  # gathered layout: geometry
    release: Callable[[], None] = field(default=_noop)  # give the buffer back


def _scratch(state: dict) -> Scratch:
    s = state.get("scratch")
    if s is None:
        s = state["scratch"] = Scratch()
    return s


def _compact(images, failed: list, n: int):
    """Move the rows that did not fail to the front; return the view of the kept rows."""
    import torch

    if not failed:
        return images
    keep = torch.from_numpy(keep_mask(n, [pos for pos, _ in failed]))
    m = int(keep.sum())
    images[:m] = images[keep]
    return images[:m]


class FinishedJob:
    """Transforms on the host, batches split into ``parts`` ranges of samples."""

    def __init__(self, ctx: BuildContext, pool: BufferPool, parts: int):
        self.ctx, self.pool, self.parts = ctx, pool, max(1, int(parts))

    def _fill(self, plan, a, b, epoch, u8, out, failed, state) -> None:
        fill_range(self.ctx, plan, a, b, epoch, u8.numpy(), _scratch(state),
                   state.get("progress"), failed)
        augment_rows(self.ctx.spec.augment, self.ctx.seed, epoch, plan.indices[a:b], u8[a:b])
        if out is not u8:
            epilogue_rows(self.ctx.spec, plan, a, b, u8, out)
        erase_rows(self.ctx.spec.erasing, self.ctx.seed, epoch, plan.indices[a:b], out[a:b])

    def split(self, k: int, indices, epoch: int):
        """(parts, finalize) of batch ``k``; lookups and random draws happen here."""
        import torch

        plan = plan_checked(self.ctx, indices, epoch)
        u8 = self.pool.take(plan.shape, torch.uint8)
        out = self.pool.take(plan.shape, self.ctx.spec.dtype) if self.ctx.spec.has_epilogue else u8
        failed = []  # (position, Skipped) from any thread
        parts = [functools.partial(self._fill, plan, a, b, epoch, u8, out, failed)
                 for a, b in split_ranges(len(plan.indices), self.parts)]

        def finalize():
            return self._result(plan, _compact(out, failed, len(plan.indices)), failed)
        return parts, finalize

    def _result(self, plan, images, failed) -> HostBatch:
        keep = keep_mask(len(plan.indices), [pos for pos, _ in failed])
        skipped = list(plan.skipped) + [entry for _, entry in sorted(failed)]
        return HostBatch(plan.labels[keep], plan.indices[keep], skipped, images=images)

    def slot_bytes(self, batch_size: int) -> int:
        """Shared slot size for process workers: a finished batch in the output dtype."""
        import torch

        oh, ow = output_size(self.ctx)
        return batch_size * 3 * oh * ow * torch.empty(0, dtype=self.ctx.spec.dtype).element_size()

    def build(self, slot, progress, state, indices, epoch):
        """(In a worker) fill the slot with the finished batch; return its metadata."""
        import torch

        plan = plan_checked(self.ctx, indices, epoch)
        n = int(np.prod(plan.shape))
        out = torch.frombuffer(slot, dtype=self.ctx.spec.dtype, count=max(n, 1))[:n]
        out = out.view(plan.shape)
        u8 = out if not self.ctx.spec.has_epilogue else torch.from_numpy(
            _scratch_u8(state, n)).view(plan.shape)
        failed = []
        state["progress"] = progress
        self._fill(plan, 0, len(plan.indices), epoch, u8, out, failed, state)
        batch = self._result(plan, _compact(out, failed, len(plan.indices)), failed)
        return tuple(batch.images.shape), batch.labels, batch.indices, batch.skipped

    def collect(self, slot, meta, release) -> HostBatch:
        """(In the consumer) copy the finished batch out of the slot; free the slot."""
        import torch

        shape, labels, indices, skipped = meta
        n = int(np.prod(shape))
        try:
            src = torch.frombuffer(slot, dtype=self.ctx.spec.dtype, count=max(n, 1))[:n]
            images = self.pool.take(shape, self.ctx.spec.dtype)
            images.copy_(src.view(shape))
        finally:
            release()
        return HostBatch(labels, indices, skipped, images=images)


def _scratch_u8(state: dict, n: int) -> np.ndarray:
    buf = state.get("u8")
    if buf is None or buf.size < n:
        buf = state["u8"] = np.empty(max(n, 1), dtype=np.uint8)
    return buf[:n]


def output_size(ctx: BuildContext) -> tuple[int, int]:
    """(oh, ow) of every output image: the geometry's size, else the largest stored image."""
    if ctx.spec.pad:  # the largest padded batch the data set can make
        return padding.largest_output(ctx.spec.geometry, ctx.dataset, ctx.spec.pad)
    if ctx.spec.geometry is not None:
        return tuple(ctx.spec.geometry.size)
    h, w = largest_image(ctx.dataset)
    return h, w


def largest_image(dataset) -> tuple[int, int]:
    """(height, width) bounding every stored image (opens every shard's index)."""
    h = max(int(s.index["height"].max(initial=1)) for s in dataset.shards)
    w = max(int(s.index["width"].max(initial=1)) for s in dataset.shards)
    return h, w


class GatherJob:
    """Transforms on the device: each batch gathered whole by one worker into a slot."""

    def __init__(self, ctx: BuildContext, num_slots: int, pin: bool):
        self.ctx = ctx
        self.slots = SlotPool(num_slots, pin=pin)

    def _gather(self, indices, epoch, out: list, state: dict) -> None:
        plan = plan_checked(self.ctx, indices, epoch)
        slot = self.slots.acquire(gather_bytes(plan.entries))
        try:
            meta = gather_batch(self.ctx, plan, epoch, self.slots.array(slot), _scratch(state),
                                state.get("progress"))
        except BaseException:
            self.slots.release(slot)
            raise
        out.extend((slot, meta))

    def split(self, k: int, indices, epoch: int):
        """One part: gather batch ``k`` into a free pinned slot (in a worker thread)."""
        out = []

        def finalize():
            slot, meta = out
            return HostBatch(meta.labels, meta.indices, meta.skipped,
                             data=self.slots.tensor(slot)[:meta.nbytes], meta=meta,
                             release=functools.partial(self.slots.release, slot))
        return [functools.partial(self._gather, indices, epoch, out)], finalize

    def slot_bytes(self, batch_size: int) -> int:
        """Shared slot size for process workers: a batch of full-size stored images, then
        one 64-byte record per sample."""
        h, w = largest_image(self.ctx.dataset)
        return batch_size * (h * w * 3 + 64) + 64

    def build(self, slot, progress, state, indices, epoch) -> GatherMeta:
        """(In a worker) gather the batch into the shared slot; return its GatherMeta."""
        plan = plan_checked(self.ctx, indices, epoch)
        return gather_batch(self.ctx, plan, epoch, np.frombuffer(slot, dtype=np.uint8),
                            _scratch(state), progress)

    def collect(self, slot, meta: GatherMeta, release) -> HostBatch:
        """(In the consumer) a view of the slot's bytes; the slot stays held until
        ``release`` (after the device copy)."""
        import torch

        data = torch.frombuffer(slot, dtype=torch.uint8, count=max(meta.nbytes, 1))[:meta.nbytes]
        return HostBatch(meta.labels, meta.indices, meta.skipped, data=data, meta=meta,
                         release=release)
