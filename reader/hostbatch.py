"""The device path: gather stored pixels into one host buffer, finish the batch on the GPU.

The CPU only moves bytes (and decodes JPEGs, just the crop's region at reduced scale):
  * dense layout (every record raw and of one size): whole records are copied back to
    back into the (pinned) buffer as an NHWC uint8 batch;
  * ragged layout (JPEG records, or raw records of mixed sizes): each sample's pixels
    (the decoded region for JPEG, the whole record for raw) go back to back into a flat
    buffer, with per-sample offsets, heights and widths.
One host->device copy later, one kernel does crop / resized crop, flips, HWC->CHW,
normalisation and the cast (``dlpack_io.kernels``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader import jpegdecode
from dlpack_io.reader.assemble import batch_meta, file_view, skip_or_raise
from dlpack_io.reader.skips import check_record_crc


@dataclass
class HostMeta:
    """What the consumer needs to finish a gathered batch (small, picklable)."""

    labels: np.ndarray      # (N,) int64
    geometry: np.ndarray    # (N, 9) int64: top, left, h, w, flip_h, flip_v, offset, height, width
    out_size: tuple
    resize: bool
    dense_shape: tuple | None  # (N, H, W, 3) for the dense layout, None for ragged
    nbytes: int             # bytes of the buffer in use
    indices: np.ndarray     # (N,) global indices of the samples in the buffer
    skipped: list           # Skipped entries of samples left out (on_error="skip")


def is_dense(entries) -> bool:
    """True when every record is raw and all have one size (the NHWC layout)."""
    return bool(len(entries)) and bool(np.all(entries["kind"] == fmt.KIND_RAW)) and \
        bool(np.all(entries["height"] == entries["height"][0])) and \
        bool(np.all(entries["width"] == entries["width"][0]))


def capacity_needed(entries) -> int:
    """Upper bound of the buffer bytes a batch needs (full-size pixels of every sample)."""
    return int((entries["height"].astype(np.int64) * entries["width"] * 3).sum())


def _copy_raw(payload, buf: np.ndarray, offset: int) -> int:
    data = np.frombuffer(payload, dtype=np.uint8)
    buf[offset:offset + data.size] = data
    return data.size


def _place_jpeg(pipe, payload, box, params, buf, offset, scratch):
    """Decode the box's region into buf at offset; return (bytes, (h, w), box in region)."""
    n = 8
    if params.resize and pipe.reduce:
        n = jpegdecode.choose_scale(int(box[2]), int(box[3]), *params.out_size)
    if jpegdecode.have_extension():
        region = jpegdecode.decode_region(payload, box, n, buf[offset:])
    else:
        region = jpegdecode.decode_region(payload, box, n, scratch.get(0))
        px = region.pixels
        buf[offset:offset + px.size] = px.reshape(-1)
    rows, cols = region.pixels.shape[:2]
    return rows * cols * 3, (rows, cols), region.int_box(box)


def _gather_dense(pipe, shard_ids, entries, buf: np.ndarray) -> bool:
    """Copy whole same-size raw records back to back with one C call per shard.

    Returns False (nothing guaranteed copied) when a shard is not memory-mapped, so the
    caller takes the per-record path, which also names a failing record precisely.
    """
    size = int(entries["length"][0])
    dst = np.arange(len(entries), dtype=np.int64) * size
    views = {int(k): file_view(pipe.dataset.shards[int(k)]) for k in np.unique(shard_ids)}
    if any(v is None for v in views.values()):
        return False
    try:
        for k, view in views.items():
            mask = shard_ids == k
            jpegdecode.gather(view, entries["offset"][mask], entries["length"][mask], buf, dst[mask])
    except ValueError:
        return False
    return True


def fill_host(pipe, indices, epoch: int, buf: np.ndarray, scratch, progress=None) -> HostMeta:
    """Gather the batch ``indices`` into ``buf`` (flat uint8); return its HostMeta."""
    skipped = []
    indices, shard_ids, local, entries, params = batch_meta(pipe, indices, epoch, skipped)
    dense = is_dense(entries)
    geo = np.zeros((len(indices), 9), dtype=np.int64)
    geo[:, 0:4] = params.boxes
    geo[:, 4], geo[:, 5] = params.flip_h, params.flip_v
    labels = entries["label"].astype(np.int64)
    hw = (int(entries["height"][0]), int(entries["width"][0])) if dense else None
    if dense and not pipe.verify and _gather_dense(pipe, shard_ids, entries, buf):
        size = int(entries["length"][0])
        geo[:, 6] = np.arange(len(indices)) * size
        geo[:, 7], geo[:, 8] = entries["height"], entries["width"]
        return HostMeta(labels, geo, tuple(params.out_size), bool(params.resize),
                        (len(indices), *hw, 3), size * len(indices), indices, skipped)
    offset, failed = 0, []
    for pos in range(len(indices)):
        if progress is not None:
            progress[0] = indices[pos]
        try:
            offset += _place_one(pipe, shard_ids[pos], local[pos], entries[pos], params, pos,
                                 geo, buf, offset, scratch)
        except Exception as exc:
            skip_or_raise(pipe, indices[pos], exc, failed, pos)
    keep = np.ones(len(indices), dtype=bool)
    keep[[pos for pos, _ in failed]] = False
    skipped += [entry for _, entry in failed]
    m = int(keep.sum())
    return HostMeta(labels[keep], geo[keep], tuple(params.out_size), bool(params.resize),
                    (m, *hw, 3) if dense else None, offset, indices[keep], skipped)


def _place_one(pipe, shard_id, record, entry, params, pos, geo, buf, offset, scratch) -> int:
    """Put sample ``pos`` at ``offset`` of ``buf`` and fill its geometry; return its bytes."""
    shard = pipe.dataset.shards[shard_id]
    payload = shard.payload(int(record))
    if pipe.verify:
        check_record_crc(payload, entry, shard.path)
    geo[pos, 6:9] = offset, entry["height"], entry["width"]
    if int(entry["kind"]) == fmt.KIND_RAW:
        return _copy_raw(payload, buf, offset)
    size, (rows, cols), box = _place_jpeg(pipe, payload, params.boxes[pos], params,
                                          buf, offset, scratch)
    geo[pos, 0:4], geo[pos, 7:9] = box, (rows, cols)
    return size


def device_images(meta: HostMeta, data, pipe, *, validate: bool):
    """Run the kernel on the host batch ``data`` (a uint8 tensor already on the device)."""
    import torch

    from dlpack_io import kernels

    if not len(meta.labels):  # every sample skipped (on_error="skip")
        dtype = pipe.dtype if pipe.dtype is not None else torch.uint8
        return torch.empty((0, 3, *meta.out_size), dtype=dtype, device=data.device)
    geo = torch.from_numpy(meta.geometry).to(data.device, non_blocking=True)
    top, left, bh, bw, fh, fv, off, hs, ws = geo.unbind(1)
    fh, fv = fh.to(torch.uint8), fv.to(torch.uint8)
    dtype = pipe.dtype if pipe.dtype is not None else torch.uint8
    norm = dict(mean=pipe.mean, std=pipe.std, out_dtype=dtype, validate=validate)
    if meta.dense_shape is not None:
        images = data[:meta.nbytes].view(meta.dense_shape)
        if not meta.resize:
            oh, ow = meta.out_size
            return kernels.crop_flip_permute(images, top, left, oh, ow, fh, fv, **norm)
        return kernels.resized_crop(images, geo[:, 0:4], meta.out_size, fh, fv,
                                    antialias=True, **norm)
    return kernels.resized_crop(data, geo[:, 0:4], meta.out_size, fh, fv, offsets=off,
                                heights=hs, widths=ws, channels=3, antialias=True, **norm)
