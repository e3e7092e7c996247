"""Detection and segmentation targets of a conversion (issue 25): boxes, categories,
iscrowd and image id (from COCO or a JSON Lines list) and semantic masks (a sidecar
``name.mask.png`` beside ``name.jpg``, or ``--masks DIR`` mirroring SRC), made into
fields of each record.

``TargetSource.fields(i, image_path)`` runs in the packer's parent beside the other
fields: it reads the image's header (its stored size and EXIF orientation; no pixel is
decoded), checks every box against that size and reads the mask, then turns boxes and
mask upright like the image (boxes.py). Any problem is a RejectedInput naming the
annotation or the file, so ``--on-error`` applies as to every reject.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from dlpack_io.packer.boxes import (as_box_list, checked_boxes, int_list, orient_boxes,
                                    orient_mask)
from dlpack_io.packer.pilimage import exif_orientation, open_image
from dlpack_io.packer.records import RejectedInput
from dlpack_io.packer.fieldsource import MASK_SUFFIX
from dlpack_io.reader.format.regular import open_input, read_input

TARGET_KEYS = ("boxes", "categories", "iscrowd")  # what a list line's targets may hold
BOX_SPEC = {"type": "array", "dtype": "float32", "ndim": 2, "shape": None}
CATEGORY_SPEC = {"type": "array", "dtype": "int64", "ndim": 1, "shape": None}
ISCROWD_SPEC = {"type": "array", "dtype": "uint8", "ndim": 1, "shape": None}
_MASK_MODES = {"P": "uint8", "L": "uint8", "1": "uint8", "I;16": "uint16",
               "I;16L": "uint16", "I;16B": "uint16", "I": "uint16"}


def mask_spec(dtype: str) -> dict:
    """The field spec of masks: 2-D, losslessly compressed (reader/format/arraycodec.py)."""
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
    each annotation left out of a kept image (coco.py), lines of rejects.tsv."""

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
    from dlpack_io.packer.samples import image_bytes

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
    from dlpack_io.packer.names import shown

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
