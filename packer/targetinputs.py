"""The targets of a conversion's inputs: a COCO instances file's, a JSON Lines
list's ``"boxes"``/``"categories"``/``"iscrowd"`` keys, and masks (sidecars or
``--masks DIR``), attached to the scanned inputs as one TargetSource (targets.py) whose
field specs join the schema.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np

from dlpack_io.packer.scan import MAX_PATH_CHARS, too_long
from dlpack_io.packer.targets import (BOX_SPEC, CATEGORY_SPEC, ISCROWD_SPEC, TARGET_KEYS,
                                      TargetSource, box_reason, dir_masks, mask_dtype, mask_spec,
                                      sidecar_masks, subset)
from dlpack_io.reader.format.checks import InputTooLarge, NotRegularFile, read_input
from dlpack_io.reader.format.fields import MAX_NAMES
from dlpack_io.reader.format.schema import MAX_JSON_DEPTH

log = logging.getLogger(__name__)


def scan_targets(src, list_file, opts):
    """The Inputs of ``--coco`` (None without it: the caller scans as usual)."""
    if not opts.coco:
        return None
    if list_file:
        raise ValueError("--coco lists the images itself; give --coco or --list, not both")
    from dlpack_io.packer.targetinputs import read_coco

    return read_coco(src, opts.coco, skip_empty=opts.skip_empty, max_pixels=opts.max_pixels)


def _fail_on_rejected(inputs, opts) -> None:
    """``--on-error fail``: stop, before anything is written, at the first annotation
    (COCO) or list box that would be left out of its image."""
    if opts.on_error != "fail" or inputs.targets is None or not inputs.targets.rejected:
        return
    from dlpack_io.packer.records import ConversionError

    path, why = inputs.targets.rejected[0]
    raise ConversionError(f"{os.path.dirname(inputs.list_file)}/{path}: {why} (--on-error "
                          f"fail stops at the first bad annotation; the default, skip, "
                          f"leaves it out and packs its image with the others)")


def list_targets(inputs, max_pixels: int):
    """(inputs with a list's target keys taken out of its fields, their TargetSource), or
    (inputs, None) when the list has no "boxes"."""
    fields = dict(inputs.fields or {})
    if inputs.field_values is None or "boxes" not in fields:
        return inputs, None
    from dlpack_io.packer.targets import drop_bad_boxes

    keys = [k for k in TARGET_KEYS if k in fields]
    specs = {"boxes": BOX_SPEC, "categories": CATEGORY_SPEC, "iscrowd": ISCROWD_SPEC}
    annotations, values, rejected = [], [], []
    list_name = os.path.basename(inputs.list_file or "list")
    for path, v in zip(inputs.paths, inputs.field_values):
        if isinstance(v, str):
            annotations.append(v)
            values.append(v)
            continue
        ann, bad = drop_bad_boxes({k: v[k] for k in keys}, path,
                                  os.path.join(inputs.root, path), max_pixels, list_name)
        annotations.append(dict(ann, where=f"{path}: "))
        rejected += bad
        values.append({k: x for k, x in v.items() if k not in keys})
    for k in keys:
        fields.pop(k)
    source = TargetSource({k: specs[k] for k in keys}, annotations, None, max_pixels,
                          rejected=rejected)
    return dataclasses.replace(inputs, fields=fields, field_values=values), source


def _masks(inputs, opts):
    """(inputs, mask path per input or None, the mask spec or None)."""
    if opts.masks:
        masks = dir_masks(inputs, opts.masks)
    else:
        inputs, masks = sidecar_masks(inputs)
    if masks is None:
        return inputs, None, None
    first = next((p for p in masks if os.path.isfile(p)), None)
    if first is None:
        raise FileNotFoundError(f"--masks {opts.masks}: no mask found for any image (for "
                                f"SRC/a/x.jpg the mask is {os.path.join(opts.masks, 'a/x.png')})")
    return inputs, masks, mask_spec(mask_dtype(first))


def with_targets(inputs, opts):
    """``inputs`` with their targets attached (``inputs.targets``) and their specs in the
    field schema; unchanged when there are none."""
    inputs, masks, spec = _masks(inputs, opts)
    targets = inputs.targets
    if targets is None:
        inputs, targets = list_targets(inputs, opts.max_pixels)
    if targets is None and masks is None:
        return inputs
    if opts.size is not None or opts.max_side is not None:
        raise ValueError(f"{inputs.list_file or inputs.root}: boxes and masks are kept in the "
                         f"pixels of the image as it is stored, and --size / --max-side would "
                         f"resize the image without them; convert without those options "
                         f"(the Loader's Resize and crops move boxes and masks with the image)")
    targets = targets or TargetSource({}, None, None, opts.max_pixels)
    schema = dict(targets.schema)
    if masks is not None:
        schema["mask"] = spec
    targets = dataclasses.replace(targets, schema=schema, masks=masks)
    inputs = dataclasses.replace(inputs, targets=targets,
                                 fields=dict(inputs.fields or {}, **schema))
    _fail_on_rejected(inputs, opts)
    if targets.rejected:  # said only once --on-error fail has not stopped the run
        log.warning("%s: %d annotations rejected (listed in rejects.tsv); their images are "
                    "packed with the other annotations", inputs.list_file or inputs.root,
                    len(targets.rejected))
    if opts.skip_empty and not opts.coco and targets.annotations is not None:
        keep = [k for k, a in enumerate(targets.annotations)
                if not isinstance(a, dict) or not isinstance(a["boxes"], list) or a["boxes"]]
        log.info("--skip-empty: %d inputs without boxes left out", len(inputs.paths) - len(keep))
        inputs = subset(inputs, keep)
    return inputs


# ---- COCO instances files --------------------------------------------------------------------
# ``dlpack convert SRC DST --coco instances.json``: the inputs of a COCO object-detection
# file (issue 25). Every image of ``images`` is an input, found under SRC by its
# ``file_name``; its annotations become the fields "boxes" (COCO's x, y, w, h made
# x0, y0, x1, y1), "categories" (``category_id``; the id -> name table goes into the
# field's spec, ``"names"``), "iscrowd" and "image_id" (checked per image in targets.py).
#
# The file comes from the wild and can be large (instances_train2017.json is 448 MB): it is
# read only below MAX_COCO_BYTES, its nesting depth is measured before it is parsed, and
# every id, name and number is checked. An image entry that cannot be an input (no usable
# ``file_name``, a repeated id or file name) and an annotation of no image in the file are
# rejects naming the file and the entry. An annotation that is not well formed, names a
# category the file does not have, or whose box is bad (targets.py: non-finite, negative or
# zero size, outside the image) is rejected alone, naming its id, its image and the
# reason: the image is packed with its other annotations, as torchvision's detection
# references keep it. Boxes are checked against the file's ``width``/``height`` of the
# image (its header when the file gives none) here, before packing, so ``--on-error fail``
# stops before anything is written.
# Images without annotations are packed with no box (N = 0) unless ``skip_empty``.

SAFE_RECURSION_LIMIT = 10_000  # C stack the JSON decoder may use before a RecursionError
MAX_COCO_BYTES = 4 * 2**30  # a COCO file is parsed whole; 4 GiB is 9x COCO train2017's
_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]], _STEP[[ord("]"), ord("}")]] = 1, -1
_CHUNK = 8 * 2**20


def _backslashes_before(a: np.ndarray, carry: int) -> np.ndarray:
    """For each byte of ``a``, how many backslashes directly precede it (``carry``: the
    run at the end of the previous chunk)."""
    idx = np.arange(len(a), dtype=np.int64)
    last = np.maximum.accumulate(np.where(a != 92, idx, -1))  # last non-backslash <= i
    run = np.empty(len(a), dtype=np.int64)
    run[0] = carry
    run[1:] = idx[:-1] - last[:-1] + np.where(last[:-1] < 0, carry, 0)
    return run


def json_depth_large(data: bytes) -> int:
    """How deep the brackets of JSON text ``data`` nest, brackets inside strings left
    out, in 8 MB chunks with numpy (a 448 MB COCO file in seconds, without recursion)."""
    depth = top = 0
    in_string, run = 0, 0
    for start in range(0, len(data), _CHUNK):
        a = np.frombuffer(data, np.uint8, min(_CHUNK, len(data) - start), start)
        before = _backslashes_before(a, run)
        quotes = ((a == 34) & (before % 2 == 0)).astype(np.int64)  # unescaped quotes
        inside = (in_string + np.cumsum(quotes) - quotes) % 2  # in a string before byte i
        steps = np.cumsum(np.where(inside == 0, _STEP[a], 0), dtype=np.int64) + depth
        top, depth = max(top, int(steps.max())), int(steps[-1])
        in_string = (in_string + int(quotes.sum())) % 2
        run = int(before[-1]) + 1 if a[-1] == 92 else 0
    return top


def load_coco(path) -> dict:
    """The parsed COCO file at ``path``; ValueError naming it and what is wrong."""
    try:
        data = read_input(path, MAX_COCO_BYTES)  # a FIFO or a device: refused, unread
    except InputTooLarge as exc:
        raise ValueError(f"--coco {path}: {exc.strerror}; split the file or convert from a "
                         f"JSON Lines list") from None
    except NotRegularFile as exc:
        raise ValueError(f"--coco {path}: {exc.strerror}; give the annotation file itself")\
            from None
    # Python's JSON decoder stops at the recursion limit with a RecursionError; only where
    # something raised that limit high could deep nesting overflow the C stack, so only
    # then is the depth measured first (it costs about as much as the parse itself)
    if sys.getrecursionlimit() > SAFE_RECURSION_LIMIT:
        depth = json_depth_large(data)
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"--coco {path}: JSON nested {depth} levels, at most "
                             f"{MAX_JSON_DEPTH}: not a COCO file")
    try:
        obj = json.loads(data)
    except RecursionError:
        raise ValueError(f"--coco {path}: JSON nested deeper than Python's recursion limit "
                         f"({sys.getrecursionlimit()}): not a COCO file") from None
    except ValueError as exc:
        raise ValueError(f"--coco {path}: not valid JSON ({str(exc)[:120]})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("images"), list) \
            or not isinstance(obj.get("annotations", []), list) \
            or not isinstance(obj.get("categories", []), list):
        raise ValueError(f"--coco {path}: expected an object with lists \"images\", "
                         f"\"annotations\" and \"categories\" (COCO's instances_*.json)")
    return obj


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63


def category_names(cats: list, path) -> dict:
    """str(id) -> name of COCO's ``categories``; ValueError naming a bad entry."""
    if len(cats) > MAX_NAMES:  # the field spec's name table is bounded: readers refuse more
        raise ValueError(f"--coco {path}: {len(cats)} categories, at most {MAX_NAMES} fit "
                         f"the categories field's name table; not a COCO file")
    names = {}
    for k, c in enumerate(cats):
        if not isinstance(c, dict) or not _int(c.get("id")) or str(c["id"]) in names \
                or not isinstance(c.get("name"), str) or len(c["name"]) > 256:
            raise ValueError(f"--coco {path}: categories[{k}] {str(c)[:80]}: expected a "
                             f"unique integer \"id\" and a \"name\" of at most 256 characters")
        names[str(c["id"])] = c["name"]
    return names


def _image_problem(img, ids: dict, names: set) -> str | None:
    if not isinstance(img, dict) or not _int(img.get("id")):
        return "no integer \"id\""
    name = img.get("file_name")
    if not isinstance(name, str) or not name or "\0" in name:
        return f"image {img['id']}: \"file_name\" {str(name)[:60]!r} is not a file name"
    if len(name) > MAX_PATH_CHARS:
        return f"image {img['id']}: {too_long(name, 'a file_name', MAX_PATH_CHARS)}"
    if os.path.isabs(name) or ".." in Path(name).parts:
        return f"image {img['id']}: file_name {name[:80]!r} must be relative to SRC and stay in it"
    if img["id"] in ids:
        return f"image {img['id']}: the id is repeated"
    if Path(name).as_posix() in names:
        return f"image {img['id']}: file_name {name[:80]!r} is repeated"
    w, h = img.get("width"), img.get("height")
    if (w is not None or h is not None) and not (_int(w) and _int(h) and w > 0 and h > 0):
        return f"image {img['id']}: width, height {str(w)[:20]}, {str(h)[:20]}: expected " \
               f"positive integers"
    return None


def _annotation_problem(a: dict, cat_ids: set, size) -> str | None:
    # type() rather than isinstance: a bool is not a number here, and this runs 10^6 times
    cat = a.get("category_id")
    if type(cat) is not int or cat not in cat_ids:
        return (f"category_id {str(cat)[:30]} is not one of the file's categories"
                if type(cat) is int else f"category_id {str(cat)[:30]} is not an integer")
    box = a.get("bbox")
    if type(box) is not list or len(box) != 4 or not all(type(v) in (int, float) for v in box):
        return f"bbox {str(box)[:60]} is not 4 numbers (x, y, width, height)"
    if any(type(v) is int and not -2**53 <= v <= 2**53 for v in box):  # beyond a float
        return f"bbox {str(box)[:60]} holds an integer beyond 2^53 pixels"
    crowd = a.get("iscrowd", 0)
    if type(crowd) is not int or crowd not in (0, 1):
        return f"iscrowd {str(crowd)[:20]}, expected 0 or 1"
    return box_reason(box, size[0], size[1], xywh=True) if size is not None else None


def stored_size(root: Path, entry: dict, max_pixels: int):
    """(width, height) the annotations of image ``entry`` are checked against: the
    file's own ``width``/``height``, else the image's header (None when unreadable: the
    image is then a reject when it is packed)."""
    if entry.get("size") is not None:
        return entry["size"]
    from dlpack_io.packer.targets import image_header

    try:
        return image_header(str(root / entry["name"]), max_pixels)[:2]
    except Exception:  # noqa: BLE001  (any unreadable image: its reject comes when packing)
        return None


def _attach(anns: list, by_id: dict, per_image: list, cats: dict, out: tuple) -> None:
    """Each annotation onto its image's entry; ``out`` = (orphans: annotations of no
    image, rejected: (path, reason) of the bad annotations of an image, which is kept)."""
    orphans, rejected, file_name = out
    cat_ids = {int(k) for k in cats}
    for k, a in enumerate(anns):
        if not isinstance(a, dict) or not _int(a.get("id")) or not _int(a.get("image_id")):
            orphans.append((f"annotations[{k}]", "expected an object with integer \"id\" "
                                                 "and \"image_id\""))
            continue
        i = by_id.get(a["image_id"])
        if i is None:
            orphans.append((f"annotation {a['id']}", f"annotation {a['id']}: image_id "
                            f"{a['image_id']} is not an image of the file"))
            continue
        entry = per_image[i]
        why = _annotation_problem(a, cat_ids, entry["checked_size"])
        if why:
            rejected.append((f"{file_name}:annotation {a['id']}",
                             f"annotation {a['id']} of image {a['image_id']} "
                             f"({entry['name']}): {why}"))
            continue
        entry["boxes"].append(a["bbox"])
        entry["ids"].append(a["id"])
        entry["categories"].append(a["category_id"])
        entry["iscrowd"].append(a.get("iscrowd", 0))


def _image_entries(images: list, coco_file: Path) -> tuple:
    """(paths, per-image entries or reject texts, image id -> input number, rejects by
    input number) of COCO's ``images``."""
    paths, per_image, by_id, seen_names, bad = [], [], {}, set(), {}
    for k, img in enumerate(images):
        why = _image_problem(img, by_id, seen_names)
        if why:
            bad[len(paths)] = f"{coco_file}: images[{k}]: {why}"
            paths.append(f"{coco_file.name}:images[{k}]")
            per_image.append(bad[len(paths) - 1])
            continue
        by_id[img["id"]] = len(paths)
        name = Path(img["file_name"]).as_posix()
        seen_names.add(name)
        paths.append(name)
        size = (img["width"], img["height"]) if img.get("width") is not None else None
        per_image.append({"boxes": [], "ids": [], "categories": [], "iscrowd": [],
                          "image_id": img["id"], "xywh": True, "size": size, "name": name})
    return paths, per_image, by_id, bad


def read_coco(root, coco_file, *, skip_empty: bool = False, max_pixels: int = 0):
    """The Inputs of a COCO file (paths relative to ``root``), targets attached; the
    annotations rejected alone are ``targets.rejected``."""
    from dlpack_io.packer.scan import Inputs

    root, coco_file = Path(root), Path(coco_file)
    obj = load_coco(coco_file)
    cats = category_names(obj.get("categories", []), coco_file)
    paths, per_image, by_id, bad = _image_entries(obj["images"], coco_file)
    by_image = {a["image_id"] for a in obj.get("annotations", [])
                if isinstance(a, dict) and _int(a.get("image_id"))}
    for entry in per_image:  # a header is read only for an annotated image of no size
        if isinstance(entry, dict):
            entry["checked_size"] = stored_size(root, entry, max_pixels) \
                if entry["image_id"] in by_image else None
    orphans, rejected = [], []
    _attach(obj.get("annotations", []), by_id, per_image, cats,
            (orphans, rejected, coco_file.name))
    for where, why in orphans:
        bad[len(paths)] = f"{coco_file}: {why}"
        paths.append(f"{coco_file.name}:{where}")
        per_image.append(bad[len(paths) - 1])
    if skip_empty:
        keep = [k for k, a in enumerate(per_image) if isinstance(a, str) or a["boxes"]]
        log.info("--skip-empty: %d images without annotations left out", len(paths) - len(keep))
        bad = {new: bad[old] for new, old in enumerate(keep) if old in bad}
        paths, per_image = [paths[k] for k in keep], [per_image[k] for k in keep]
    if not paths:
        raise ValueError(f"--coco {coco_file}: no images to pack")
    schema = {"boxes": BOX_SPEC, "categories": dict(CATEGORY_SPEC, names=cats),
              "image_id": {"type": "int"}, "iscrowd": ISCROWD_SPEC}
    for entry in per_image:
        if isinstance(entry, dict):
            del entry["name"], entry["checked_size"]
    targets = TargetSource(schema, per_image, None, max_pixels, rejected=rejected)
    return Inputs(str(root.resolve()), paths, [-1] * len(paths), [], str(coco_file.resolve()),
                  bad=bad or None, targets=targets)
