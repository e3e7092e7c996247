"""A remote record is one contiguous span: the image payload and, in format 3, its field
block right after it (docs/FORMAT.md, "Fields"). The planner fetches, checks and caches
the whole span, so a record's fields travel in the same range requests as its image and
are covered by the same verification; ``RemoteShard`` reads either part back from it.

Pure functions over index entries (INDEX_DTYPE, or FIELDS_INDEX_DTYPE for format 3).
"""
from __future__ import annotations

import numpy as np

from dlpack_io.reader import format as fmt


def extents(entries: np.ndarray) -> np.ndarray:
    """Bytes of each record's span (image payload + field block), as int64 (no overflow:
    two u4 columns summed in 64 bits)."""
    out = entries["length"].astype(np.int64)
    if "fields_length" in entries.dtype.names:
        out += entries["fields_length"].astype(np.int64)
    return out


def mismatch(piece, entry) -> str | None:
    """None when ``piece`` (a record's whole span) matches ``entry``'s length and CRCs;
    else which part failed ("image", "field block"; "span" when the length differs)."""
    length = int(entry["length"])
    flen = int(entry["fields_length"]) if "fields_length" in entry.dtype.names else 0
    if len(piece) != length + flen:
        return "span"
    view = memoryview(piece)
    if fmt.crc32(view[:length]) != int(entry["crc"]):
        return "image"
    if flen and fmt.crc32(view[length:]) != int(entry["fields_crc"]):
        return "field block"
    return None
