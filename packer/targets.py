"""Detection and segmentation targets of a conversion: boxes, categories,
iscrowd and image id (from COCO or a JSON Lines list) and semantic masks (a sidecar
``name.mask.png`` beside ``name.jpg``, or ``--masks DIR`` mirroring SRC), made into
fields of each record.

``TargetSource.fields(i, image_path)`` runs in the packer's parent beside the other
fields: it reads the image's header (its stored size and EXIF orientation; no pixel is
decoded), checks every box against that size and reads the mask, then turns boxes and
mask upright like the image. Any problem is a RejectedInput naming the
annotation or the file, so ``--on-error`` applies as to every reject.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from dlpack_io.packer.encode import exif_orientation, image_bytes, open_image
from dlpack_io.packer.fields import MASK_SUFFIX
from dlpack_io.packer.records import RejectedInput
from dlpack_io.packer.scan import shown
from dlpack_io.reader.format.checks import open_input, read_input

TARGET_KEYS = ("boxes", "categories", "iscrowd")  # what a list line's targets may hold
BOX_SPEC = {"type": "array", "dtype": "float32", "ndim": 2, "shape": None}
CATEGORY_SPEC = {"type": "array", "dtype": "int64", "ndim": 1, "shape": None}
ISCROWD_SPEC = {"type": "array", "dtype": "uint8", "ndim": 1, "shape": None}
_MASK_MODES = {"P": "uint8", "L": "uint8", "1": "uint8", "I;16": "uint16",
               "I;16L": "uint16", "I;16B": "uint16", "I": "uint16"}


def mask_spec(dtype: str) -> dict:
    """The field spec of masks: 2-D, losslessly compressed (reader/format/fields.py)."""
    return {"type": "array", "dtype": dtype, "ndim": 2, "shape": None, "codec": "zlib"}


def image_header(path: str, max_pixels: int) -> tuple:
    """(width, height, EXIF orientation) of the stored image at ``path``."""
    try:
        img = open_image(read_input(path), max_pixels)  # a FIFO or device: refused, unread
    except OSError as exc:
        raise RejectedInput(f"cannot read file: {exc.strerror or exc}") from None
    return img.size[0], img.size[1], exif_orientation(img)


def mask_dtype(path: str) -> str:
    """The dtype a mask PNG's mode stands for (its header only)."""
    from PIL import Image

    fd, _ = open_input(path)
    with open(fd, "rb") as f, Image.open(f) as img:
        return _MASK_MODES.get(img.mode, "uint8")


def read_mask(path: str, size: tuple, dtype: str, max_pixels: int) -> np.ndarray:
    """The H x W label map of the PNG at ``path`` as ``dtype``, for a stored image of
    ``size`` (width, height); RejectedInput naming the file and the reason."""
    try:
        img = open_image(read_input(path), max_pixels)
    except FileNotFoundError:
        raise RejectedInput(f"no mask {path} (other images have one)") from None
    except OSError as exc:
        raise RejectedInput(f"cannot read mask {path}: {exc.strerror or exc}") from None
    except RejectedInput as exc:
        raise RejectedInput(f"mask {path}: {exc}") from None
    if img.mode not in _MASK_MODES:
        raise RejectedInput(f"mask {path} is a {img.mode} image; expected a label map (PNG "
                            f"mode P, L or I;16: one class id per pixel), not colours")
    if img.size != tuple(size):
        raise RejectedInput(f"mask {path} is {img.size[0]}x{img.size[1]}, its image is "
                            f"{size[0]}x{size[1]} (width x height, as stored)")
    try:
        arr = np.asarray(img)
    except Exception as exc:  # truncated or corrupt PNG data
        raise RejectedInput(f"cannot decode mask {path}: {exc}") from None
    arr = arr.astype(np.uint8) if arr.dtype == bool else arr
    top = np.iinfo(dtype).max
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > top):
        raise RejectedInput(f"mask {path} holds class ids {int(arr.min())}..{int(arr.max())}, "
                            f"the masks of this data set are {dtype} (0..{top}; the first "
                            f"mask found decides)")
    return arr.astype(dtype)


@dataclasses.dataclass
class TargetSource:
    """Targets of every input: ``annotations[i]`` (None, a reject reason, or a dict of
    raw "boxes" with their "ids", "categories", "iscrowd", "image_id", "xywh", "size")
    and ``masks[i]`` (the mask file of input i, or None); ``rejected``: (path, reason) of
    each annotation left out of a kept image (targetinputs.py), lines of rejects.tsv."""

    schema: dict
    annotations: list | None = None
    masks: list | None = None
    max_pixels: int = 0
    rejected: list = dataclasses.field(default_factory=list)

    def fields(self, i: int, image_path: str) -> dict:
        """The target fields of input ``i`` (image at ``image_path``), checked and upright."""
        ann = self.annotations[i] if self.annotations is not None else None
        if isinstance(ann, str):
            raise RejectedInput(ann)
        width, height, orientation = image_header(image_path, self.max_pixels)
        out = {}
        if ann is not None:
            out = _boxes_fields(ann, width, height, orientation)
        if self.masks is not None:
            mask = read_mask(self.masks[i], (width, height), self.schema["mask"]["dtype"],
                             self.max_pixels)
            out["mask"] = orient_mask(mask, orientation)
        return {k: v for k, v in out.items() if k in self.schema}


def _boxes_fields(ann: dict, width: int, height: int, orientation: int) -> dict:
    size = ann.get("size")
    if size is not None and tuple(size) not in ((width, height), (height, width)):
        raise RejectedInput(f"the annotations say the image is {size[0]}x{size[1]}, the "
                            f"file is {width}x{height} (width x height)")
    where = ann.get("where", "")
    boxes = as_box_list(ann["boxes"], f"{where}boxes")
    n = len(boxes)
    out = {k: int_list(ann[k], n, k, dtype, where.rstrip(": ")) for k, dtype in
           (("categories", np.int64), ("iscrowd", np.uint8)) if k in ann}
    xyxy = checked_boxes(boxes, ann.get("ids"), width, height, ann.get("xywh", False))
    out["boxes"] = orient_boxes(xyxy, orientation, width, height)
    if ann.get("image_id") is not None:
        out["image_id"] = int(ann["image_id"])
    return out


def sidecar_masks(inputs) -> tuple:
    """(inputs without the ``x.mask.png`` files that are masks of an input ``x.*``, mask
    paths per input or None when no input has a sidecar mask). A folder scan that saw no
    file named ``*.mask.png`` answers None without a system call per input."""
    if getattr(inputs, "mask_files", None) == 0:
        return inputs, None
    stems = {os.path.splitext(p)[0] for p in inputs.paths}
    keep = [k for k, p in enumerate(inputs.paths)
            if not (p.endswith(MASK_SUFFIX) and p[:-len(MASK_SUFFIX)] in stems)]
    paths = [os.path.join(inputs.root, os.path.splitext(inputs.paths[k])[0] + MASK_SUFFIX)
             for k in keep]
    if not any(os.path.isfile(p) for p in paths):
        return inputs, None
    return subset(inputs, keep), paths


def dir_masks(inputs, masks_dir: str) -> list:
    """The mask of each input under ``masks_dir``: the same relative path, suffix .png."""
    if not os.path.isdir(masks_dir):
        raise FileNotFoundError(f"--masks {masks_dir}: not a folder; expected a tree "
                                f"mirroring SRC with one PNG label map per image")
    return [os.path.join(masks_dir, os.path.splitext(p)[0] + ".png") for p in inputs.paths]


def subset(inputs, keep: list):
    """``inputs`` restricted to the input numbers ``keep`` (in that order)."""
    if len(keep) == len(inputs.paths):
        return inputs
    remap = {old: new for new, old in enumerate(keep)}
    pick = (lambda xs: None if xs is None else [xs[k] for k in keep])
    bad = {remap[k]: v for k, v in (inputs.bad or {}).items() if k in remap} or None
    targets = getattr(inputs, "targets", None)
    if targets is not None:
        targets = dataclasses.replace(targets, annotations=pick(targets.annotations),
                                      masks=pick(targets.masks))
    return dataclasses.replace(inputs, paths=pick(inputs.paths), labels=pick(inputs.labels),
                               field_values=pick(inputs.field_values), bad=bad,
                               targets=targets)


def writer_targets(image, fields: dict, where: str, max_pixels: int) -> tuple:
    """(``Writer.write``'s fields, whether "mask" is a segmentation mask): "boxes" (+
    "categories", "iscrowd") checked against the image and turned upright with it, as
    ``dlpack convert`` does, and so is a 2-D uint8/uint16 "mask" of the image's stored
    size (a "mask" of another shape stays an ordinary array field); ValueError naming the
    sample and the reason."""
    if "boxes" not in fields and "mask" not in fields:
        return fields, False
    out, seg = dict(fields), False
    try:
        img = open_image(image_bytes(image, where)[0], max_pixels)
        (width, height), orientation = img.size, exif_orientation(img)
        if "boxes" in fields:
            ann = {k: fields[k] for k in TARGET_KEYS if k in fields}
            out.update(_boxes_fields(dict(ann, where=""), width, height, orientation))
        mask = fields.get("mask")
        mask = np.asarray(mask) if hasattr(mask, "mode") and hasattr(mask, "size") else mask
        if isinstance(mask, np.ndarray) and mask.shape == (height, width) \
                and mask.dtype.name in ("uint8", "uint16"):
            out["mask"], seg = orient_mask(mask, orientation), True
    except RejectedInput as exc:
        raise ValueError(f"{where}: {str(exc).lstrip(': ')}") from None
    return out, seg


def annotation_rejects(inputs) -> list:
    """(path, reason) of the annotations left out of the images of ``inputs`` (none
    without targets): written to rejects.tsv after the rejected inputs."""
    targets = getattr(inputs, "targets", None)
    return [(shown(p), shown(r)) for p, r in (targets.rejected if targets else [])]


def check_later_mask(schema: dict, fields: dict, seg: bool, where: str) -> None:
    """A Writer's later sample: when the first sample's "mask" made it a segmentation mask
    (compressed, its image's size: readers refuse any other shape), this one's must be one
    too; ValueError naming the sample and both sizes otherwise."""
    spec = schema.get("mask")
    if spec is None or not spec.get("codec") or seg or "mask" not in fields:
        return
    shape = getattr(np.asarray(fields["mask"]), "shape", None)
    raise ValueError(f"{where}: field 'mask' of shape {shape} is not a 2-D uint8/uint16 label "
                     f"map of this sample's image size, but the first sample's mask made "
                     f"'mask' a segmentation mask; give every sample a mask of its image's "
                     f"size (or name other arrays differently)")


def target_schema(schema: dict, seg: bool) -> dict:
    """A Writer's first schema with the targets' specs: per-sample box and category
    arrays (never stacked), segmentation masks (``seg``) compressed."""
    for name in ("boxes", "categories", "iscrowd"):
        if name in schema and schema[name]["type"] == "array":
            schema[name]["shape"] = None
    if seg:
        schema["mask"] = mask_spec(schema["mask"]["dtype"])
    return schema



# ---- boxes: the rule every box passes --------------------------------------------------------
# Boxes and masks of a sample checked and turned upright like its image (issue 25).
#
# Every source of targets (COCO, a JSON Lines list, the Writer, mask files) ends here, so
# they are all checked the same way. Boxes come in the pixels of the image *as stored*
# (before its EXIF orientation), like the image's own pixels; they leave as float32
# [N, 4] ``x0, y0, x1, y1`` in the pixels of the upright image (what the reader decodes),
# moved by exactly the transpose ``ImageOps.exif_transpose`` applies to the image. Masks
# (H x W label maps of the stored size) get the same transpose.
#
# A box with a non-finite number, a negative width or height, or a corner outside the
# image (beyond BOX_TOLERANCE pixels, which are clipped: float noise of tools that wrote
# ``x + w`` = 640.0000001), or zero width or height once clipped, is a reject naming the
# annotation and the reason. A COCO annotation or a JSON Lines box is rejected alone,
# before packing (targetinputs.py: the image is packed with its other boxes, as
# torchvision's detection references keep it); a Writer call raises ValueError.
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



# ---- boxes of a JSON Lines list --------------------------------------------------------------
# The boxes of a JSON Lines list row checked one by one before packing: a bad
# box (the rule above: non-finite, negative or zero size, outside the image) is left out
# with its category and iscrowd, as a bad COCO annotation is (targetinputs.py), and its image is
# packed with the other boxes. A row whose targets are not well formed as a whole (boxes
# not a list of 4 numbers, categories of another length) is left as it was: its image is
# rejected when it is packed, naming the row.
PER_BOX = (("categories", np.int64), ("iscrowd", np.uint8))


def _header_size(image_path: str, max_pixels: int):
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
