"""The boxes of a JSON Lines list row checked one by one before packing (issue 25): a bad
box (boxes.py's rule: non-finite, negative or zero size, outside the image) is left out
with its category and iscrowd, as a bad COCO annotation is (coco.py), and its image is
packed with the other boxes. A row whose targets are not well formed as a whole (boxes
not a list of 4 numbers, categories of another length) is left as it was: its image is
rejected when it is packed, naming the row.
"""
from __future__ import annotations

import numpy as np

from dlpack_io.packer.boxes import as_box_list, box_reason, int_list
from dlpack_io.packer.records import RejectedInput

PER_BOX = (("categories", np.int64), ("iscrowd", np.uint8))


def _header_size(image_path: str, max_pixels: int):
    from dlpack_io.packer.targets import image_header

    try:
        return image_header(image_path, max_pixels)[:2]
    except Exception:  # noqa: BLE001  (an unreadable image is rejected when it is packed)
        return None


def drop_bad_boxes(ann: dict, path: str, image_path: str, max_pixels: int,
                   list_name: str) -> tuple:
    """(``ann`` without its bad boxes, [(rejects.tsv path, reason) of each]) for the
    targets ``ann`` of list row ``path`` (image at ``image_path``, stored size read from
    its header)."""
    try:
        boxes = as_box_list(ann["boxes"], "boxes")
        for name, dtype in PER_BOX:
            if name in ann:
                int_list(ann[name], len(boxes), name, dtype, "")
    except RejectedInput:
        return ann, []
    size = _header_size(image_path, max_pixels) if boxes else None
    if size is None:
        return ann, []
    bad = {k: why for k, b in enumerate(boxes) if (why := box_reason(b, size[0], size[1]))}
    if not bad:
        return ann, []
    keep = [k for k in range(len(boxes)) if k not in bad]
    out = dict(ann, boxes=[boxes[k] for k in keep])
    for name, _ in PER_BOX:
        if name in ann:
            values = list(np.asarray(ann[name]).tolist())
            out[name] = [values[k] for k in keep]
    return out, [(f"{list_name}:{path}:box {k}", f"box {k} of {path}: {why}")
                 for k, why in bad.items()]
