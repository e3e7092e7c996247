"""The build stage: records -> pixels, in the workers (threads, processes or the caller).

The third of the batch path's four stages (order -> plan -> **build** -> finish). A worker
takes a batch's sample indices, plans it (plan.py: lookups and random parameters) and makes
its pixels in one of two layouts:

* **finished** (this module: transforms on the host): crop / resized crop / flips straight
  into a CHW uint8 batch (JPEG and planes region decodes + the C resize straight into the
  CHW planes with the flips: one C call for a whole range where records lie in mapped
  shards, else one per sample; PIL only for filters the extension lacks; raw crops without
  resize are one C call per shard for the whole range), then the epilogue (colour jitter,
  normalisation, cast: ``dlpack_io.kernels.reference``, the same maths as the GPU kernels)
  on those rows, in the same worker, into a recycled batch tensor (finish.BufferPool);
* **gathered** (gather.py: transforms on the device): the stored pixels each sample needs,
  back to back in one flat pinned buffer, for one copy and one kernel in the finish stage.

Both layouts share what is here first: the worker's :class:`BuildContext`, its scratch
buffer, one record's payload, the user's sample_transform, the rule that turns a failing
sample into a SampleError or a skip, and the stage's own statistics (worker seconds per
stage, carried by each batch to ``loader.stats()``).

A job offers two faces to the workers (workers.py): threads / serial call
``split(k, indices, epoch) -> (parts, finalize)`` (each part a callable taking the calling
thread's ``state`` dict; ``finalize()`` runs once all parts succeeded and returns the
HostBatch); processes call ``slot_bytes(batch_size)``, ``build(slot, progress, state,
indices, epoch)`` in the worker and ``collect(slot, meta, release)`` in the consumer;
Ray actors the same, sending back the slot's first ``used_bytes(meta)`` bytes.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader import jpegdecode
from dlpack_io.reader import shard as shard_mod
from dlpack_io.reader.batch.errors import skipped_from
from dlpack_io.reader.batch.plan import (BatchPlan, Draws, TransformSpec, largest_output,
                                         plan_batch, sample_error)
from dlpack_io.reader.batch.stats import STAGES
from dlpack_io.reader.decode import decode_record
from dlpack_io.reader.shard import ShardChangedError, guarded_array

log = logging.getLogger(__name__)


# ---- the stage's statistics: worker seconds per stage ------------------------------------
# Each built batch carries a small float64 vector, one entry per stage of STAGES (plan,
# decode, user, transforms), filled where the work happens and summed by the Loader's clock
# when the batch is delivered, whichever worker built it (threads write their part's own
# row, so no two threads add to one number; processes send the vector back with the
# batch's metadata). Two clock reads per stage per part: well under a microsecond per image.
PLAN, DECODE, USER, TRANSFORMS = range(len(STAGES))
_local = threading.local()


def stage_table(rows: int = 1) -> np.ndarray:
    """A zeroed (rows, stages) table: one row per part of a batch."""
    return np.zeros((max(1, rows), len(STAGES)), dtype=np.float64)


def stage_totals(table) -> np.ndarray | None:
    """Seconds per stage of a batch's table (None stays None)."""
    return None if table is None else np.asarray(table, dtype=np.float64).reshape(
        -1, len(STAGES)).sum(axis=0)


def user_seconds() -> float:
    """Seconds this thread has spent in the user's sample_transform so far."""
    return getattr(_local, "user", 0.0)


def timed_user(fn, pixels):
    """``fn(pixels)``, its seconds added to this thread's user_seconds()."""
    t0 = time.perf_counter()
    try:
        return fn(pixels)
    finally:
        _local.user = user_seconds() + time.perf_counter() - t0


# ---- what both layouts share ---------------------------------------------------------------
@dataclass(frozen=True)
class BuildContext:
    """What a worker needs to build any batch (picklable: the Dataset pickles by path)."""

    dataset: object
    spec: TransformSpec
    seed: int = 0
    skip: bool = False                # on_error="skip": leave failing samples out
    verify: bool = False              # check every record's CRC-32 before using it
    sample_transform: object = None   # the user's fn(HWC uint8) -> HWC uint8, or None


class Scratch:
    """A growable per-thread decode buffer (reused, so steady state allocates nothing)."""

    def __init__(self):
        self.buffer = np.empty(0, dtype=np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        """A buffer of at least ``nbytes`` bytes."""
        if self.buffer.size < nbytes:
            self.buffer = np.empty(max(nbytes, self.buffer.size * 5 // 4), dtype=np.uint8)
        return self.buffer


def scratch_of(state: dict) -> Scratch:
    """The calling worker's Scratch, kept in its ``state`` dict."""
    s = state.get("scratch")
    if s is None:
        s = state["scratch"] = Scratch()
    return s


def plan_checked(ctx: BuildContext, indices, epoch: int) -> BatchPlan:
    """The batch's plan, after checking that the shards it reads were not changed in place
    since this process mapped them (two system calls per shard: cheap, once per batch)."""
    plan = plan_batch(ctx.spec, ctx.dataset, indices, seed=ctx.seed, epoch=epoch, skip=ctx.skip)
    ctx.dataset.check_unchanged(plan.shard_ids)
    return plan


def check_record_crc(payload, entry, path: str) -> None:
    """Raise FormatError when ``payload`` does not match its index entry's CRC-32."""
    actual = fmt.crc32(payload)
    if actual != int(entry["crc"]):
        raise fmt.FormatError(f"{path}: record checksum mismatch (stored {int(entry['crc']):#010x},"
                              f" computed {actual:#010x}): damaged data")


def record_payload(ctx: BuildContext, plan: BatchPlan, pos: int):
    """Record ``pos``'s payload: a zero-copy view of the mapped shard, or with ``verify`` a
    checked copy (the CRC is computed on a copy made under the SIGBUS guard, so a shard
    truncated under the read is an error naming it, not a crash)."""
    shard = ctx.dataset.shards[plan.shard_ids[pos]]
    payload = shard.payload(int(plan.local[pos]))
    if ctx.verify:
        payload = guarded_array(payload)
        check_record_crc(payload, plan.entries[pos], shard.path)
    return payload


def user_pixels(ctx: BuildContext, plan: BatchPlan, pos: int, epoch: int, payload) -> np.ndarray:
    """Decode sample ``pos`` whole, run the user's sample_transform, and redraw its box for
    the new size (the flips and jitter do not depend on the size)."""
    pixels = timed_user(ctx.sample_transform, decode_record(payload, plan.entries[pos]))
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or pixels.ndim != 3 \
            or pixels.shape[2] != 3 or 0 in pixels.shape:
        got = (f"{type(pixels).__name__} {getattr(pixels, 'dtype', '')} "
               f"{getattr(pixels, 'shape', '')}")
        raise TypeError(f"sample_transform must return an (H, W, 3) uint8 ndarray, got {got}")
    idx, p = plan.indices[pos:pos + 1], plan.params
    new = ctx.spec.draw(ctx.seed, epoch, idx, [pixels.shape[0]], [pixels.shape[1]])
    p.boxes[pos] = new.boxes[0]
    if p.exact is not None:
        p.exact[pos], p.windows[pos] = new.exact[0], new.windows[0]
    return np.ascontiguousarray(pixels)


def shard_changed(exc: Exception) -> bool:
    """True for a shard changed or truncated under the reader: not one bad sample, so
    ``on_error="skip"`` must not skip it (every later read of that shard would fail too)."""
    return isinstance(exc, ShardChangedError) or shard_mod.is_mapped_file_error(exc)


def skip_or_raise(ctx: BuildContext, sample, exc: Exception, failed, pos: int) -> None:
    """Raise the SampleError for ``sample``, or record it in ``failed`` when skipping (a
    shard that changed under the reader is always raised)."""
    error = sample_error(ctx.dataset, sample, exc)
    if failed is None or not ctx.skip or shard_changed(exc):
        raise error from exc
    error.__cause__ = exc
    failed.append((pos, skipped_from(error)))


def keep_mask(n: int, failed_positions) -> np.ndarray:
    """Boolean mask of the ``n`` batch positions that did not fail."""
    keep = np.ones(n, dtype=bool)
    keep[list(failed_positions)] = False
    return keep


def split_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """[a, b) ranges cutting n samples into at most ``parts`` nearly equal pieces."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]


def largest_image(dataset) -> tuple[int, int]:
    """(height, width) bounding every stored image (opens every shard's index)."""
    h = max(int(s.index["height"].max(initial=1)) for s in dataset.shards)
    w = max(int(s.index["width"].max(initial=1)) for s in dataset.shards)
    return h, w


def _noop() -> None:
    return None


@dataclass
class HostBatch:
    """One batch as the workers hand it to the consumer."""

    labels: np.ndarray              # (N,) int64
    indices: np.ndarray             # (N,) global sample indices
    skipped: list                   # Skipped entries (on_error="skip")
    images: object = None           # finished layout: (N, 3, oh, ow) tensor, output dtype
    data: object = None             # gathered layout: flat uint8 tensor (the bytes in use)
    meta: object = None             # gathered layout: geometry (gather.GatherMeta)
    release: Callable[[], None] = field(default=_noop)  # give the buffer back
    stages: object = None           # worker seconds per stage (stage_totals)
    remote: object = None           # Ray workers: the remote stage's figures (rayworkers.py)


# ---- finished layout: CHW pixels ---------------------------------------------------------
def _fill_pixels(pixels: np.ndarray, pos: int, fh, fv, params, out, offset) -> None:
    """Crop / resize + flip an (h, w, 3) C-contiguous array into CHW planes at ``offset``."""
    top, left, h, w = (int(v) for v in params.boxes[pos])
    if params.exact is not None:  # Resize + crop: the fractional box, filter reads around it
        t, lf, bh, bw = (float(v) for v in params.exact[pos])
        jpegdecode.resize_box(pixels, (lf, t, lf + bw, t + bh), params.out_size,
                              within_box=False, resample=params.resample,
                              into=(out, offset, fh, fv))
    elif params.resize:
        jpegdecode.resize_box(pixels, (left, top, left + w, top + h), params.out_size,
                              resample=params.resample, into=(out, offset, fh, fv))
    else:
        cols = pixels.shape[1]
        shard_mod.to_chw(pixels, (top * cols + left) * 3, cols * 3, h, w, out, offset, fh, fv)


def _fill_jpeg(ctx, payload, entry, pos, fh, fv, params, out, offset, scratch) -> None:
    oh, ow = params.out_size
    box = params.boxes[pos]
    buf = scratch.get(jpegdecode.scratch_bytes(int(entry["height"]), int(entry["width"])))
    if params.resize:
        exact = None if params.exact is None else params.exact[pos]
        window = box if exact is None else params.windows[pos]
        reduce = ctx.spec.reduced_decode and int(entry["kind"]) == fmt.KIND_JPEG
        jpegdecode.decode_resized(payload, window, (oh, ow), buf, reduce,
                                  exact_box=exact, orientation=int(entry["orientation"]),
                                  resample=params.resample, into=(out, offset, fh, fv))
        return
    region = jpegdecode.decode_region(payload, box, 8, buf,
                                      orientation=int(entry["orientation"]))
    top, left = int(box[0]) - region.y0, int(box[1]) - region.x0
    cols = region.pixels.shape[1]
    shard_mod.to_chw(region.pixels, (top * cols + left) * 3, cols * 3, oh, ow, out, offset,
                      fh, fv)


def fill_sample(ctx, plan: BatchPlan, pos: int, epoch: int, flat, offset, scratch) -> None:
    """Write sample ``pos``'s CHW uint8 pixels into ``flat`` at byte ``offset``."""
    entry, params = plan.entries[pos], plan.params
    if int(entry["channels"]) != 3:
        raise fmt.FormatError(f"{int(entry['channels'])} channels, the loader reads RGB records")
    payload = record_payload(ctx, plan, pos)
    fh, fv = params.flip_h[pos], params.flip_v[pos]
    kind = int(entry["kind"])
    if ctx.sample_transform is not None:
        pixels = user_pixels(ctx, plan, pos, epoch, payload)
        _fill_pixels(pixels, pos, fh, fv, params, flat, offset)
    elif kind == fmt.KIND_RAW:
        # PIL's resize reads its input from Python-land memory: copy a mapped record under
        # the SIGBUS guard first; a plain crop and the C resize read it themselves, guarded
        copy = params.resize and not jpegdecode.resizes_in_c(params.resample)
        raw = guarded_array(payload) if copy else np.frombuffer(payload, np.uint8)
        _fill_pixels(raw.reshape(int(entry["height"]), int(entry["width"]), 3), pos, fh, fv,
                     params, flat, offset)
    elif kind == fmt.KIND_JPEG or kind == fmt.KIND_PLANES:  # planes: as the JPEG decodes
        _fill_jpeg(ctx, payload, entry, pos, fh, fv, params, flat, offset, scratch)
    else:  # a PNG/WebP file record: decoded whole by reader core (which refuses other kinds)
        _fill_pixels(decode_record(payload, entry), pos, fh, fv, params, flat, offset)


def _raw_crops_at_once(ctx: BuildContext, plan: BatchPlan, a: int, b: int, flat) -> bool:
    """Raw records cropped without resize: one C call per shard for samples [a, b).

    Returns False (having copied nothing for sure) when they do not qualify; the
    per-sample path then does the work and names any failing record."""
    entries, params, shard_ids = plan.entries[a:b], plan.params, plan.shard_ids[a:b]
    if ctx.verify or ctx.sample_transform is not None or params.resize or \
            not np.all(entries["kind"] == fmt.KIND_RAW) or not np.all(entries["channels"] == 3):
        return False
    views = {int(k): ctx.dataset.shards[int(k)].file_view() for k in np.unique(shard_ids)}
    if any(v is None for v in views.values()):
        return False
    oh, ow = params.out_size
    width = entries["width"].astype(np.int64)
    top, left = params.boxes[a:b, 0], params.boxes[a:b, 1]
    table = np.stack([entries["offset"].astype(np.int64) + (top * width + left) * 3, width * 3,
                      params.flip_h[a:b], params.flip_v[a:b],
                      np.arange(a, b, dtype=np.int64) * 3 * oh * ow], axis=1)
    try:
        for k, view in views.items():
            shard_mod.crop_chw(view, table[shard_ids == k], oh, ow, flat)
    except ValueError:
        return False
    return True


# decode_resized_many's table (reader/_jpeg.c, M_*): one int64 row per record, these columns
_MANY = ("slot", "offset", "length", "top", "left", "height", "width", "scale", "within", "oh",
         "ow", "dst", "flip_h", "flip_v", "orientation", "index", "flagged")


def _decodes_at_once(ctx: BuildContext, plan: BatchPlan, a: int, b: int, flat, scratch):
    """JPEG and planes records of samples [a, b) decoded and resized into ``flat`` by C
    calls that take many records each (one GIL release, nothing per sample in Python).

    Returns ``run(pos, progress) -> the first position from pos not made``: the caller makes
    that sample alone (fill_sample), which raises the error naming what is wrong with it, and
    runs on from the next; or None when the range does not qualify at all (a CRC check, a
    sample_transform, no resize or not the C one). Records of other kinds or of shards not
    mapped as one file (LMDB, remote records not yet assembled) are flagged for the caller."""
    params, many = plan.params, jpegdecode.native_decode_resized_many
    if ctx.verify or ctx.sample_transform is not None or not params.resize or many is None \
            or not jpegdecode.resizes_in_c(params.resample):
        return None
    entries, n = plan.entries[a:b], b - a
    shards, slots = np.unique(plan.shard_ids[a:b], return_inverse=True)
    views = [ctx.dataset.shards[int(k)].file_view() for k in shards]
    kinds = entries["kind"]
    flagged = ~(((kinds == fmt.KIND_JPEG) | (kinds == fmt.KIND_PLANES))
                & (entries["channels"] == 3) & np.array([v is not None for v in views])[slots])
    if flagged.all():  # e.g. an LMDB data set: nothing for the call to make
        return None
    oh, ow = params.out_size
    window = (params.boxes if params.exact is None else params.windows)[a:b]
    targets = np.ascontiguousarray(window if params.exact is None else params.exact[a:b],
                                   dtype=np.float64)
    reduce = ctx.spec.reduced_decode & (kinds == fmt.KIND_JPEG)
    scales = jpegdecode.choose_scales(targets[:, 2].astype(np.int64),
                                      targets[:, 3].astype(np.int64), oh, ow)
    table = np.zeros((n, len(_MANY)), dtype=np.int64)
    for name, column in (
            ("slot", slots), ("offset", entries["offset"]), ("length", entries["length"]),
            ("top", window[:, 0]), ("left", window[:, 1]), ("height", window[:, 2]),
            ("width", window[:, 3]), ("scale", np.where(reduce, scales, 8)),
            ("within", params.exact is None), ("oh", oh), ("ow", ow),
            ("dst", np.arange(a, b, dtype=np.int64) * (3 * oh * ow)),
            ("flip_h", params.flip_h[a:b]), ("flip_v", params.flip_v[a:b]),
            ("orientation", entries["orientation"]), ("index", plan.indices[a:b]),
            ("flagged", flagged)):
        table[:, _MANY.index(name)] = column
    views = [v if v is not None else b"" for v in views]
    need = jpegdecode.scratch_bytes(entries["height"].astype(np.int64),
                                    entries["width"].astype(np.int64))  # (elementwise)
    buf = scratch.get(int(need.max()))  # the largest record's
    own_progress = np.zeros(1, dtype=np.int64)

    def run(pos: int, progress) -> int:
        i = pos - a
        if flagged[i]:  # the caller's at once, without a call that would stop at it
            return pos
        return pos + many(views, table[i:], targets[i:], buf, flat,
                          own_progress if progress is None else progress)
    return run


def fill_range(ctx: BuildContext, plan: BatchPlan, a: int, b: int, epoch: int,
               u8: np.ndarray, scratch: Scratch, progress=None, failed=None) -> None:
    """Fill samples [a, b) of ``u8`` ((N, 3, oh, ow) uint8, C-contiguous).

    ``progress`` (a 1-element int64 array) receives each sample index before its work, so
    a crash or a hang can be traced to the record. A failing sample raises SampleError, or
    when skipping appends ``(position, Skipped)`` to ``failed``."""
    if u8.shape != plan.shape or not u8.flags.c_contiguous:
        raise ValueError(f"batch buffer {u8.shape} is not a contiguous {plan.shape}")
    if plan.params.sizes is not None:  # pad=True: each at its own size
        return _fill_padded(ctx, plan, a, b, epoch, u8, scratch, progress, failed)
    flat = u8.reshape(-1)
    if _raw_crops_at_once(ctx, plan, a, b, flat):
        return
    plane = 3 * plan.params.out_size[0] * plan.params.out_size[1]
    run, pos = _decodes_at_once(ctx, plan, a, b, flat, scratch), a
    while pos < b:
        if run is not None:  # as many as one C call makes, then the one it stopped at
            pos = run(pos, progress)
            if pos == b:
                break
        if progress is not None:
            progress[0] = plan.indices[pos]
        try:
            fill_sample(ctx, plan, pos, epoch, flat, pos * plane, scratch)
        except Exception as exc:
            skip_or_raise(ctx, plan.indices[pos], exc, failed, pos)
        pos += 1


def _fill_padded(ctx, plan, a, b, epoch, u8, scratch, progress, failed) -> None:
    """Samples [a, b) each made at its own size, then placed top-left in its padded row
    (the rest of the row zeroed: the buffers are recycled)."""
    for pos in range(a, b):
        if progress is not None:
            progress[0] = plan.indices[pos]
        h, w = (int(v) for v in plan.params.sizes[pos])
        one = replace(plan, params=replace(plan.params, out_size=(h, w)))
        sample = np.empty(3 * h * w, dtype=np.uint8)
        try:
            fill_sample(ctx, one, pos, epoch, sample, 0, scratch)
        except Exception as exc:
            skip_or_raise(ctx, plan.indices[pos], exc, failed, pos)
            continue
        row = u8[pos]
        row[:, :h, :w] = sample.reshape(3, h, w)
        row[:, h:, :] = 0
        row[:, :h, w:] = 0


def epilogue_rows(spec: TransformSpec, plan: BatchPlan, a: int, b: int, u8, out) -> None:
    """The epilogue (jitter, normalise, cast) of rows [a, b): uint8 ``u8`` -> ``out``
    (torch tensors of the batch shape); the kernels' torch twin does the maths, with the
    parameters the recipe's compile validated once (``spec.host_epilogue``)."""
    from dlpack_io.kernels.reference import finish

    if a == b:
        return
    p, ep = plan.params, spec.host_epilogue
    fixed = dict(out_dtype=ep.out_dtype, scale=ep.scale, bias=ep.bias, ops=ep.ops)
    if p.sizes is None:
        jitter = {} if p.jitter is None else spec.jitter.tensors(p.jitter[a:b], p.order[a:b])
        finish(u8[a:b], out=out[a:b], **fixed, **jitter)
        return
    for pos in range(a, b):  # padded: each sample's own area (contrast's mean)
        h, w = (int(v) for v in p.sizes[pos])
        jitter = {} if p.jitter is None else \
            spec.jitter.tensors(p.jitter[pos:pos + 1], p.order[pos:pos + 1])
        one = finish(u8[pos:pos + 1, :, :h, :w].contiguous(), **fixed, **jitter)
        out[pos, :, :h, :w] = one[0]


def _compact(images, failed: list, n: int):
    """Move the rows that did not fail to the front; return the view of the kept rows."""
    import torch

    if not failed:
        return images
    keep = torch.from_numpy(keep_mask(n, [pos for pos, _ in failed]))
    m = int(keep.sum())
    images[:m] = images[keep]
    return images[:m]


def output_pixels(ctx: BuildContext) -> int:
    """Pixels of the largest output image a batch can hold: the geometry's size (a bucketing's
    largest bucket), the largest padded size, else the largest stored image."""
    geometry = ctx.spec.geometry
    if ctx.spec.pad:  # the largest padded batch the data set can make
        oh, ow = largest_output(geometry, ctx.dataset, ctx.spec.pad)
    elif hasattr(geometry, "largest"):
        return geometry.largest()
    elif geometry is not None:
        oh, ow = geometry.size
    else:
        oh, ow = largest_image(ctx.dataset)
    return oh * ow


class FinishedJob:
    """Transforms on the host, batches split into ``parts`` ranges of samples, each batch in a
    tensor taken from ``pool`` (finish.BufferPool)."""

    def __init__(self, ctx: BuildContext, pool, parts: int):
        self.ctx, self.pool, self.parts = ctx, pool, max(1, int(parts))

    def _fill(self, plan, a, b, epoch, u8, out, failed, row, state) -> None:
        t0, user0 = time.perf_counter(), user_seconds()
        spec = self.ctx.spec
        fill_range(self.ctx, plan, a, b, epoch, u8.numpy(), scratch_of(state),
                   state.get("progress"), failed)
        t1, user = time.perf_counter(), user_seconds() - user0
        for op in spec.sample_ops:  # per-sample host ops on the cropped, flipped rows
            op.apply_rows(Draws(self.ctx.seed, epoch), plan.indices[a:b], u8[a:b])
        if out is not u8:
            epilogue_rows(spec, plan, a, b, u8, out)
        if spec.erasing is not None:
            spec.erasing.apply(Draws(self.ctx.seed, epoch), plan.indices[a:b], out[a:b])
        row[DECODE:] = (t1 - t0 - user, user, time.perf_counter() - t1)

    def split(self, k: int, indices, epoch: int):
        """(parts, finalize) of batch ``k``; lookups and random draws happen here."""
        import torch

        t0 = time.perf_counter()
        plan = plan_checked(self.ctx, indices, epoch)
        u8 = self.pool.take(plan.shape, torch.uint8)
        out = self.pool.take(plan.shape, self.ctx.spec.dtype) if self.ctx.spec.has_epilogue else u8
        failed = []  # (position, Skipped) from any thread
        ranges = split_ranges(len(plan.indices), self.parts)
        stages = stage_table(len(ranges))  # one row per part: no two threads add to one
        stages[0, PLAN] = time.perf_counter() - t0
        parts = [functools.partial(self._fill, plan, a, b, epoch, u8, out, failed, stages[i])
                 for i, (a, b) in enumerate(ranges)]

        def finalize():
            batch = self._result(plan, _compact(out, failed, len(plan.indices)), failed)
            batch.stages = stage_totals(stages)
            return batch
        return parts, finalize

    def _result(self, plan, images, failed) -> HostBatch:
        keep = keep_mask(len(plan.indices), [pos for pos, _ in failed])
        skipped = list(plan.skipped) + [entry for _, entry in sorted(failed)]
        return HostBatch(plan.labels[keep], plan.indices[keep], skipped, images=images)

    def slot_bytes(self, batch_size: int) -> int:
        """Shared slot size for process workers: a finished batch in the output dtype."""
        import torch

        pixels = output_pixels(self.ctx)
        return batch_size * 3 * pixels * torch.empty(0, dtype=self.ctx.spec.dtype).element_size()

    def build(self, slot, progress, state, indices, epoch):
        """(In a worker) fill the slot with the finished batch; return its metadata."""
        import torch

        t0 = time.perf_counter()
        plan = plan_checked(self.ctx, indices, epoch)
        stages = stage_table()
        stages[0, PLAN] = time.perf_counter() - t0
        n = int(np.prod(plan.shape))
        out = torch.frombuffer(slot, dtype=self.ctx.spec.dtype, count=max(n, 1))[:n]
        out = out.view(plan.shape)
        u8 = out if not self.ctx.spec.has_epilogue else torch.from_numpy(
            _scratch_u8(state, n)).view(plan.shape)
        failed = []
        state["progress"] = progress
        self._fill(plan, 0, len(plan.indices), epoch, u8, out, failed, stages[0], state)
        batch = self._result(plan, _compact(out, failed, len(plan.indices)), failed)
        return (tuple(batch.images.shape), batch.labels, batch.indices, batch.skipped,
                stage_totals(stages))

    def used_bytes(self, meta) -> int:
        """Bytes of the slot that ``build`` filled (what ``collect`` reads)."""
        import torch

        return int(np.prod(meta[0])) * torch.empty(0, dtype=self.ctx.spec.dtype).element_size()

    def collect(self, slot, meta, release) -> HostBatch:
        """(In the consumer) copy the finished batch out of the slot; free the slot."""
        import torch

        shape, labels, indices, skipped, stages = meta
        try:
            images = self.pool.take(shape, self.ctx.spec.dtype)
            dst = images.view(-1).view(torch.uint8).numpy()
            # one plain memcpy in this thread: torch's copy_ would wake the consumer's
            # intra-op threads, which then spin (about 0.8 CPU-ms per float16 224 px image)
            np.copyto(dst, np.frombuffer(slot, dtype=np.uint8, count=dst.size))
        finally:
            release()
        return HostBatch(labels, indices, skipped, images=images, stages=stages)


def _scratch_u8(state: dict, n: int) -> np.ndarray:
    buf = state.get("u8")
    if buf is None or buf.size < n:
        buf = state["u8"] = np.empty(max(n, 1), dtype=np.uint8)
    return buf[:n]
