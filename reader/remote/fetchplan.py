"""Pure planning for the prefetcher: what each batch needs, how to coalesce byte ranges,
when each item may be evicted, whether ``cache_limit`` can hold one batch, and which records
a later batch needs may come with this one's (the read-ahead), and which bytes of a fetched
span are each record's (``extents``) and whether they are the bytes the index promised.

No I/O here, so every rule is tested on its own (tests/remote/test_s3_plan.py)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from dlpack_io.reader import format as fmt

ABSENT, REQUESTED, PRESENT = 0, 1, 2  # the state of each planned item (prefetch.Planner)



# A remote record is one contiguous span: the image payload and, in format 3, its field
# block right after it (docs/FORMAT.md, "Fields"). The planner fetches, checks and caches
# the whole span, so a record's fields travel in the same range requests as its image and
# are covered by the same verification; ``RemoteShard`` reads either part back from it.
#
# Pure functions over index entries (INDEX_DTYPE, or FIELDS_INDEX_DTYPE for format 3), and
# the one fetch that checks every span it brings (``fetch_spans``).

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


MODES = ("records", "shards")


@dataclass
class Plan:
    """Per batch: the distinct items it needs (sample indices, or shard numbers in "shards"
    mode); per item: its size in bytes and the last batch that needs it."""

    mode: str
    needs: list          # list of int64 arrays, one per batch
    size: np.ndarray     # bytes of each item (indexed by item id)
    last_use: np.ndarray # last batch needing each item, -1 if none
    first_pos: list = None  # records mode: position of each needed item in its batch

    def batch_bytes(self, k: int) -> int:
        """Bytes batch ``k`` needs in the cache at once."""
        return int(self.size[self.needs[k]].sum())

    def max_batch_bytes(self) -> tuple[int, int]:
        """(bytes, batch) of the most demanding batch."""
        if not self.needs:
            return 0, -1
        sizes = [self.batch_bytes(k) for k in range(len(self.needs))]
        k = int(np.argmax(sizes))
        return sizes[k], k


def make_plan(mode: str, batches, shard_ids_of, record_lengths, shard_sizes) -> Plan:
    """Plan ``batches`` (int64 arrays of global sample indices).

    ``shard_ids_of(samples)`` maps sample indices to shard numbers; ``record_lengths`` holds
    every sample's record length, ``shard_sizes`` every shard's file size.
    """
    if mode not in MODES:
        raise ValueError(f"fetch mode {mode!r}: expected one of {MODES}")
    first_pos = None
    if mode == "records":
        pairs = [np.unique(np.asarray(b, dtype=np.int64), return_index=True) for b in batches]
        needs, first_pos = [n for n, _ in pairs], [p for _, p in pairs]
        size = np.asarray(record_lengths, dtype=np.int64)
    else:
        needs = [np.unique(shard_ids_of(np.asarray(b, dtype=np.int64))).astype(np.int64)
                 for b in batches]
        size = np.asarray(shard_sizes, dtype=np.int64)
    last_use = np.full(len(size), -1, dtype=np.int64)
    for k, items in enumerate(needs):
        last_use[items] = k  # batches come in order: the later one wins
    return Plan(mode, needs, size, last_use, first_pos)


def first_use(plan: Plan) -> np.ndarray:
    """The first batch needing each item of ``plan``, -1 if none."""
    first = np.full(len(plan.size), -1, dtype=np.int64)
    for k in range(len(plan.needs) - 1, -1, -1):
        first[plan.needs[k]] = k  # the earlier one wins
    return first


def fill_first(plan: Plan, todo: np.ndarray, ratio: float) -> bool:
    """Whether items ``todo`` (batch 0's among them) come all at once, before batch 0 on its
    own: when they are within ``ratio`` times batch 0's bytes. Large ranges are served
    ~10x faster than record-sized ones (docs/benchmarks.md), so batch 0 is not later for
    it, and the rest needs far fewer requests."""
    return int(plan.size[todo].sum()) <= ratio * plan.batch_bytes(0)


def fill_range_bytes(total: int, fill_bytes: int, inflight: int, least: int) -> int:
    """The largest range of a fill of ``total`` bytes: ``fill_bytes``, but no more than
    keeps ``inflight`` requests busy (a small data set is not fetched over one or two
    connections), and never below ``least`` (nor above ``fill_bytes``)."""
    spread = -(-total // max(1, inflight))
    return min(fill_bytes, max(least, spread))


def fill_inflight(requests: list, fill_bytes: int, few: int, many: int) -> int:
    """How many of the fill's range ``requests`` go at once: ``few`` when they are large
    (a quarter of ``fill_bytes`` or more on average), else ``many`` (a rank's share of the
    records: small ranges, as many in flight as a batch's requests)."""
    spanned = sum(r[3] - r[2] for r in requests)
    return few if spanned >= len(requests) * fill_bytes // 4 else many


def check_limit(plan: Plan, cache_limit: int, where: str) -> None:
    """Refuse a cache_limit that cannot hold what one batch needs, saying how much it must be."""
    need, k = plan.max_batch_bytes()
    if need > cache_limit:
        what = "records" if plan.mode == "records" else "whole shards"
        hint = (" (whole-shard fetch holds every shard a batch touches: use fetch mode "
                "'records' or shuffle='block')" if plan.mode == "shards" else "")
        raise ValueError(f"{where}: cache_limit {cache_limit:,} bytes cannot hold batch {k}, "
                         f"whose {what} need {need:,} bytes; give cache_limit >= {need:,} "
                         f"(several times that lets the prefetcher run ahead){hint}")


def auto_mode(batches, shard_ids_of, shard_sizes, cache_limit: int,
              record_bytes: int | None = None) -> str:
    """"shards" when batches read few shards each (block shuffle, or no shuffle), those fit
    the cache, and the data set's ``record_bytes`` do not; else "records". A data set that
    fits is all kept, its shards grown in place in large ranges (keep.py, growing.py):
    whole-shard fetching already, with each record readable as soon as its range lands
    (a whole shard waits for its last byte) and received straight into its file."""
    sample = batches[:8]
    if not sample or record_bytes is not None and record_bytes <= cache_limit:
        return "records"
    per_batch = [len(np.unique(shard_ids_of(np.asarray(b, dtype=np.int64)))) for b in sample]
    biggest = int(np.max(shard_sizes)) if len(shard_sizes) else 0
    if np.mean(per_batch) <= 2 and 2 * max(per_batch) * biggest <= cache_limit:
        return "shards"
    return "records"


def coalesce(offsets: np.ndarray, lengths: np.ndarray, *, gap: int, max_bytes: int) -> list:
    """Group records (sorted by offset) into byte ranges: neighbours closer than ``gap``
    bytes share a request unless it would exceed ``max_bytes``. Returns [(start, end,
    positions)] with positions into the inputs."""
    n = len(offsets)
    if n == 0:
        return []
    offsets = offsets.astype(np.int64)
    ends = offsets + lengths.astype(np.int64)
    out, first = [], 0
    for i in range(1, n + 1):
        if i == n or offsets[i] - ends[i - 1] > gap or ends[i] - offsets[first] > max_bytes:
            out.append((int(offsets[first]), int(ends[i - 1]), np.arange(first, i)))
            first = i
    return out


def range_requests(items: np.ndarray, positions, lookup, *, gap: int, max_bytes: int) -> list:
    """Coalesced range requests ``("range", shard, start, end, samples, records, entries)``
    for the records ``items`` (global sample numbers), given their ``lookup`` (shard
    numbers, record numbers, index entries) and their ``positions`` in the batch: the
    requests holding the records needed earliest first, so decoding can start while the
    rest arrive."""
    shard_ids, local, entries = lookup
    spans, out = extents(entries), []  # a record's image and field block: one span
    for k in np.unique(shard_ids):
        sel = np.flatnonzero(shard_ids == k)
        sel = sel[np.argsort(entries["offset"][sel], kind="stable")]
        for start, end, pos in coalesce(entries["offset"][sel], spans[sel],
                                        gap=gap, max_bytes=max_bytes):
            p = sel[pos]
            out.append((int(positions[p].min()),
                        ("range", int(k), start, end, items[p], local[p], entries[p])))
    out.sort(key=lambda r: r[0])
    return [r for _, r in out]


def ahead_masks(absent, last_use, k: int, bridge: bool):
    """(eligible, passable) for ``read_ahead`` in batch ``k``: records ``absent`` that a later
    batch needs; and when ``bridge`` (every record is this plan's), those a run may pass
    over: fetched or on their way, or fetched for an earlier batch (else None)."""
    eligible = absent & (last_use > k)
    return eligible, ((~absent) | (last_use <= k)) if bridge else None


def read_ahead(todo, positions, eligible, lengths, ends, max_bytes: int, passable=None):
    """``todo`` (sample numbers) plus, after each, the records that follow it in its shard
    (which ends before sample ``ends[i]``) while ``eligible`` (absent, needed later) and
    within ``max_bytes`` in all, with
    the batch position of the record they follow. When everything fetched is kept, the
    records a later batch needs come with this one's in one range: no byte is fetched
    twice, many fewer requests are made. Records ``passable`` (fetched already or on their
    way) are passed over, their bytes counted, instead of ending the run there."""
    extra, extra_pos, taken = [], [], set(todo.tolist())
    for s, p, end in zip(todo.tolist(), positions.tolist(), ends.tolist()):
        nxt, room = s + 1, max_bytes - int(lengths[s])
        while nxt < end and lengths[nxt] <= room:
            if not eligible[nxt] or nxt in taken:
                if passable is None or not passable[nxt] and nxt not in taken:
                    break
            else:
                taken.add(nxt)
                extra.append(nxt)
                extra_pos.append(p)
            room -= int(lengths[nxt])
            nxt += 1
    if not extra:
        return todo, positions
    return (np.concatenate([todo, np.asarray(extra, np.int64)]),
            np.concatenate([positions, np.asarray(extra_pos, positions.dtype)]))
