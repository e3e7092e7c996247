"""Build one batch on the CPU: records -> crop / resize / flip -> CHW uint8 -> dtype.

The hot path of the CPU loader. Per batch: one vectorized index lookup and parameter
draw. JPEG records, per sample: one C call (region decode as RGBX, GIL released), one PIL
resize of the box (on the decoded memory, GIL released) and one C HWC->CHW copy straight
into the batch tensor. Raw records cropped without resize: one C call per shard for the
whole batch, straight out of the memory-mapped file (no intermediate copy, no GIL).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader import jpegdecode
from dlpack_io.reader.errors import SampleError
from dlpack_io.reader.skips import check_record_crc, compact_rows, keep_mask, skipped_from
from dlpack_io.reader.transforms import BatchParams, TransformError, sample_params


@dataclass(frozen=True)
class Pipeline:
    """What a worker needs to build any batch (picklable: the Dataset pickles by path)."""

    dataset: object
    crop: object = None
    flip_h: float = 0.0
    flip_v: float = 0.0
    seed: int = 0
    mean: tuple | None = None
    std: tuple | None = None
    dtype: object = None        # torch dtype of the images; None = uint8
    reduce: bool = True         # decode JPEGs at reduced DCT scale when the crop allows
    on_error: str = "raise"     # "skip": leave unreadable samples out (see skips.py)
    verify: bool = False        # check every record's CRC-32 before using it


class Scratch:
    """A growable per-thread decode buffer (reused, so steady state allocates nothing)."""

    def __init__(self):
        self.buffer = np.empty(0, dtype=np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        """A buffer of at least ``nbytes`` bytes."""
        if self.buffer.size < nbytes:
            self.buffer = np.empty(max(nbytes, self.buffer.size * 5 // 4), dtype=np.uint8)
        return self.buffer


def batch_meta(pipe: Pipeline, indices, epoch: int, skipped: list | None = None):
    """(indices, shard ids, record ids, index entries, BatchParams) of a batch.

    With ``on_error="skip"`` and a ``skipped`` list, samples whose transform cannot apply
    are dropped from the returned indices and appended to ``skipped``."""
    indices = np.asarray(indices, dtype=np.int64)
    while True:
        shard_ids, local, entries = pipe.dataset.lookup(indices)
        try:
            params = sample_params(pipe.crop, pipe.flip_h, pipe.flip_v, pipe.seed, epoch,
                                   indices, entries["height"], entries["width"])
            return indices, shard_ids, local, entries, params
        except TransformError as exc:
            error = sample_error(pipe.dataset, exc.sample, exc)
            if skipped is None or pipe.on_error != "skip" or exc.sample not in indices:
                raise error from exc
            error.__cause__ = exc
            skipped.append(skipped_from(error))
            indices = indices[indices != exc.sample]


def _fill_raw(payload, entry, box, fh, fv, params: BatchParams, out, offset) -> None:
    h_img, w_img = int(entry["height"]), int(entry["width"])
    top, left, h, w = (int(v) for v in box)
    oh, ow = params.out_size
    if params.resize:
        pixels = np.frombuffer(payload, dtype=np.uint8).reshape(h_img, w_img, 3)
        resized = jpegdecode.resize_box(pixels, (left, top, left + w, top + h), (oh, ow))
        jpegdecode.to_chw_array(resized, out, offset, fh, fv)
    else:
        jpegdecode.to_chw(payload, (top * w_img + left) * 3, w_img * 3, h, w, out, offset,
                          fh, fv)


def _fill_jpeg(pipe, payload, entry, box, fh, fv, params, out, offset, scratch) -> None:
    oh, ow = params.out_size
    buf = scratch.get(jpegdecode.scratch_bytes(int(entry["height"]), int(entry["width"])))
    if params.resize:
        resized = jpegdecode.decode_resized(payload, box, (oh, ow), buf, pipe.reduce)
        jpegdecode.to_chw_array(resized, out, offset, fh, fv)
        return
    region = jpegdecode.decode_region(payload, box, 8, buf)
    top, left = int(box[0]) - region.y0, int(box[1]) - region.x0
    cols = region.pixels.shape[1]
    jpegdecode.to_chw(region.pixels, (top * cols + left) * 3, cols * 3, oh, ow, out, offset,
                      fh, fv)


def fill_sample(pipe, payload, entry, box, fh, fv, params, out, offset, scratch) -> None:
    """Write one sample's CHW uint8 pixels into ``out`` (flat uint8) at byte ``offset``."""
    if int(entry["channels"]) != 3:
        raise fmt.FormatError(f"{int(entry['channels'])} channels, the loader reads RGB records")
    kind = int(entry["kind"])
    if kind == fmt.KIND_RAW:
        _fill_raw(payload, entry, box, fh, fv, params, out, offset)
    elif kind == fmt.KIND_JPEG:
        _fill_jpeg(pipe, payload, entry, box, fh, fv, params, out, offset, scratch)
    else:
        raise fmt.FormatError(f"unknown record kind {kind}")


def sample_error(dataset, index: int, exc: BaseException) -> SampleError:
    """A SampleError naming the shard file and record of sample ``index``."""
    try:
        where = dataset.where(int(index))
    except Exception:  # the location itself is broken: still name the sample
        where = f"sample {int(index)}"
    return SampleError(f"{where}: {type(exc).__name__}: {exc}", where, int(index))


def file_view(shard):
    """The whole memory-mapped file of a record shard (None for other kinds of shard)."""
    if not (hasattr(shard, "span") and hasattr(shard, "header")):
        return None
    h = shard.header
    return shard.span(0, h.meta_offset + h.meta_size)


@dataclass(frozen=True)
class Prepared:
    """A batch's lookups and random parameters, computed once, filled in ranges."""

    indices: np.ndarray
    shard_ids: np.ndarray
    local: np.ndarray
    entries: np.ndarray
    params: BatchParams
    skipped: tuple = ()     # samples dropped before filling (on_error="skip")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(N, 3, oh, ow) of the uint8 batch."""
        return (len(self.indices), 3, *self.params.out_size)

    @property
    def labels(self) -> np.ndarray:
        """int64 labels of the batch."""
        return self.entries["label"].astype(np.int64)


def prepare(pipe: Pipeline, indices, epoch: int) -> Prepared:
    """Look up and draw the parameters of batch ``indices`` (vectorized)."""
    skipped = []
    meta = batch_meta(pipe, indices, epoch, skipped)
    return Prepared(*meta, skipped=tuple(skipped))


def drop_failed(prep: Prepared, out_u8: np.ndarray, failed: list):
    """Compact a filled batch after ``on_error="skip"`` failures ((position, Skipped) pairs).

    Returns (number of samples kept, their labels, their indices, every Skipped entry)."""
    skipped = list(prep.skipped) + [entry for _, entry in sorted(failed)]
    if not failed:
        return len(prep.indices), prep.labels, prep.indices, skipped
    keep = keep_mask(len(prep.indices), [pos for pos, _ in failed])
    m = compact_rows(out_u8, keep)
    return m, prep.labels[keep], prep.indices[keep], skipped


def _raw_crops_at_once(pipe, prep: Prepared, a: int, b: int, flat) -> bool:
    """Raw records, crops without resize: one C call per shard for samples [a, b).

    Returns False (and copies nothing for sure) when they do not qualify; the
    per-sample path then does the work and names any failing record.
    """
    entries, params, shard_ids = prep.entries[a:b], prep.params, prep.shard_ids[a:b]
    if pipe.verify or params.resize or not np.all(entries["kind"] == fmt.KIND_RAW) or \
            not np.all(entries["channels"] == 3):
        return False
    views = {int(k): file_view(pipe.dataset.shards[int(k)]) for k in np.unique(shard_ids)}
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


def fill_range(pipe: Pipeline, prep: Prepared, a: int, b: int, out_u8: np.ndarray,
               scratch: Scratch, progress=None, failed: list | None = None) -> None:
    """Fill samples [a, b) of ``out_u8`` ((N, 3, oh, ow) uint8, C-contiguous).

    ``progress`` (a 1-element int64 array) receives each sample index before its work,
    so a crash can be traced to the record. A failing sample raises SampleError, or with
    ``on_error="skip"`` appends ``(position, Skipped)`` to ``failed`` (see drop_failed)."""
    if out_u8.shape != prep.shape or not out_u8.flags.c_contiguous:
        raise ValueError(f"batch buffer {out_u8.shape} is not a contiguous {prep.shape}")
    flat = out_u8.reshape(-1)
    if _raw_crops_at_once(pipe, prep, a, b, flat):
        return
    params, entries = prep.params, prep.entries
    plane = 3 * params.out_size[0] * params.out_size[1]
    shards = pipe.dataset.shards
    for pos in range(a, b):
        if progress is not None:
            progress[0] = prep.indices[pos]
        try:
            shard = shards[prep.shard_ids[pos]]
            payload = shard.payload(int(prep.local[pos]))
            if pipe.verify:
                check_record_crc(payload, entries[pos], shard.path)
            fill_sample(pipe, payload, entries[pos], params.boxes[pos], params.flip_h[pos],
                        params.flip_v[pos], params, flat, pos * plane, scratch)
        except Exception as exc:
            skip_or_raise(pipe, prep.indices[pos], exc, failed, pos)


def skip_or_raise(pipe: Pipeline, sample, exc: Exception, failed, pos: int) -> None:
    """Raise the SampleError for ``sample``, or record it in ``failed`` when skipping."""
    error = sample_error(pipe.dataset, sample, exc)
    if failed is None or pipe.on_error != "skip":
        raise error from exc
    error.__cause__ = exc
    failed.append((pos, skipped_from(error)))


def split_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """[a, b) ranges cutting n samples into at most ``parts`` nearly equal pieces."""
    parts = max(1, min(parts, n))
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]
