"""Boxes and masks of a sample checked and turned upright like its image (issue 25).

Every source of targets (COCO, a JSON Lines list, the Writer, mask files) ends here, so
they are all checked the same way. Boxes come in the pixels of the image *as stored*
(before its EXIF orientation), like the image's own pixels; they leave as float32
[N, 4] ``x0, y0, x1, y1`` in the pixels of the upright image (what the reader decodes),
moved by exactly the transpose ``ImageOps.exif_transpose`` applies to the image. Masks
(H x W label maps of the stored size) get the same transpose.

A box with a non-finite number, a negative width or height, or a corner outside the
image (beyond BOX_TOLERANCE pixels, which are clipped: float noise of tools that wrote
``x + w`` = 640.0000001), or zero width or height once clipped, is a reject naming the
annotation and the reason. A COCO annotation or a JSON Lines box is rejected alone,
before packing (coco.py, listboxes.py: the image is packed with its other boxes, as
torchvision's detection references keep it); a Writer call raises ValueError.
"""
from __future__ import annotations

import math

import numpy as np

from dlpack_io.packer.records import RejectedInput

BOX_TOLERANCE = 0.01  # pixels a box may stick out of the image (clipped to it)
MAX_BOXES = 100_000   # per image (LVIS, Objects365 have at most a few hundred)


def _fmt(values) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def box_reason(box, width: int, height: int, xywh: bool = False) -> str | None:
    """Why ``box`` (x0, y0, x1, y1; or COCO's x, y, w, h) cannot be packed for a
    ``width`` x ``height`` image, or None when it can. Runs once per COCO annotation
    (10^6 in train2017): the text is made only for a bad box."""
    if not all(math.isfinite(v) for v in box):
        return f"box {_shown(box, xywh)} has a non-finite number"
    x0, y0, a, b = box
    w, h = (a, b) if xywh else (a - x0, b - y0)
    if w < 0 or h < 0:
        return f"box {_shown(box, xywh)} has a negative {'width' if w < 0 else 'height'}"
    x1, y1 = x0 + w, y0 + h
    t = BOX_TOLERANCE
    if x0 < -t or y0 < -t or x1 > width + t or y1 > height + t:
        return f"box {_shown(box, xywh)} lies outside the {width}x{height} image (width x height)"
    # what clipping to the image leaves: torchvision's detection references drop a box
    # whose x1 <= x0 or y1 <= y0 after clamping; it holds no pixel to learn from
    if min(x1, width) <= max(x0, 0) or min(y1, height) <= max(y0, 0):
        zero = "width" if min(x1, width) <= max(x0, 0) else "height"
        return f"box {_shown(box, xywh)} has zero {zero} (clipped to the {width}x{height} image)"
    return None


def _shown(box, xywh: bool) -> str:
    return _fmt(box) + (" (x, y, w, h)" if xywh else " (x0, y0, x1, y1)")


def as_box_list(value, where: str) -> list:
    """A list of 4-number boxes from a list of lists or an [N, 4] array; RejectedInput
    naming ``where`` for anything else."""
    arr = value if isinstance(value, np.ndarray) else None
    if arr is None:
        if not isinstance(value, (list, tuple)) or len(value) > MAX_BOXES or any(
                not isinstance(b, (list, tuple)) or len(b) != 4 or any(
                    isinstance(v, bool) or not isinstance(v, (int, float)) for v in b)
                for b in value):
            raise RejectedInput(f"{where}: expected a list of [x0, y0, x1, y1] boxes (4 "
                                f"numbers each, at most {MAX_BOXES}), found {str(value)[:60]}")
        try:
            return [[float(v) for v in b] for b in value]
        except OverflowError:  # an integer of hundreds of digits (JSON allows it)
            raise RejectedInput(f"{where}: a box holds an integer too large for a float "
                                f"({str(value)[:60]})") from None
    if arr.ndim != 2 or arr.shape[1] != 4 or arr.shape[0] > MAX_BOXES or arr.dtype.kind not in "iuf":
        raise RejectedInput(f"{where}: expected an [N, 4] number array, found {arr.dtype} "
                            f"{arr.shape}")
    return arr.astype(np.float64).tolist()


def checked_boxes(boxes: list, ids, width: int, height: int, xywh: bool = False) -> np.ndarray:
    """float64 [N, 4] x0, y0, x1, y1 of ``boxes`` (stored-image pixels), clipped to the
    image; RejectedInput naming the first bad one (its annotation id when ``ids``)."""
    out = np.zeros((len(boxes), 4), dtype=np.float64)
    for k, box in enumerate(boxes):
        why = box_reason(box, width, height, xywh)
        if why:
            name = f"annotation {ids[k]}" if ids is not None else f"box {k}"
            raise RejectedInput(f"{name}: {why}")
        x0, y0, a, b = box
        out[k] = (x0, y0, x0 + a, y0 + b) if xywh else box
    np.clip(out[:, 0::2], 0, width, out=out[:, 0::2])
    np.clip(out[:, 1::2], 0, height, out=out[:, 1::2])
    return out


def orient_boxes(boxes: np.ndarray, orientation: int, width: int, height: int) -> np.ndarray:
    """float32 [N, 4] ``boxes`` of a ``width`` x ``height`` stored image, moved as
    ``exif_transpose`` moves its pixels for EXIF ``orientation`` (1..8)."""
    x0, y0, x1, y1 = (boxes[:, k] for k in range(4))
    W, H = width, height
    mapped = {  # the upright image's (x0, x1, y0, y1) of each orientation
        1: (x0, x1, y0, y1), 2: (W - x1, W - x0, y0, y1), 3: (W - x1, W - x0, H - y1, H - y0),
        4: (x0, x1, H - y1, H - y0), 5: (y0, y1, x0, x1), 6: (H - y1, H - y0, x0, x1),
        7: (H - y1, H - y0, W - x1, W - x0), 8: (y0, y1, W - x1, W - x0),
    }[orientation if 1 <= orientation <= 8 else 1]
    a0, a1, b0, b1 = mapped
    return np.stack([a0, b0, a1, b1], axis=1).astype(np.float32).reshape(-1, 4)


def orient_mask(mask: np.ndarray, orientation: int) -> np.ndarray:
    """An H x W ``mask`` of the stored image turned as ``exif_transpose`` turns it."""
    ops = {1: lambda m: m, 2: lambda m: m[:, ::-1], 3: lambda m: m[::-1, ::-1],
           4: lambda m: m[::-1], 5: lambda m: m.T, 6: lambda m: m.T[:, ::-1],
           7: lambda m: m[::-1, ::-1].T, 8: lambda m: m.T[::-1]}
    return np.ascontiguousarray(ops[orientation if 1 <= orientation <= 8 else 1](mask))


def int_list(value, n: int, name: str, dtype, where: str) -> np.ndarray:
    """``value`` (a list or 1-D array of ``n`` integers) as a ``dtype`` array."""
    info = np.iinfo(dtype)
    arr = np.asarray(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if arr is not None and arr.size == 0:
        arr = arr.reshape(0).astype(np.int64)
    if arr is None or arr.ndim != 1 or len(arr) != n or arr.dtype.kind not in "iu" or (
            n and (int(arr.min()) < info.min or int(arr.max()) > info.max)):
        raise RejectedInput(f"{where}: {name} {str(value)[:60]}: expected {n} integers "
                            f"{info.min}..{info.max}, one per box")
    return arr.astype(dtype)
