"""Every index entry of a shard checked once, when the shard is opened, vectorised.

After ``check_index`` passes, nothing read from the index can size an allocation beyond
the pixel limit, point outside the data section, overlap another record, or name a class
that does not exist; readers then slice and size without further checks. All arithmetic is
done in uint64 on values bounded first, so a hostile entry cannot wrap a sum or a product.
Cost: a few vectorised passes over the index (docs/benchmarks.md, "Opening a data set").
"""
from __future__ import annotations

import numpy as np

from dlpack_io.reader.format import spec as fmt


def _first(mask: np.ndarray):
    """Index of the first True in ``mask``, or None (``any`` first: the common case)."""
    return int(np.argmax(mask)) if mask.any() else None


def _fail(where: str, i: int, entry, problem: str):
    raise fmt.FormatError(
        f"{where}: record {i} (offset {int(entry['offset'])}, length {int(entry['length'])}, "
        f"{int(entry['height'])}x{int(entry['width'])}x{int(entry['channels'])}, kind "
        f"{int(entry['kind'])}, label {int(entry['label'])}): {problem}")


def check_pixels(index: np.ndarray, where: str, max_pixels: int) -> None:
    """Kind, channels and size of every record: known kind, 3 channels, 1..MAX_SIDE per
    side, height x width <= ``max_pixels``, raw payloads exactly height x width x 3."""
    h, w = index["height"].astype(np.uint64), index["width"].astype(np.uint64)
    checks = (
        (index["kind"] > max(fmt.KINDS),  # kinds are 0, 1 and 2
         lambda e: f"unknown record kind {int(e['kind'])} (0 JPEG, 1 raw, 2 PNG/WebP file)"),
        (index["channels"] != 3, lambda e: f"{int(e['channels'])} channels, the format stores RGB (3)"),
        ((h < 1) | (w < 1) | (h > fmt.MAX_SIDE) | (w > fmt.MAX_SIDE),
         lambda e: f"height and width must be 1..{fmt.MAX_SIDE}"),
        (index["length"] < 1, lambda e: "empty payload"),
    )
    for mask, problem in checks:
        i = _first(mask)
        if i is not None:
            _fail(where, i, index[i], problem(index[i]))
    pixels = h * w  # each side <= 65535 now: the product fits easily
    i = _first(pixels > np.uint64(max_pixels))
    if i is not None:
        _fail(where, i, index[i], f"{int(pixels[i])} pixels, more than the limit of {max_pixels} "
                                  f"(a decompression bomb, or a data set of huge images: open it "
                                  f"with Dataset(..., max_pixels=N) if you trust it)")
    raw = index["kind"] == fmt.KIND_RAW
    i = _first(raw & (pixels * np.uint64(3) != index["length"].astype(np.uint64)))
    if i is not None:
        _fail(where, i, index[i], f"a raw record of {int(h[i])}x{int(w[i])}x3 pixels must be "
                                  f"{int(pixels[i]) * 3} bytes")


def check_labels(index: np.ndarray, where: str, num_classes: int) -> None:
    """Labels index the manifest's classes; a data set without classes has only -1."""
    labels = index["label"]
    if num_classes == 0:
        i = _first(labels != -1)
        expected = "-1 (the data set has no classes)"
    else:
        i = _first((labels < 0) | (labels >= num_classes))
        expected = f"0..{num_classes - 1}"
    if i is not None:
        _fail(where, i, index[i], f"label {int(labels[i])} outside the classes: expected {expected}")


def check_layout(index: np.ndarray, where: str, data_offset: int, data_end: int) -> None:
    """Record shards: records back to back in index order (format.record_offsets), so they
    are ordered, disjoint, inside the data section, and every gap is alignment padding."""
    spans = index["length"].astype(np.uint64)  # u32 + u32 in u64: cannot wrap
    if "fields_length" in index.dtype.names:  # version 3: the field block follows the image
        spans += index["fields_length"]
    starts, end = fmt.record_offsets(spans, data_offset)
    i = _first(index["offset"] != starts)
    if i is not None:
        _fail(where, i, index[i], f"starts at {int(index['offset'][i])}, the layout puts it at "
                                  f"{int(starts[i])} (records are stored in index order, back to "
                                  f"back, {fmt.RECORD_ALIGN}-byte aligned)")
    if end != data_end:
        raise fmt.FormatError(f"{where}: the records end at {end}, the data section at {data_end}: "
                              f"bytes no record covers, or records past the data section")


def check_index(index: np.ndarray, where: str, *, data_offset: int | None = None,
                data_end: int | None = None, num_classes: int | None = None,
                max_pixels: int = fmt.DEFAULT_MAX_PIXELS) -> None:
    """Raise FormatError naming ``where`` and the first bad record, or return.

    ``data_offset``/``data_end``: the data section of a record shard (None for LMDB, whose
    offsets must be 0); ``num_classes``: the manifest's class count (None: labels unchecked).
    """
    check_pixels(index, where, int(max_pixels))
    fmt.check_index_fields(index, where)  # kind, EXIF orientation, colour
    if data_offset is None:
        i = _first(index["offset"] != 0)
        if i is not None:
            _fail(where, i, index[i], "LMDB index entries must have offset 0")
    else:
        check_layout(index, where, data_offset, data_end)
    if num_classes is not None:
        check_labels(index, where, num_classes)
