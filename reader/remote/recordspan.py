"""A remote record is one contiguous span: the image payload and, in format 3, its field
block right after it (docs/FORMAT.md, "Fields"). The planner fetches, checks and caches
the whole span, so a record's fields travel in the same range requests as its image and
are covered by the same verification; ``RemoteShard`` reads either part back from it.

Pure functions over index entries (INDEX_DTYPE, or FIELDS_INDEX_DTYPE for format 3), and
the one fetch that checks every span it brings (``fetch_spans``).
"""
from __future__ import annotations

import logging

import numpy as np

from dlpack_io.reader import format as fmt

log = logging.getLogger(__name__)


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


def verified_spans(data, start: int, local, entries, where: str, url: str) -> list:
    """The spans of records ``local`` (index ``entries``) in ``data``, bytes fetched from
    shard offset ``start``, each checked against its CRCs; FormatError naming the shard
    ``where``, the record and its byte range when one fails."""
    pieces = []
    for j, e, length in zip(local.tolist(), entries, extents(entries).tolist()):
        off = int(e["offset"]) - start
        pieces.append(data[off:off + length])
        bad = mismatch(pieces[-1], e)  # "image", "field block" or "span"
        if bad is not None:
            raise fmt.FormatError(
                f"{where} record {j} (bytes {int(e['offset'])}-{int(e['offset']) + length - 1}):"
                f" {bad} checksum mismatch in the downloaded bytes: the object in the bucket is "
                f"damaged or was replaced; run 'dlpack verify {url}'")
    return pieces


async def fetch_spans(store, shard, start: int, end: int, local, entries, url: str, count):
    """(bytes ``start``-``end`` of ``shard``, the verified spans of records ``local`` in
    them): a range whose bytes fail a CRC is fetched once more (a warning names it), then
    FormatError. ``count(requests, bytes)`` is told of every request made."""
    for attempt in (1, 2):
        data = memoryview(await store.aget_range(shard.name, start, end, etag=shard.etag))
        count(1, end - start)
        try:
            return data, verified_spans(data, start, local, entries, shard.path, url)
        except fmt.FormatError as exc:
            if attempt == 2:
                raise
            log.warning("%s; fetching bytes %d-%d again", exc, start, end - 1)
