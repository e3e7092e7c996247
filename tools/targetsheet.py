"""Boxes and masks on the contact sheet (issue 25): ``dlpack inspect DST --grid FILE``
draws each sample's boxes (with their category names) and overlays its mask;
``--augmented`` draws what a Loader yields after its transforms, so a person sees that the
boxes and masks still sit on their objects.

A box is drawn in its category's colour (a fixed colour per id), 2 pixels wide, inside
its rectangle scaled to the thumbnail; the name (or the id when the data set has no
names table) is written on it. Mask labels other than 0 (background) are blended over
the image at MASK_ALPHA in their label's colour; 255 (the "ignore" value of VOC and of
padded batches) in white.
"""
from __future__ import annotations

import os

import numpy as np
from dlpack_io.reader import Output

MASK_ALPHA = 0.45
IGNORE = 255
TARGET_FIELDS = ("boxes", "categories", "mask")


def colour(k: int) -> tuple:
    """A saturated RGB colour for id ``k``, the same in every sheet (golden-ratio hues)."""
    import colorsys

    r, g, b = colorsys.hsv_to_rgb((int(k) * 0.618033988749895) % 1.0, 0.85, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def has_targets(fields: dict) -> bool:
    """True when a data set's field schema has boxes or a mask to draw."""
    return "boxes" in fields or "mask" in fields


def overlay_mask(thumb, mask: np.ndarray):
    """``thumb`` (a PIL RGB image) with ``mask`` (H x W labels of the full image) blended
    over it, resized with nearest neighbour to the thumbnail."""
    from PIL import Image

    mask = np.asarray(mask)
    small = np.asarray(Image.fromarray(mask.astype(np.int32)).resize(thumb.size, Image.NEAREST))
    labels = np.unique(small)
    lut = {int(v): (255, 255, 255) if v == IGNORE else colour(int(v)) for v in labels if v}
    if not lut:
        return thumb
    pixels = np.asarray(thumb, dtype=np.float32).copy()
    for value, rgb in lut.items():
        where = small == value
        pixels[where] = pixels[where] * (1 - MASK_ALPHA) + np.array(rgb) * MASK_ALPHA
    return Image.fromarray(pixels.round().astype(np.uint8))


def draw_boxes(thumb, boxes, categories, names: dict | None, scale: tuple) -> list:
    """Draw ``boxes`` (x0, y0, x1, y1 of the full image; ``scale`` = (sx, sy) to the
    thumbnail) on ``thumb`` in place; returns the rectangles drawn (thumbnail pixels)."""
    from PIL import ImageDraw

    from dlpack_io.tools.captions import draw_caption

    draw, drawn = ImageDraw.Draw(thumb), []
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    cats = np.asarray(categories if categories is not None else [], dtype=np.int64).ravel()
    for k, (x0, y0, x1, y1) in enumerate(boxes):
        if not np.all(np.isfinite([x0, y0, x1, y1])):
            continue  # a damaged record: nothing to draw (the Loader refuses it, naming it)
        x0, y0 = int(round(x0 * scale[0])), int(round(y0 * scale[1]))
        # a box under a thumbnail pixel wide (COCO has 1-pixel boxes) is still one pixel:
        # PIL refuses a rectangle whose x1 < x0
        rect = [x0, y0, max(int(round(x1 * scale[0])) - 1, x0),
                max(int(round(y1 * scale[1])) - 1, y0)]
        cat = int(cats[k]) if k < len(cats) else None
        fill = colour(cat if cat is not None else 0)
        draw.rectangle(rect, outline=fill, width=2)
        if cat is not None:
            text = (names or {}).get(str(cat), str(cat))
            tag = max(min(rect[2] - rect[0], 6 * len(text) + 6), 8)  # a filled name tag
            draw.rectangle([rect[0], rect[1], rect[0] + tag, rect[1] + 12], fill=fill)
            draw_caption(draw, (rect[0] + 2, rect[1]), text, width=tag - 2, size=10,
                         fill="black")
        drawn.append(rect)
    return drawn


def decorate(thumb, fields: dict, names: dict | None, full_size: tuple):
    """(``thumb`` with ``fields``' mask and boxes drawn, the box rectangles drawn);
    ``full_size`` is the (width, height) that the fields' coordinates refer to."""
    sx, sy = thumb.width / full_size[0], thumb.height / full_size[1]
    mask = _numpy(fields.get("mask"))
    if mask is not None and mask.shape == (full_size[1], full_size[0]):  # not any "mask" field
        thumb = overlay_mask(thumb, mask)
    drawn = []
    if fields.get("boxes") is not None:
        drawn = draw_boxes(thumb, _numpy(fields["boxes"]), _numpy(fields.get("categories")),
                           names, (sx, sy))
    return thumb, drawn


def _numpy(value):
    if value is None:
        return None
    return value.cpu().numpy() if hasattr(value, "cpu") else np.asarray(value)


def _hwc_uint8(image) -> np.ndarray:
    """A yielded CHW image (uint8, or float in 0..255) as HWC uint8 for PIL."""
    arr = _numpy(image)
    return np.ascontiguousarray(arr.transpose(1, 2, 0)).clip(0, 255).astype(np.uint8)


def _per_sample(value, k: int):
    if value is None:
        return None
    return value[k]


def augmented_sheet(path, out_png, *, count: int = 48, cell: int = 160, columns: int = 8,
                    seed: int = 0, size: int = 224, max_pixels: int | None = None,
                    buckets=None) -> dict:
    """Write ``out_png`` (a path PIL can write), a grid of the first batch a Loader yields
    with RandomResizedCrop(size) and RandomHorizontalFlip() (seed ``seed``; with
    ``buckets``, the bucketing instead of the crop: one bucket's batch, or one token
    budget's), its boxes and masks drawn as it yields them (``Loader(ds, fields=("image",
    "label", "boxes", "categories", "mask"))``)."""
    from PIL import Image, ImageDraw

    from dlpack_io.reader import Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop
    from dlpack_io.tools.captions import draw_caption

    ds = Dataset(path, **({"max_pixels": max_pixels} if max_pixels else {}))
    names = ("image", "label") + tuple(n for n in TARGET_FIELDS if n in ds.fields)
    crop = [RandomResizedCrop(size)] if buckets is None else []
    loader = Loader(ds, batch_size=min(count, len(ds)), shuffle="global", seed=seed,
                    num_workers=0, fields=names, output=Output(return_index=True),
                    buckets=buckets, transforms=crop + [RandomHorizontalFlip()])
    batch = next(iter(loader))
    got = dict(zip(names, batch[:len(names)]))
    indices = _numpy(batch[-1]).tolist()
    cat_names = ds.fields.get("categories", {}).get("names")
    rows = (len(indices) + columns - 1) // columns
    sheet = Image.new("RGB", (columns * cell, rows * (cell + 16)), "white")
    draw, boxes, unmoved = ImageDraw.Draw(sheet), [], 0
    for n, i in enumerate(indices):
        pixels = _hwc_uint8(got["image"][n])
        thumb = Image.fromarray(pixels)
        thumb.thumbnail((cell, cell))
        fields = {k: _per_sample(got.get(k), n) for k in TARGET_FIELDS}
        if fields["mask"] is not None and tuple(fields["mask"].shape) != pixels.shape[:2]:
            unmoved += 1  # a mask that did not follow the image's geometry: not drawn
        thumb, drawn = decorate(thumb, fields, cat_names, (pixels.shape[1], pixels.shape[0]))
        x, y = (n % columns) * cell, (n // columns) * (cell + 16)
        left, top = x + (cell - thumb.width) // 2, y + (cell - thumb.height) // 2
        sheet.paste(thumb, (left, top))
        boxes.append([[r[0] + left, r[1] + top, r[2] + left, r[3] + top] for r in drawn])
        draw_caption(draw, (x + 3, y + cell + 1), f"{int(i)} (augmented)", width=cell - 6)
    sheet.save(out_png)
    return {"path": os.path.abspath(out_png), "samples": [int(i) for i in indices],
            "width": sheet.width, "height": sheet.height, "boxes": boxes,
            "fields": [n for n in names if n in TARGET_FIELDS], "masks_not_moved": unmoved}
