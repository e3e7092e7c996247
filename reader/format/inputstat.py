"""The input-stat record (``inputstat.json`` beside the manifest): the size and mtime
(nanoseconds) of every packed input file when it was packed, so that ``dlpack convert
--append`` can skip hashing the files that look unchanged (rsync's quick check).

It lives outside the shards on purpose: a shard's bytes must not depend on file times (two
conversions of the same source give the same shards). Readers of the data set never open
it; an append reads it and treats it as untrusted input: size bounded before it is read,
JSON depth bounded, a CRC-32 over its canonical JSON, every number checked. It names the
checksum of the manifest it was written with (it is written just before that manifest):
a record naming another manifest (a crash between the two writes, a conversion that did
not write one) is stale and ignored, and the append hashes every file, as it always did.

Layout: ``{"kind", "version", "manifest": manifest checksum, "paths": [...],
"size": [...], "mtime_ns": [...], "checksum": CRC-32 of the rest}``, the three lists in
step (paths as the shard metadata records them).
"""
from __future__ import annotations

from dlpack_io.reader.format.schema import decode_json, encode_meta
from dlpack_io.reader.format.spec import MAX_JSON_INT, FormatError, crc32

INPUTSTAT_NAME = "inputstat.json"
INPUTSTAT_KIND = "dlpack-input-stat"
INPUTSTAT_VERSION = 1
MAX_INPUTSTAT_BYTES = 512 * 2**20  # ~100 bytes an input: room for ~5 million inputs
_FIX = "delete it (the next append hashes every file and writes it again) or pass --checksum"


def encode_inputstat(stats: dict, manifest_checksum: int) -> bytes:
    """The record's bytes: ``stats`` maps path -> (size, mtime_ns)."""
    paths = sorted(stats)
    body = {"kind": INPUTSTAT_KIND, "version": INPUTSTAT_VERSION,
            "manifest": manifest_checksum, "paths": paths,
            "size": [int(stats[p][0]) for p in paths],
            "mtime_ns": [int(stats[p][1]) for p in paths]}
    body["checksum"] = crc32(encode_meta(body))
    return encode_meta(body)


def _number_ok(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_JSON_INT


def _time_ok(value) -> bool:  # before 1970 is negative (a restored backup can say so)
    return isinstance(value, int) and not isinstance(value, bool) and \
        -MAX_JSON_INT <= value <= MAX_JSON_INT


def parse_inputstat(data: bytes, where: str, manifest_checksum: int) -> dict | None:
    """path -> (size, mtime_ns) from a record's bytes; None when it is stale (names another
    manifest); FormatError naming ``where``, the value and the fix when it is damaged,
    edited or too large."""
    if len(data) > MAX_INPUTSTAT_BYTES:
        raise FormatError(f"{where}: {len(data)} bytes or more, more than an input-stat record "
                          f"may have ({MAX_INPUTSTAT_BYTES}); {_FIX}")
    rec = decode_json(data, where)
    if rec.get("kind") != INPUTSTAT_KIND or rec.get("version") != INPUTSTAT_VERSION:
        raise FormatError(f"{where}: kind {rec.get('kind')!r:.40} version "
                          f"{rec.get('version')!r:.20}, expected {INPUTSTAT_KIND!r} version "
                          f"{INPUTSTAT_VERSION}; {_FIX}")
    body = {k: v for k, v in rec.items() if k != "checksum"}
    if rec.get("checksum") != crc32(encode_meta(body)):
        raise FormatError(f"{where}: checksum {rec.get('checksum')!r:.20} does not match its "
                          f"contents (damaged or edited); {_FIX}")
    if not _number_ok(rec.get("manifest")):
        raise FormatError(f"{where}: manifest is {rec.get('manifest')!r:.40}, expected a "
                          f"manifest checksum; {_FIX}")
    if rec["manifest"] != manifest_checksum:
        return None
    return _entries(rec, where)


def _entries(rec: dict, where: str) -> dict:
    paths, sizes, times = rec.get("paths"), rec.get("size"), rec.get("mtime_ns")
    if not all(isinstance(x, list) for x in (paths, sizes, times)) or \
            not len(paths) == len(sizes) == len(times):
        raise FormatError(f"{where}: paths, size and mtime_ns are not three lists of one "
                          f"length; {_FIX}")
    for path, size, mtime in zip(paths, sizes, times):
        if not isinstance(path, str) or not _number_ok(size) or not _time_ok(mtime):
            raise FormatError(f"{where}: entry ({path!r:.60}, {size!r:.24}, {mtime!r:.24}), "
                              f"expected (path, size >= 0, mtime_ns) within int64; {_FIX}")
    return {p: (s, t) for p, s, t in zip(paths, sizes, times)}
