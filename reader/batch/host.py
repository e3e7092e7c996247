"""How a batch is built on the host: records -> pixels, in one of two layouts.

The second step of the batch path (after :mod:`plan`, before :mod:`device`); this module
builds the finished layout, :mod:`gather` the gathered one, :mod:`build` holds what both share.

* **finished** (transforms on the host): crop / resized crop / flips straight into a CHW
  uint8 batch (one C call per JPEG region decode, one C resize straight into the CHW
  planes with the flips, PIL only for filters the extension lacks; raw
  crops without resize are one C call per shard for the whole range), then the shared
  epilogue (colour jitter, normalisation, cast: ``dlpack_io.kernels.reference``, the same
  maths as the GPU kernels) on those rows, in the same worker;
* **gathered** (transforms on the device): the stored pixels each sample needs (a whole raw
  record, or the decoded region of a JPEG) back to back in one flat (pinned) buffer plus
  per-sample geometry, for one host->device copy and one kernel (see device.py).

Everything here is a function of its arguments; the worker jobs (jobs.py) own the buffers.
A failing sample raises SampleError naming its shard and record, or with on_error="skip" is
recorded as ``(position, Skipped)`` and compacted away at the end of the batch.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from dlpack_io.kernels.records import JITTER_OPS
from dlpack_io.reader import format as fmt
from dlpack_io.reader import jpegdecode, nativecopy
from dlpack_io.reader.decode import decode_record
from dlpack_io.reader.nativecopy import guarded_array
from dlpack_io.reader.batch.build import (BuildContext, Scratch, record_payload, skip_or_raise,
                                          user_pixels)
from dlpack_io.reader.batch import padding
from dlpack_io.reader.batch.plan import BatchPlan, TransformSpec


# ---- finished layout: CHW uint8 -------------------------------------------------------
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
        nativecopy.to_chw(pixels, (top * cols + left) * 3, cols * 3, h, w, out, offset, fh, fv)


def _fill_jpeg(ctx, payload, entry, pos, fh, fv, params, out, offset, scratch) -> None:
    oh, ow = params.out_size
    box = params.boxes[pos]
    buf = scratch.get(jpegdecode.scratch_bytes(int(entry["height"]), int(entry["width"])))
    if params.resize:
        exact = None if params.exact is None else params.exact[pos]
        window = box if exact is None else params.windows[pos]
        jpegdecode.decode_resized(payload, window, (oh, ow), buf, ctx.spec.reduced_decode,
                                  exact_box=exact, orientation=int(entry["orientation"]),
                                  resample=params.resample, into=(out, offset, fh, fv))
        return
    region = jpegdecode.decode_region(payload, box, 8, buf,
                                      orientation=int(entry["orientation"]))
    top, left = int(box[0]) - region.y0, int(box[1]) - region.x0
    cols = region.pixels.shape[1]
    nativecopy.to_chw(region.pixels, (top * cols + left) * 3, cols * 3, oh, ow, out, offset,
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
    elif kind == fmt.KIND_JPEG:
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
            nativecopy.crop_chw(view, table[shard_ids == k], oh, ow, flat)
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
    if plan.params.sizes is not None:  # pad=True: each at its own size (padding.py)
        return _fill_padded(ctx, plan, a, b, epoch, u8, scratch, progress, failed)
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


def _fill_padded(ctx, plan, a, b, epoch, u8, scratch, progress, failed) -> None:
    """Samples [a, b) each made at its own size, then placed top-left in its padded row."""
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
        padding.place(sample.reshape(3, h, w), u8, pos)


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
    if plan.params.sizes is not None:  # padded: each sample's own area (contrast's mean)
        for pos in range(a, b):
            h, w = (int(v) for v in plan.params.sizes[pos])
            one = reference.epilogue(u8[pos:pos + 1, :, :h, :w].contiguous(),
                                     **epilogue_kwargs(spec, plan.params, pos, pos + 1))
            out[pos, :, :h, :w] = one[0]
        return
    reference.epilogue(u8[a:b], out=out[a:b], **epilogue_kwargs(spec, plan.params, a, b))
