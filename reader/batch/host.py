"""How a batch is built on the host: records -> pixels, in one of two layouts.

The second step of the batch path (after :mod:`batchplan`, before :mod:`devicefinish`).

* **finished** (transforms on the host): crop / resized crop / flips straight into a CHW
  uint8 batch (one C call per JPEG region decode, one PIL resize, one C HWC->CHW copy; raw
  crops without resize are one C call per shard for the whole range), then the shared
  epilogue (colour jitter, normalisation, cast: ``dlpack_io.kernels.reference``, the same
  maths as the GPU kernels) on those rows, in the same worker;
* **gathered** (transforms on the device): the stored pixels each sample needs (a whole raw
  record, or the decoded region of a JPEG) back to back in one flat (pinned) buffer plus
  per-sample geometry, for one host->device copy and one kernel (see devicefinish.py).

Everything here is a function of its arguments; the worker jobs (jobs.py) own the buffers.
A failing sample raises SampleError naming its shard and record, or with on_error="skip" is
recorded as ``(position, Skipped)`` and compacted away at the end of the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlpack_io.kernels.records import (FLIP_H, FLIP_V, IDENTITY_ORDER, JITTER_OPS, RECORD_BYTES,
                                       RECORD_PLACEMENT, host_records)
from dlpack_io.reader import format as fmt
from dlpack_io.reader import jpegdecode
from dlpack_io.reader.batch.plan import NEUTRAL_JITTER, BatchPlan, TransformSpec, sample_error
from dlpack_io.reader.decode import decode_record
from dlpack_io.reader.safeio import ShardChangedError, guarded_array
from dlpack_io.reader.batch.skips import check_record_crc, skipped_from


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


def _record(ctx: BuildContext, plan: BatchPlan, pos: int):
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
    pixels = ctx.sample_transform(decode_record(payload, plan.entries[pos]))
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


# ---- finished layout: CHW uint8 -------------------------------------------------------
def _fill_pixels(pixels: np.ndarray, pos: int, fh, fv, params, out, offset) -> None:
    """Crop / resize + flip an (h, w, 3) C-contiguous array into CHW planes at ``offset``."""
    top, left, h, w = (int(v) for v in params.boxes[pos])
    if params.exact is not None:  # Resize + crop: the fractional box, filter reads around it
        t, lf, bh, bw = (float(v) for v in params.exact[pos])
        resized = jpegdecode.resize_box(pixels, (lf, t, lf + bw, t + bh), params.out_size,
                                        within_box=False)
        jpegdecode.to_chw_array(resized, out, offset, fh, fv)
    elif params.resize:
        resized = jpegdecode.resize_box(pixels, (left, top, left + w, top + h), params.out_size)
        jpegdecode.to_chw_array(resized, out, offset, fh, fv)
    else:
        cols = pixels.shape[1]
        jpegdecode.to_chw(pixels, (top * cols + left) * 3, cols * 3, h, w, out, offset, fh, fv)


def _fill_jpeg(ctx, payload, entry, pos, fh, fv, params, out, offset, scratch) -> None:
    oh, ow = params.out_size
    box = params.boxes[pos]
    buf = scratch.get(jpegdecode.scratch_bytes(int(entry["height"]), int(entry["width"])))
    if params.resize:
        exact = None if params.exact is None else params.exact[pos]
        window = box if exact is None else params.windows[pos]
        resized = jpegdecode.decode_resized(payload, window, (oh, ow), buf,
                                            ctx.spec.reduced_decode, exact_box=exact,
                                            orientation=int(entry["orientation"]))
        jpegdecode.to_chw_array(resized, out, offset, fh, fv)
        return
    region = jpegdecode.decode_region(payload, box, 8, buf,
                                      orientation=int(entry["orientation"]))
    top, left = int(box[0]) - region.y0, int(box[1]) - region.x0
    cols = region.pixels.shape[1]
    jpegdecode.to_chw(region.pixels, (top * cols + left) * 3, cols * 3, oh, ow, out, offset,
                      fh, fv)


def fill_sample(ctx, plan: BatchPlan, pos: int, epoch: int, flat, offset, scratch) -> None:
    """Write sample ``pos``'s CHW uint8 pixels into ``flat`` at byte ``offset``."""
    entry, params = plan.entries[pos], plan.params
    if int(entry["channels"]) != 3:
        raise fmt.FormatError(f"{int(entry['channels'])} channels, the loader reads RGB records")
    payload = _record(ctx, plan, pos)
    fh, fv = params.flip_h[pos], params.flip_v[pos]
    kind = int(entry["kind"])
    if ctx.sample_transform is not None:
        pixels = user_pixels(ctx, plan, pos, epoch, payload)
        _fill_pixels(pixels, pos, fh, fv, params, flat, offset)
    elif kind == fmt.KIND_RAW:
        # PIL's resize reads its input from Python-land memory: copy a mapped record under
        # the SIGBUS guard first; a plain crop is read by the (guarded) C copy itself
        raw = guarded_array(payload) if params.resize else np.frombuffer(payload, np.uint8)
        _fill_pixels(raw.reshape(int(entry["height"]), int(entry["width"]), 3), pos, fh, fv,
                     params, flat, offset)
    elif kind == fmt.KIND_JPEG:
        _fill_jpeg(ctx, payload, entry, pos, fh, fv, params, flat, offset, scratch)
    else:
        raise fmt.FormatError(f"unknown record kind {kind}")


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
            jpegdecode.crop_chw(view, table[shard_ids == k], oh, ow, flat)
    except ValueError:
        return False
    return True


def fill_range(ctx: BuildContext, plan: BatchPlan, a: int, b: int, epoch: int,
               u8: np.ndarray, scratch: Scratch, progress=None, failed=None) -> None:
    """Fill samples [a, b) of ``u8`` ((N, 3, oh, ow) uint8, C-contiguous).

    ``progress`` (a 1-element int64 array) receives each sample index before its work, so
    a crash or a hang can be traced to the record. A failing sample raises SampleError, or
    when skipping appends ``(position, Skipped)`` to ``failed``."""
    if u8.shape != plan.shape or not u8.flags.c_contiguous:
        raise ValueError(f"batch buffer {u8.shape} is not a contiguous {plan.shape}")
    flat = u8.reshape(-1)
    if _raw_crops_at_once(ctx, plan, a, b, flat):
        return
    plane = 3 * plan.params.out_size[0] * plan.params.out_size[1]
    for pos in range(a, b):
        if progress is not None:
            progress[0] = plan.indices[pos]
        try:
            fill_sample(ctx, plan, pos, epoch, flat, pos * plane, scratch)
        except Exception as exc:
            skip_or_raise(ctx, plan.indices[pos], exc, failed, pos)


def _shard_changed(exc: Exception) -> bool:
    """True for a shard changed or truncated under the reader: not one bad sample, so
    ``on_error="skip"`` must not skip it (every later read of that shard would fail too)."""
    mapped = getattr(jpegdecode._jpeg, "MappedFileError", None)
    return isinstance(exc, ShardChangedError) or (mapped is not None and isinstance(exc, mapped))


def skip_or_raise(ctx: BuildContext, sample, exc: Exception, failed, pos: int) -> None:
    """Raise the SampleError for ``sample``, or record it in ``failed`` when skipping (a
    shard that changed under the reader is always raised)."""
    error = sample_error(ctx.dataset, sample, exc)
    if failed is None or not ctx.skip or _shard_changed(exc):
        raise error from exc
    error.__cause__ = exc
    failed.append((pos, skipped_from(error)))


def epilogue_kwargs(spec, params, a: int, b: int) -> dict:
    """Keyword arguments of ``kernels.reference.epilogue`` (normalise, jitter, cast) for
    rows [a, b) of a batch."""
    import torch

    kw = {"out_dtype": spec.dtype}
    if spec.normalize is not None:
        kw["mean"], kw["std"] = spec.normalize.mean, spec.normalize.std
    if params.jitter is not None:
        rows = slice(a, b)
        factors = torch.from_numpy(np.ascontiguousarray(params.jitter[rows]))
        order = torch.from_numpy(np.ascontiguousarray(params.order[rows]))
        for j, name in enumerate(JITTER_OPS):
            if spec.jitter.ranges[j] is not None:
                kw[name] = factors[:, j]
        kw["order"] = order
    return kw


def epilogue_rows(spec: TransformSpec, plan: BatchPlan, a: int, b: int, u8, out) -> None:
    """The shared epilogue (jitter, normalise, cast) of rows [a, b): uint8 ``u8`` -> ``out``
    (torch tensors of the batch shape); the kernels' torch reference does the maths."""
    from dlpack_io.kernels import reference

    if a == b:
        return
    reference.epilogue(u8[a:b], out=out[a:b], **epilogue_kwargs(spec, plan.params, a, b))


def split_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """[a, b) ranges cutting n samples into at most ``parts`` nearly equal pieces."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]


# ---- gathered layout: stored pixels for the device ------------------------------------
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
    if params.resize and ctx.spec.reduced_decode:
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
            jpegdecode.gather(view, entries["offset"][mask], entries["length"][mask], buf, dst[mask])
    except ValueError:
        return False
    return True


def _place_one(ctx, plan, pos, epoch, geo, buf, offset, scratch) -> int:
    """Put sample ``pos`` at ``offset`` of ``buf`` and fill its geometry; return its bytes."""
    entry, params = plan.entries[pos], plan.params
    payload = _record(ctx, plan, pos)
    if ctx.sample_transform is not None:
        pixels = user_pixels(ctx, plan, pos, epoch, payload)
        buf[offset:offset + pixels.size] = pixels.reshape(-1)
        geo[pos, 0:4] = params.boxes[pos]
        geo[pos, 6:9] = offset, pixels.shape[0], pixels.shape[1]
        return pixels.size
    geo[pos, 6:9] = offset, entry["height"], entry["width"]
    if int(entry["kind"]) == fmt.KIND_RAW:
        data = np.frombuffer(payload, dtype=np.uint8)
        buf[offset:offset + data.size] = data
        return data.size
    size, (rows, cols), box = _place_jpeg(ctx, payload, entry, params.boxes[pos], params, buf,
                                          offset, scratch)
    geo[pos, 0:4], geo[pos, 7:9] = box, (rows, cols)
    return size


def _encode_order(perms: np.ndarray) -> np.ndarray:
    """(N, 4) op-id permutations -> the kernels' int32 order codes (sum perm[k] << 2k)."""
    return (perms.astype(np.int32) << np.array([0, 2, 4, 6], dtype=np.int32)).sum(1)


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
    factors = p.jitter if p.jitter is not None else np.tile(NEUTRAL_JITTER, (len(labels), 1))
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
