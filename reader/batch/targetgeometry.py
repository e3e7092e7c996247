"""The maths of targets that follow the image: boxes and masks through the same crop,
resize, flips and padding as the pixels (pure numpy functions, one sample at a time).

A sample's geometry is the source box ``(top, left, height, width)`` its image was resampled
from (fractional for Resize + crop on the host, whole pixels otherwise), its true output size
``(oh, ow)`` and its two flips. The same transforms as torchvision's transforms.v2:

* boxes ``(x0, y0, x1, y1)`` in pixels of the stored upright image map to
  ``x' = (x - left) * ow / width`` (rows alike), are clipped to the output, mirrored by a
  flip (``x' -> ow - x'``), and removed when less than 1 pixel wide or high (with their
  per-box fields: SanitizeBoundingBoxes' ``min_size=1``);
* masks are resampled nearest-neighbour: output row ``y`` reads source row
  ``floor(top + (y + 0.5) * height / oh)`` (the pixel under the output pixel's centre, PIL's
  and torchvision's NEAREST_EXACT), clamped into the mask; a flip reverses the table,
  padding is -1 (the ignore value). The same tables drive the GPU kernel
  (``dlpack_io.kernels.mask_gather``), so both paths give identical masks.
"""
from __future__ import annotations

import numpy as np

MIN_BOX_SIZE = 1.0  # SanitizeBoundingBoxes' default min_size: smaller boxes are removed


def sample_geometry(params, on_device: bool):
    """(source boxes (N, 4) float64 top/left/height/width, output sizes (N, 2) int64) of
    a batch's ``SampleParams``: the fractional boxes the host resamples from, or the whole
    pixel boxes the GPU kernel reads (``on_device``)."""
    src = params.exact if params.exact is not None and not on_device else params.boxes
    src = np.asarray(src, dtype=np.float64)
    if params.sizes is not None:
        sizes = np.asarray(params.sizes, np.int64)
    else:
        sizes = np.tile(np.asarray(params.out_size, np.int64), (len(src), 1))
    return src, sizes


def map_boxes(boxes: np.ndarray, owner: np.ndarray, src, sizes, flip_h, flip_v) -> np.ndarray:
    """(n, 4) float64 boxes (x0, y0, x1, y1) of a whole batch after their sample's crop /
    resize ``src[owner]`` -> ``sizes[owner]``, clipped to the output and flipped (one
    vectorised pass; ``owner`` is each box's row in the batch)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    top, left, bh, bw = (np.asarray(src, np.float64)[owner, k][:, None] for k in range(4))
    oh = np.asarray(sizes, np.float64)[owner, 0][:, None]
    ow = np.asarray(sizes, np.float64)[owner, 1][:, None]
    x = np.minimum(np.maximum((b[:, 0::2] - left) * (ow / bw), 0.0), ow)
    y = np.minimum(np.maximum((b[:, 1::2] - top) * (oh / bh), 0.0), oh)
    x = np.where(np.asarray(flip_h, bool)[owner][:, None], ow - x[:, ::-1], x)
    y = np.where(np.asarray(flip_v, bool)[owner][:, None], oh - y[:, ::-1], y)
    return np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1)


def kept(mapped: np.ndarray) -> np.ndarray:
    """(n,) bool: boxes at least MIN_BOX_SIZE wide and high (the rest are removed)."""
    return ((mapped[:, 2] - mapped[:, 0]) >= MIN_BOX_SIZE) & \
        ((mapped[:, 3] - mapped[:, 1]) >= MIN_BOX_SIZE)


def nearest_table(start: float, length: float, out_len: int, src_len: int, flip: bool,
                  padded_len: int) -> np.ndarray:
    """(padded_len,) int32: the source index of each output row (or column), -1 past
    ``out_len`` (padding)."""
    centres = start + (np.arange(out_len, dtype=np.float64) + 0.5) * (length / out_len)
    idx = np.clip(np.floor(centres), 0, src_len - 1).astype(np.int32)
    table = np.full(padded_len, -1, dtype=np.int32)
    table[:out_len] = idx[::-1] if flip else idx
    return table


def mask_tables(src, sizes, flip_h, flip_v, heights, widths, out_size):
    """(rows (N, OH), cols (N, OW)) int32 tables of a batch (see :func:`nearest_table`)."""
    n = len(src)
    rows = np.empty((n, out_size[0]), dtype=np.int32)
    cols = np.empty((n, out_size[1]), dtype=np.int32)
    for i in range(n):
        top, left, bh, bw = (float(v) for v in src[i])
        rows[i] = nearest_table(top, bh, int(sizes[i, 0]), int(heights[i]), bool(flip_v[i]),
                                out_size[0])
        cols[i] = nearest_table(left, bw, int(sizes[i, 1]), int(widths[i]), bool(flip_h[i]),
                                out_size[1])
    return rows, cols


def gather_masks(masks, rows: np.ndarray, cols: np.ndarray, fill: int, dtype) -> np.ndarray:
    """(N, OH, OW) masks through their tables on the host (what the kernel computes)."""
    out = np.full((len(masks), rows.shape[1], cols.shape[1]), fill, dtype=dtype)
    for i, mask in enumerate(masks):
        r, c = rows[i], cols[i]
        nr, nc = int(np.count_nonzero(r >= 0)), int(np.count_nonzero(c >= 0))
        # padding (-1) only ever follows the image's rows and columns: a plain slice
        out[i, :nr, :nc] = mask.take(r[:nr], axis=0).take(c[:nc], axis=1)  # 10x fancy
    return out
