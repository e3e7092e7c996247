"""``dlpack inspect``: what is in a data set. Every function returns plain data."""
from __future__ import annotations

import os

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.shard import guarded_copy
from dlpack_io.tools.fieldreport import field_summary, sample_fields


def _size_stats(heights: np.ndarray, widths: np.ndarray) -> dict:
    if heights.size == 0:
        return {}
    return {"height": {"min": int(heights.min()), "median": float(np.median(heights)),
                       "max": int(heights.max())},
            "width": {"min": int(widths.min()), "median": float(np.median(widths)),
                      "max": int(widths.max())}}


def _storage(m: dict, indices: list) -> dict:
    """How the records were stored: original bytes, lossless transforms, re-encodes (with
    the reasons), and what the reader does at decode time for the original-bytes ones."""
    index = np.concatenate(indices) if indices else np.zeros(0, dtype=fmt.INDEX_DTYPE)
    jpeg, files = index["kind"] == fmt.KIND_JPEG, int((index["kind"] == fmt.KIND_FILE).sum())
    planes = int((index["kind"] == fmt.KIND_PLANES).sum())
    oriented = jpeg | (index["kind"] == fmt.KIND_PLANES)  # kinds turned upright when read
    lossless, reencoded = m.get("lossless", {}), m["reencoded"]
    return {"original_bytes": m["num_samples"] - sum(lossless.values()) - sum(reencoded.values()),
            "lossless": lossless, "reencoded": reencoded,
            "at_decode": {"EXIF orientation applied": int((oriented & (index["orientation"] != 1)).sum()),
                          "grayscale to RGB": int((oriented & (index["colour"] == fmt.COLOUR_GRAY)).sum()),
                          "CMYK/YCCK to RGB": int((jpeg & (index["colour"] == fmt.COLOUR_CMYK)).sum()),
                          **({"PNG/WebP decoded with PIL": files} if files else {})},
            "raw_records": int((index["kind"] == fmt.KIND_RAW).sum()),
            "file_records": files,
            **({"planes_records": planes} if planes else {}),
            "jpeg_records": int(jpeg.sum())}


def _labels_from(m: dict) -> str:
    """Where the data set's labels came from: class folders, a list, a COCO file (whose
    categories are a field, not labels), or none (--no-labels)."""
    if m["options"].get("coco"):
        return "coco"
    if m["source"].get("list") or (m["classes"] and not m["source"].get("root")):
        return "list" if m["source"].get("list") else "folders"
    return "folders" if m["classes"] else "none"


def kind_name(entry, payload=b"") -> str:
    """What a record is: jpeg, raw, or the format of a kept file (png, webp)."""
    kind = int(entry["kind"])
    if kind == fmt.KIND_FILE:
        head = bytes(payload[:8])
        return next((name.lower() for magic, name in fmt.FILE_FORMATS.items()
                     if head.startswith(magic)), "file")
    return {fmt.KIND_JPEG: "jpeg", fmt.KIND_RAW: "raw",
            fmt.KIND_PLANES: "planes"}.get(kind, f"kind {kind}")


def colour_name(entry) -> str:
    """The colour the record's bytes hold: a JPEG's stored colour; raw pixels are RGB; a
    kept file is decoded (and converted) to RGB."""
    if int(entry["kind"]) in (fmt.KIND_JPEG, fmt.KIND_PLANES):
        return ("ycbcr", "grayscale", "cmyk")[min(int(entry["colour"]), 2)]
    return "rgb" if int(entry["kind"]) == fmt.KIND_RAW else "converted to rgb when decoded"


def _class_counts(ds) -> list:
    """Samples per class as readers see them (retired records left out)."""
    counts = ds.manifest["class_counts"]
    if not fmt.retired_pairs(ds.manifest) or not counts:
        return counts
    return np.bincount(ds.labels, minlength=len(counts))[:len(counts)].tolist()


def summary(path, *, max_pixels: int = fmt.DEFAULT_MAX_PIXELS) -> dict:
    """Facts about a whole data set: format, counts, bytes, classes, options, rejects."""
    ds = Dataset(path, max_pixels=max_pixels)
    m = ds.manifest
    indices = [s.index for s in ds.shards]
    heights = np.concatenate([ix["height"] for ix in indices]) if indices else np.zeros(0)
    widths = np.concatenate([ix["width"] for ix in indices]) if indices else np.zeros(0)
    lengths = np.concatenate([ix["length"] for ix in indices]) if indices else np.zeros(0)
    return {
        "path": ds.path if ds.is_remote else os.path.abspath(path), "format": m["format"],
        "version": m["version"], "mode": m["mode"], "num_samples": len(ds),
        "retired": len(fmt.retired_pairs(m)),
        "num_shards": len(m["shards"]), "num_bytes": m["num_bytes"],
        "record_bytes": {"mean": float(lengths.mean()) if lengths.size else 0.0,
                         "max": int(lengths.max()) if lengths.size else 0},
        "image_size": _size_stats(heights, widths),
        "classes": [{"label": i, "name": c, "count": n}
                    for i, (c, n) in enumerate(zip(m["classes"], _class_counts(ds)))],
        "labels_from": _labels_from(m),
        "options": m["options"], "source": m["source"], "reencoded": m["reencoded"],
        "storage": _storage(m, indices),
        "num_rejects": len(m["rejects"]), "rejects": m["rejects"], "created": m["created"],
        "shards": m["shards"], "fields": field_summary(ds), "history": m.get("history", []),
    }


def shard_detail(path, shard: int, *, records: int = 10,
                 max_pixels: int = fmt.DEFAULT_MAX_PIXELS) -> dict:
    """Facts about shard number ``shard`` and its first ``records`` index entries."""
    ds = Dataset(path, max_pixels=max_pixels)
    if not 0 <= shard < len(ds.shards):
        raise IndexError(f"{path} has shards 0..{len(ds.shards) - 1}; there is no shard {shard}")
    entry, sh = ds.manifest["shards"][shard], ds.shards[shard]
    index = sh.index
    meta = sh.meta()
    header = getattr(sh, "header", None)
    shown = fmt.sample_records(ds.manifest["num_samples"], fmt.retired_pairs(ds.manifest))
    return {
        "shard": shard, "name": entry["name"], "path": sh.path, "bytes": entry["bytes"],
        "num_samples": entry["num_samples"], "first_sample": entry["first_sample"],
        "crc": entry["crc"], "header": header.__dict__ if header is not None else None,
        "label_counts": np.bincount(index["label"], minlength=len(ds.classes)).tolist()
        if ds.classes else [],  # --no-labels: every label is -1
        "image_size": _size_stats(index["height"], index["width"]),
        "records": [_entry_dict(index[j], j, _sample_of(shown, entry["first_sample"] + j),
                                meta, ds.classes, _head(sh, j))
                    for j in range(min(records, len(index)))],
    }


def _head(shard, j: int) -> bytes:
    """The first bytes of record ``j`` of a kept-file kind (they say PNG or WebP)."""
    if int(shard.index[j]["kind"]) != fmt.KIND_FILE:
        return b""
    return guarded_copy(shard.payload(j)[:8])


def _sample_of(shown, record: int) -> int | None:
    """The sample index that shows global record ``record`` (``shown``: the record of each
    sample, None when no record is retired: reader/format/schema.py); None if retired."""
    if shown is None:
        return record
    where = np.flatnonzero(shown == record)
    return int(where[0]) if where.size else None


def _entry_dict(entry, j: int, sample: int, meta: dict, classes, head=b"") -> dict:
    label = int(entry["label"])
    paths = meta.get("paths", [])
    return {"sample": sample, "record": j, "offset": int(entry["offset"]),
            "length": int(entry["length"]), "label": label,
            "class": classes[label] if 0 <= label < len(classes) else None,
            "crc": int(entry["crc"]), "height": int(entry["height"]),
            "width": int(entry["width"]), "channels": int(entry["channels"]),
            "kind": kind_name(entry, head), "orientation": int(entry["orientation"]),
            "colour": colour_name(entry),
            "source": paths[j] if j < len(paths) else None}


def record_detail(path, sample: int, *, max_pixels: int = fmt.DEFAULT_MAX_PIXELS) -> dict:
    """Everything known about global sample ``sample`` (negative: from the end, as in
    Python), with its checksum checked."""
    ds = Dataset(path, max_pixels=max_pixels)
    k, j = ds.locate(sample)
    sample %= len(ds)
    sh = ds.shards[k]
    payload = guarded_copy(sh.payload(j))
    out = _entry_dict(sh.index[j], j, sample, sh.meta(), ds.classes, payload[:8])
    out["shard"] = ds.manifest["shards"][k]["name"]
    out["crc_ok"] = fmt.crc32(payload) == out["crc"]
    if ds.fields and not ds.is_remote:
        out["fields"] = sample_fields(Dataset(path, max_pixels=max_pixels,
                                              verify_checksums=True), sample)
    return out


def sheet_path(out_png) -> str:
    """``out_png`` with ``.png`` added when it has no extension; ValueError naming the
    extensions PIL can write when it has one PIL cannot."""
    from PIL import Image

    root, ext = os.path.splitext(os.fspath(out_png))
    if not ext:
        return root + ".png"
    if ext.lower() not in Image.registered_extensions():
        raise ValueError(f"{out_png}: cannot write a {ext} image; use .png (or .jpg, .webp)")
    return os.fspath(out_png)


def contact_sheet(path, out_png, *, count: int = 48, cell: int = 160, columns: int = 8,
                  seed: int = 0, max_pixels: int = fmt.DEFAULT_MAX_PIXELS) -> dict:
    """Write a PNG grid of ``count`` random samples captioned with their labels (``.png``
    is added to a name without an extension).

    How a person checks that packing went right: upright, RGB, the right class names.
    """
    from PIL import Image, ImageDraw

    from dlpack_io.reader.dataset import read_fields
    from dlpack_io.tools.captions import draw_caption
    from dlpack_io.tools.targetsheet import decorate, has_targets

    out_png = sheet_path(out_png)
    ds = Dataset(path, max_pixels=max_pixels)
    targets, boxes = has_targets(ds.fields), []  # boxes and masks drawn (issue 25)
    picks = np.sort(np.random.default_rng(seed).choice(len(ds), min(count, len(ds)), replace=False))
    rows = (len(picks) + columns - 1) // columns
    caption = 16
    sheet = Image.new("RGB", (columns * cell, rows * (cell + caption)), "white")
    draw, captions = ImageDraw.Draw(sheet), []
    for n, i in enumerate(picks):
        pixels, label = ds[int(i)]
        thumb = Image.fromarray(pixels)
        thumb.thumbnail((cell, cell))
        if targets:
            thumb, drawn = decorate(thumb, read_fields(ds, int(i)),
                                    ds.fields.get("categories", {}).get("names"),
                                    (pixels.shape[1], pixels.shape[0]))
        x, y = (n % columns) * cell, (n // columns) * (cell + caption)
        left, top = x + (cell - thumb.width) // 2, y + (cell - thumb.height) // 2
        sheet.paste(thumb, (left, top))
        if targets:
            boxes.append([[r[0] + left, r[1] + top, r[2] + left, r[3] + top] for r in drawn])
        name = ds.classes[label] if 0 <= label < len(ds.classes) else "(no label)"
        captions.append(draw_caption(draw, (x + 3, y + cell + 1), f"{int(i)}: {name}",
                                     width=cell - 6))
    sheet.save(out_png)
    return {"path": os.path.abspath(out_png), "samples": picks.tolist(),
            "width": sheet.width, "height": sheet.height, "captions": captions,
            **({"boxes": boxes} if targets else {})}
