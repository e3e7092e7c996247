"""The build stage's gathered layout, for transforms on the device: the stored pixels each
sample needs (a whole raw record, or the decoded region of a JPEG) back to back in one flat
(pinned) buffer, then one 64-byte record per sample (box, flips, ragged geometry, jitter,
label: ``dlpack_io.kernels.records``), so one host->device copy and one kernel finish the
batch (finish.py). :class:`GatherJob` offers the job faces of build.py to the workers; its
buffers are a :class:`SlotPool` of pinned slots."""
from __future__ import annotations

import functools
import queue
import time
from dataclasses import dataclass

import numpy as np

from dlpack_io.kernels.records import (FLIP_H, FLIP_V, IDENTITY_ORDER, JITTER_OPS, NEUTRAL_FACTORS,
                                       ORDER_SHIFTS, RECORD_BYTES, RECORD_PLACEMENT, host_records)
from dlpack_io.reader import format as fmt
from dlpack_io.reader import jpegdecode
from dlpack_io.reader import shard as shard_mod
from dlpack_io.reader.batch.build import (DECODE, PLAN, BuildContext, HostBatch, Scratch,
                                          largest_image, plan_checked, record_payload, scratch_of,
                                          skip_or_raise, stage_table, stage_totals, user_pixels)
from dlpack_io.reader.batch.plan import BatchPlan
from dlpack_io.reader.decode import decode_record


@dataclass
class GatherMeta:
    """What the device finish needs besides the buffer (small, picklable). The buffer holds
    the pixels, then (at ``records_offset``) one 64-byte record per sample with its box,
    flips, ragged geometry, jitter factors and order, and label (``dlpack_io.kernels.records``),
    so one copy carries the whole batch."""

    labels: np.ndarray      # (N,) int64 (also in the records)
    out_size: tuple
    resize: bool
    dense_shape: tuple | None  # (N, H, W, 3) for the dense layout, None for ragged
    records_offset: int     # byte offset of the records (16-byte aligned, after the pixels)
    nbytes: int             # bytes of the buffer in use (pixels + records)
    indices: np.ndarray     # (N,) global indices of the samples in the buffer
    skipped: list           # Skipped entries of samples left out (on_error="skip")
    stages: object = None   # worker seconds per stage (build.stage_totals)


def is_dense(entries, ctx: BuildContext) -> bool:
    """True when every record is raw and all have one size (the NHWC layout)."""
    return ctx.sample_transform is None and bool(len(entries)) and \
        bool(np.all(entries["kind"] == fmt.KIND_RAW)) and \
        bool(np.all(entries["height"] == entries["height"][0])) and \
        bool(np.all(entries["width"] == entries["width"][0]))


def gather_bytes(entries) -> int:
    """Upper bound of the buffer bytes a batch needs (full-size pixels of every sample,
    then the records)."""
    pixels = int((entries["height"].astype(np.int64) * entries["width"] * 3).sum())
    return _records_at(pixels) + len(entries) * RECORD_BYTES


def _records_at(pixel_bytes: int) -> int:
    return -(-pixel_bytes // RECORD_PLACEMENT) * RECORD_PLACEMENT


def _place_jpeg(ctx, payload, entry, box, params, buf, offset, scratch):
    """Decode the box's region (upright: the record's EXIF orientation applied) into buf at
    offset; return (bytes, (h, w), box in region)."""
    n, orientation = 8, int(entry["orientation"])
    if params.resize and ctx.spec.reduced_decode and int(entry["kind"]) == fmt.KIND_JPEG:
        n = jpegdecode.choose_scale(int(box[2]), int(box[3]), *params.out_size)
    if jpegdecode.have_extension():
        region = jpegdecode.decode_region(payload, box, n, buf[offset:], orientation=orientation)
    else:
        region = jpegdecode.decode_region(payload, box, n, scratch.get(0),
                                          orientation=orientation)
        px = region.pixels
        buf[offset:offset + px.size] = px.reshape(-1)
    rows, cols = region.pixels.shape[:2]
    return rows * cols * 3, (rows, cols), region.int_box(box)


def _gather_dense(ctx, plan: BatchPlan, buf: np.ndarray) -> bool:
    """Copy whole same-size raw records back to back with one C call per shard; False
    (nothing guaranteed copied) when a shard is not memory-mapped or a copy fails."""
    entries, shard_ids = plan.entries, plan.shard_ids
    size = int(entries["length"][0])
    dst = np.arange(len(entries), dtype=np.int64) * size
    views = {int(k): ctx.dataset.shards[int(k)].file_view() for k in np.unique(shard_ids)}
    if ctx.verify or any(v is None for v in views.values()):
        return False
    try:
        for k, view in views.items():
            mask = shard_ids == k
            shard_mod.gather(view, entries["offset"][mask], entries["length"][mask], buf, dst[mask])
    except ValueError:
        return False
    return True


def _place_one(ctx, plan, pos, epoch, geo, buf, offset, scratch) -> int:
    """Put sample ``pos`` at ``offset`` of ``buf`` and fill its geometry; return its bytes."""
    entry, params = plan.entries[pos], plan.params
    payload = record_payload(ctx, plan, pos)
    if ctx.sample_transform is not None:
        pixels = user_pixels(ctx, plan, pos, epoch, payload)
        buf[offset:offset + pixels.size] = pixels.reshape(-1)
        geo[pos, 0:4] = params.boxes[pos]
        geo[pos, 6:9] = offset, pixels.shape[0], pixels.shape[1]
        return pixels.size
    geo[pos, 6:9] = offset, entry["height"], entry["width"]
    if int(entry["kind"]) not in (fmt.KIND_JPEG, fmt.KIND_PLANES):  # raw; a PNG/WebP file
        data = np.frombuffer(payload, dtype=np.uint8) if int(entry["kind"]) == fmt.KIND_RAW \
            else decode_record(payload, entry).reshape(-1)
        buf[offset:offset + data.size] = data
        return data.size
    size, (rows, cols), box = _place_jpeg(ctx, payload, entry, params.boxes[pos], params, buf,
                                          offset, scratch)
    geo[pos, 0:4], geo[pos, 7:9] = box, (rows, cols)
    return size


def _encode_order(perms: np.ndarray) -> np.ndarray:
    """(N, 4) op-id permutations -> the kernels' int32 order codes (sum perm[k] << 2k)."""
    return (perms.astype(np.int32) << np.array(ORDER_SHIFTS, dtype=np.int32)).sum(1)


def _meta(plan: BatchPlan, geo, keep, dense_shape, pixel_bytes, skipped, buf) -> GatherMeta:
    """Write the kept samples' records after the pixels; return the batch's GatherMeta."""
    p, g, labels = plan.params.take(keep), geo[keep], plan.labels[keep]
    at = _records_at(pixel_bytes)
    rec = host_records(buf, at, len(labels))
    for j, name in enumerate(("top", "left", "box_height", "box_width")):
        rec[name] = g[:, j]
    rec["flags"] = g[:, 4] * FLIP_H + g[:, 5] * FLIP_V
    rec["offset"], rec["height"], rec["width"] = g[:, 6], g[:, 7], g[:, 8]
    rec["label"] = labels
    factors = p.jitter if p.jitter is not None else np.tile(NEUTRAL_FACTORS, (len(labels), 1))
    for j, name in enumerate(JITTER_OPS):
        rec[name] = factors[:, j]
    rec["order"] = _encode_order(p.order) if p.order is not None else IDENTITY_ORDER
    return GatherMeta(labels, tuple(p.out_size), bool(p.resize), dense_shape, at,
                      at + len(labels) * RECORD_BYTES, plan.indices[keep], skipped)


def gather_batch(ctx: BuildContext, plan: BatchPlan, epoch: int, buf: np.ndarray,
                 scratch: Scratch, progress=None) -> GatherMeta:
    """Gather the planned batch into ``buf`` (flat uint8, >= gather_bytes); its GatherMeta."""
    n = len(plan.indices)
    geo = np.zeros((n, 9), dtype=np.int64)
    geo[:, 0:4] = plan.params.boxes
    geo[:, 4], geo[:, 5] = plan.params.flip_h, plan.params.flip_v
    everyone = np.ones(n, dtype=bool)
    if is_dense(plan.entries, ctx) and _gather_dense(ctx, plan, buf):
        h, w, size = (int(plan.entries[f][0]) for f in ("height", "width", "length"))
        geo[:, 6], geo[:, 7], geo[:, 8] = np.arange(n) * size, h, w
        return _meta(plan, geo, everyone, (n, h, w, 3), size * n, list(plan.skipped), buf)
    offset, failed = 0, []
    for pos in range(n):
        if progress is not None:
            progress[0] = plan.indices[pos]
        try:
            offset += _place_one(ctx, plan, pos, epoch, geo, buf, offset, scratch)
        except Exception as exc:
            skip_or_raise(ctx, plan.indices[pos], exc, failed, pos)
    everyone[[pos for pos, _ in failed]] = False
    dense = is_dense(plan.entries[everyone], ctx)
    shape = (int(everyone.sum()), int(plan.entries["height"][0]),
             int(plan.entries["width"][0]), 3) if dense else None
    return _meta(plan, geo, everyone, shape, offset, list(plan.skipped) + [e for _, e in failed],
                 buf)


def _gather_stages(plan_s: float, gather_s: float):
    """The stage seconds of a gathered batch (gathering counts as reading and decoding)."""
    stages = stage_table()
    stages[0, PLAN], stages[0, DECODE] = plan_s, gather_s
    return stage_totals(stages)


class GatherJob:
    """Transforms on the device: each batch gathered whole by one worker into a slot."""

    def __init__(self, ctx: BuildContext, num_slots: int, pin: bool):
        self.ctx = ctx
        self.slots = SlotPool(num_slots, pin=pin)

    def _gather(self, indices, epoch, out: list, state: dict) -> None:
        t0 = time.perf_counter()
        plan = plan_checked(self.ctx, indices, epoch)
        slot = self.slots.acquire(gather_bytes(plan.entries))
        t1 = time.perf_counter()  # a free slot was waited for: not the worker's work
        try:
            meta = gather_batch(self.ctx, plan, epoch, self.slots.array(slot), scratch_of(state),
                                state.get("progress"))
        except BaseException:
            self.slots.release(slot)
            raise
        meta.stages = _gather_stages(t1 - t0, time.perf_counter() - t1)
        out.extend((slot, meta))

    def split(self, k: int, indices, epoch: int):
        """One part: gather batch ``k`` into a free pinned slot (in a worker thread)."""
        out = []

        def finalize():
            slot, meta = out
            return HostBatch(meta.labels, meta.indices, meta.skipped,
                             data=self.slots.tensor(slot)[:meta.nbytes], meta=meta,
                             release=functools.partial(self.slots.release, slot),
                             stages=meta.stages)
        return [functools.partial(self._gather, indices, epoch, out)], finalize

    def slot_bytes(self, batch_size: int) -> int:
        """Shared slot size for process workers: a batch of full-size stored images, then
        one 64-byte record per sample."""
        h, w = largest_image(self.ctx.dataset)
        return batch_size * (h * w * 3 + 64) + 64

    def build(self, slot, progress, state, indices, epoch) -> GatherMeta:
        """(In a worker) gather the batch into the shared slot; return its GatherMeta."""
        t0 = time.perf_counter()
        plan = plan_checked(self.ctx, indices, epoch)
        t1 = time.perf_counter()
        meta = gather_batch(self.ctx, plan, epoch, np.frombuffer(slot, dtype=np.uint8),
                            scratch_of(state), progress)
        meta.stages = _gather_stages(t1 - t0, time.perf_counter() - t1)
        return meta

    def used_bytes(self, meta: GatherMeta) -> int:
        """Bytes of the slot that ``build`` filled (pixels, then the records)."""
        return int(meta.nbytes)

    def collect(self, slot, meta: GatherMeta, release) -> HostBatch:
        """(In the consumer) a view of the slot's bytes; the slot stays held until
        ``release`` (after the device copy)."""
        import torch

        data = torch.frombuffer(slot, dtype=torch.uint8, count=max(meta.nbytes, 1))[:meta.nbytes]
        return HostBatch(meta.labels, meta.indices, meta.skipped, data=data, meta=meta,
                         release=release, stages=meta.stages)


class SlotPool:
    """``n`` reusable flat uint8 host buffers (pinned for CUDA), grown on demand, handed out
    blocking: at most ``n`` batches are gathered or in flight to the device at once, which
    bounds the pinned memory a loader holds (n x the largest batch)."""

    def __init__(self, n: int, pin: bool):
        self.pin = pin
        self._tensors = [None] * n
        self._free = queue.SimpleQueue()
        for i in range(n):
            self._free.put(i)

    def acquire(self, nbytes: int) -> int:
        """A free slot of at least ``nbytes`` bytes (blocks until one is released)."""
        import torch

        i = self._free.get()
        t = self._tensors[i]
        if t is None or t.numel() < nbytes:
            self._tensors[i] = None  # free the old one before allocating the larger one
            self._tensors[i] = torch.empty(max(nbytes * 5 // 4, 1), dtype=torch.uint8,
                                           pin_memory=self.pin)
        return i

    def tensor(self, i: int):
        """Slot ``i`` as a flat uint8 tensor."""
        return self._tensors[i]

    def array(self, i: int) -> np.ndarray:
        """Slot ``i`` as a flat uint8 numpy array (shares memory)."""
        return self._tensors[i].numpy()

    def release(self, i: int) -> None:
        """Give slot ``i`` back."""
        self._free.put(i)

    def nbytes(self) -> int:
        """Bytes held by the slots allocated so far."""
        return sum(t.numel() for t in self._tensors if t is not None)
