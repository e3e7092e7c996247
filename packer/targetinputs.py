"""The targets of a conversion's inputs (issue 25): COCO's (coco.py), a JSON Lines
list's ``"boxes"``/``"categories"``/``"iscrowd"`` keys, and masks (sidecars or
``--masks DIR``), attached to the scanned inputs as one TargetSource (targets.py) whose
field specs join the schema."""
from __future__ import annotations

import dataclasses
import logging
import os

from dlpack_io.packer.targets import (BOX_SPEC, CATEGORY_SPEC, ISCROWD_SPEC, TARGET_KEYS,
                                      TargetSource, dir_masks, mask_dtype, mask_spec,
                                      sidecar_masks, subset)

log = logging.getLogger(__name__)


def scan_targets(src, list_file, opts):
    """The Inputs of ``--coco`` (None without it: the caller scans as usual)."""
    if not opts.coco:
        return None
    if list_file:
        raise ValueError("--coco lists the images itself; give --coco or --list, not both")
    from dlpack_io.packer.coco import read_coco

    return read_coco(src, opts.coco, skip_empty=opts.skip_empty, max_pixels=opts.max_pixels)


def _fail_on_rejected(inputs, opts) -> None:
    """``--on-error fail``: stop, before anything is written, at the first annotation
    (COCO) or list box that would be left out of its image."""
    if opts.on_error != "fail" or inputs.targets is None or not inputs.targets.rejected:
        return
    from dlpack_io.packer.pipeline import ConversionError

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
    from dlpack_io.packer.listboxes import drop_bad_boxes

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
