"""Shard metadata and manifest JSON: canonical encoding, the depth-checked parser, and the
manifest schema with its own checksum. Imported through :mod:`dlpack_io.reader.format`."""
from __future__ import annotations

import json
import re

import numpy as np

from dlpack_io.reader.format.fields import check_field_schema
from dlpack_io.reader.format.spec import (FORMAT_VERSION, FORMATS, MAGIC, MANIFEST_KIND,
                                          MAX_JSON_DEPTH, MAX_JSON_INT, MODES, PLAIN_VERSION,
                                          READABLE_VERSIONS, SHARD_NAME_RE, SHARD_SUFFIX,
                                          FormatError, crc32, index_dtype, json_depth,
                                          max_shard_bytes, version_error)

# What a data set records about its inputs' identity and its appends (format 2 and 3
# alike: both are optional keys that older readers ignore).
#
# * Shard metadata ``"sources"``: beside ``"paths"``, the SHA-256 (hex) of every record's
#   input file, in record order. ``dlpack convert --append`` compares (path, hash) with the
#   files of SRC to pack only what is new. Shards packed before it was recorded lack it.
# * Manifest ``"history"``: one entry per append, oldest first: when (``at``), from where
#   (``source``), what it saw (``inputs``: the inputs it packed or rejected; ``duplicates``,
#   ``changed``, ``unverified``: those it skipped; ``replaced``, optional: of the changed,
#   those packed to retire their old record, reader/format/schema.py; ``retried``,
#   optional: rejects of earlier runs whose input it tried again, dropped from ``rejects``
#   and from ``source.num_inputs`` since this run's outcome replaces them), the samples it added (``first_sample``,
#   ``num_samples``), the classes it added (``new_classes``) and the shards it wrote
#   (``shards``). Covered by the manifest checksum like every other key.

SOURCES_KEY = "sources"
HISTORY_KEY = "history"
SHA256_RE = re.compile(r"[0-9a-f]{64}")  # fullmatch: "$" would let a trailing newline in
HISTORY_COUNTS = ("inputs", "duplicates", "changed", "unverified", "first_sample",
                  "num_samples")


def _count_ok(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_JSON_INT


def _entry_problem(entry, names: set) -> str | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("at"), str):
        return "is not an object with a time 'at'"
    for key in HISTORY_COUNTS:
        if not _count_ok(entry.get(key)):
            return f"{key} is {entry.get(key)!r:.40}, expected a count"
    for key in ("replaced", "retried"):
        if key in entry and not _count_ok(entry[key]):
            return f"{key} is {entry[key]!r:.40}, expected a count"
    for key in ("shards", "new_classes"):
        if not isinstance(entry.get(key), list) or \
                not all(isinstance(x, str) for x in entry[key]):
            return f"{key} is not a list of names"
    missing = [s for s in entry["shards"] if s not in names]
    if missing:
        return f"lists shard {missing[0]!r:.60}, which the manifest does not"
    return None


def check_history(manifest: dict, where: str) -> None:
    """FormatError naming ``where`` and the entry when a manifest's ``history`` (optional)
    is not a list of append entries whose shards the manifest lists."""
    history = manifest.get(HISTORY_KEY)
    if history is None:
        return
    if not isinstance(history, list):
        raise FormatError(f"{where}: history is {type(history).__name__}, expected a list of "
                          f"appends")
    names = {s["name"] for s in manifest["shards"]}
    for i, entry in enumerate(history):
        problem = _entry_problem(entry, names)
        if problem:
            raise FormatError(f"{where}: history[{i}] {problem}; the manifest was edited or "
                              f"damaged: convert the source again")


def sources_of(meta: dict, num_records: int) -> list | None:
    """The input hashes a shard's metadata records (one per record), or None when it has
    none (packed before they were recorded) or they do not fit (damaged: not trusted)."""
    sources = meta.get(SOURCES_KEY)
    if not isinstance(sources, list) or len(sources) != num_records or \
            not all(isinstance(s, str) and SHA256_RE.fullmatch(s) for s in sources):
        return None
    return sources


# Records retired by ``dlpack convert --append --replace-changed``: a changed input's new
# content is packed into the append's new shards and its old record is retired, without a
# byte of an old shard changing.
#
# * Manifest ``"retired"``: a list of ``[old, new]`` pairs of record numbers (the global
#   record numbers of the shards' ``first_sample`` + position; the manifest's
#   ``num_samples`` counts every record, retired ones included), sorted by ``old``: record
#   ``old`` is retired and record ``new`` (packed later, so ``new > old``) takes its place.
#   A later append may retire ``new`` in turn (a chain: the last record of it is served).
# * A manifest with ``"retired"`` has version ``RETIRING_VERSION`` (4), which readers older
#   than this key refuse with "upgrade dlpack" rather than silently serving the stale
#   record beside its replacement. Shards keep their own versions (2 or 3); a version-4
#   manifest declares its ``fields`` (maybe none), as version 3 does.
#
# Sample order (``sample_records``): the data set's sample ``i`` is the ``i``-th record that
# no pair names as ``new``, with a retired record replaced by the last record of its chain.
# So every sample that existed before an append keeps its index (a replaced one now shows its
# new content), new samples follow in record order, and the indices stay dense:
# ``len(dataset) == num_samples - len(retired)``.

RETIRED_KEY = "retired"
RETIRING_VERSION = 4  # manifest only: version 3 + "retired"


def retired_pairs(manifest: dict) -> list:
    """The manifest's ``[old, new]`` pairs (empty when it retires nothing)."""
    return manifest.get(RETIRED_KEY) or []


def check_retired(manifest: dict, where: str) -> None:
    """FormatError naming ``where`` unless ``retired`` (present exactly when the version is
    RETIRING_VERSION) is a sorted list of at most num_samples pairs of record numbers in
    range, ``old < new``, no record retired twice and no record replacing two."""
    pairs = manifest.get(RETIRED_KEY)
    if (pairs is not None) != (manifest["version"] == RETIRING_VERSION):
        raise FormatError(f"{where}: version {manifest['version']} with"
                          f"{'' if pairs is not None else 'out'} a 'retired' list: only a "
                          f"version-{RETIRING_VERSION} manifest retires records, and it must "
                          f"list them; the manifest was edited or damaged: convert again")
    if pairs is None:
        return
    n = manifest["num_samples"]
    if not isinstance(pairs, list) or not pairs or len(pairs) > n:
        raise FormatError(f"{where}: retired must be a list of 1..{n} [old, new] pairs (one "
                          f"per record at most), found {type(pairs).__name__} of "
                          f"{len(pairs) if isinstance(pairs, list) else '?'}")
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in pair)
                and 0 <= pair[0] < pair[1] < n):
            raise FormatError(f"{where}: retired[{i}] is {pair!r:.60}, expected [old, new] "
                              f"record numbers with 0 <= old < new < {n}")
    olds, news = [p[0] for p in pairs], [p[1] for p in pairs]
    if any(a >= b for a, b in zip(olds, olds[1:])):
        raise FormatError(f"{where}: retired is not sorted by old record, or retires a "
                          f"record twice; each record is retired once")
    if len(set(news)) != len(news):
        raise FormatError(f"{where}: retired names a record as the replacement of two; each "
                          f"replacement replaces one record")


def sample_records(num_records: int, pairs: list) -> np.ndarray | None:
    """The record number of each sample (int64, ``num_records - len(pairs)`` of them) for
    a manifest's checked ``pairs``; None when there are none (sample i is record i)."""
    if not pairs:
        return None
    old = np.array([p[0] for p in pairs], dtype=np.int64)
    new = np.array([p[1] for p in pairs], dtype=np.int64)
    last = dict(zip(old.tolist(), new.tolist()))
    for o in sorted(last, reverse=True):  # new > old: a chain's tail is settled first
        last[o] = last.get(last[o], last[o])
    shown = np.ones(num_records, dtype=bool)
    shown[new] = False
    records = np.flatnonzero(shown).astype(np.int64)
    heads = old[shown[old]]  # retired records that hold a place (not themselves a new)
    records[np.searchsorted(records, heads)] = [last[int(h)] for h in heads]
    return records


def retired_records(pairs: list) -> set:
    """Record numbers no sample shows any more (every ``old``)."""
    return {p[0] for p in pairs}


def encode_meta(meta: dict) -> bytes:
    """Canonical JSON bytes for shard metadata or a manifest (sorted keys, compact)."""
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def decode_json(data, where: str) -> dict:
    """Parse UTF-8 JSON that must be an object, raising FormatError naming ``where``.

    The nesting depth is checked before parsing: Python's parser recurses once per level
    and, where something raised the interpreter's recursion limit, a hostile file nested
    100,000 deep overflows the C stack (a segfault, not a RecursionError)."""
    data = bytes(data)
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise FormatError(f"{where}: JSON nested too deeply to parse: not a dlpack file "
                          f"({depth} levels, at most {MAX_JSON_DEPTH})")
    try:
        value = json.loads(data.decode("utf-8"))
    except RecursionError:  # cannot happen below MAX_JSON_DEPTH; kept as a last guard
        raise FormatError(f"{where}: JSON nested too deeply to parse: not a dlpack file") from None
    except ValueError as exc:  # bad UTF-8 or JSON, or an integer beyond Python's digit limit
        raise FormatError(f"{where}: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(value, dict):
        raise FormatError(f"{where}: expected a JSON object, found {type(value).__name__}")
    return value


def check_shard_name(name, where: str) -> str:
    """Return ``name`` if it is a plain shard file name; reject paths and traversal."""
    if not isinstance(name, str) or not SHARD_NAME_RE.match(name):
        raise FormatError(f"{where}: shard name {name!r} is not of the form "
                          f"'shard-NNNNN.rec' or 'shard-NNNNN.lmdb' (no directories allowed)")
    return name


def manifest_checksum(manifest: dict) -> int:
    """CRC-32 of the manifest's canonical JSON with its ``checksum`` field left out."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return crc32(encode_meta(body))


def lmdb_meta(num_records: int, index_crc: int, shard_meta: dict,
              version: int = PLAIN_VERSION) -> dict:
    """Metadata JSON stored under LMDB_META_KEY: header facts plus the shard metadata."""
    return dict(shard_meta, magic=MAGIC.decode(), version=version, num_records=num_records,
                index_crc=index_crc, index_entry_size=index_dtype(version).itemsize)


# Manifest schema: required top-level keys and their JSON types. Shard entries carry the
# shard's file name, record count, global index of its first record, file size and
# ``crc``: the header CRC (record shards) or the CRC of the metadata JSON (LMDB shards).
MANIFEST_FIELDS = {
    "kind": str, "version": int, "format": str, "mode": str, "num_samples": int,
    "num_bytes": int, "classes": list, "class_counts": list, "shards": list,
    "options": dict, "source": dict, "rejects": list, "reencoded": dict, "lossless": dict,
    "created": dict, "checksum": int,
}
SHARD_ENTRY_FIELDS = {"name": str, "num_samples": int, "first_sample": int, "bytes": int,
                      "crc": int}
# Manifest keys that legitimately differ between two packings of the same input.
VOLATILE_MANIFEST_KEYS = ("created", "checksum")


def _check_fields(obj: dict, fields: dict, where: str) -> None:
    for key, typ in fields.items():
        if key not in obj:
            raise FormatError(f"{where}: missing required field {key!r}")
        value = obj[key]
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise FormatError(f"{where}: field {key!r} is {type(value).__name__} "
                              f"{value!r:.60}, expected {typ.__name__}")
        if typ is int and not 0 <= value <= MAX_JSON_INT:
            raise FormatError(f"{where}: field {key!r} is {'negative' if value < 0 else 'too large'}"
                              f" ({str(value)[:40]}), expected 0..{MAX_JSON_INT}")


def _check_list(values, typ, where: str, what: str) -> None:
    for i, value in enumerate(values):
        if not isinstance(value, typ) or isinstance(value, bool) or \
                (typ is int and not 0 <= value <= MAX_JSON_INT):
            raise FormatError(f"{where}: {what}[{i}] is {type(value).__name__} {value!r:.60}, "
                              f"expected a {'count' if typ is int else 'string'}")


def _check_details(manifest: dict, where: str) -> None:
    """The parts of a manifest that tools print: shapes a crafted file could get wrong."""
    classes, counts = manifest["classes"], manifest["class_counts"]
    _check_list(classes, str, where, "classes")
    _check_list(counts, int, where, "class_counts")
    if len(classes) != len(counts):
        raise FormatError(f"{where}: {len(classes)} classes but {len(counts)} class counts; "
                          f"expected one count per class")
    if classes and sum(counts) != manifest["num_samples"]:
        raise FormatError(f"{where}: class counts add up to {sum(counts)}, num_samples says "
                          f"{manifest['num_samples']}")
    source = manifest["source"]
    if not isinstance(source.get("num_inputs", 0), int) or \
            any(not isinstance(source.get(k), (str, type(None))) for k in ("root", "list")):
        raise FormatError(f"{where}: source must hold root and list (text or null) and "
                          f"num_inputs (a count)")
    for i, reject in enumerate(manifest["rejects"]):
        if not isinstance(reject, dict) or not isinstance(reject.get("path"), str) or \
                not isinstance(reject.get("reason"), str):
            raise FormatError(f"{where}: rejects[{i}] is not a {{path, reason}} pair of texts")
    _check_list(manifest["reencoded"].values(), int, where, "reencoded")
    names = [s["name"] for s in manifest["shards"]]
    if len(set(names)) != len(names):
        raise FormatError(f"{where}: a shard file is listed twice; each must appear once")


def _check_shard_entries(manifest: dict, where: str) -> None:
    """Each shard entry: its fields, name and kind, a size a shard of its samples can have
    (max_shard_bytes), and first samples that tile the sample range."""
    expected_first = 0
    for k, shard in enumerate(manifest["shards"]):
        entry_where = f"{where}: shards[{k}]"
        if not isinstance(shard, dict):
            raise FormatError(f"{entry_where}: expected an object")
        _check_fields(shard, SHARD_ENTRY_FIELDS, entry_where)
        if shard["crc"] > 0xFFFFFFFF:
            raise FormatError(f"{entry_where}: crc {shard['crc']} is not a 32-bit checksum")
        check_shard_name(shard["name"], entry_where)
        if not shard["name"].endswith(SHARD_SUFFIX[manifest["format"]]):
            raise FormatError(f"{entry_where}: {shard['name']!r} is not a {manifest['format']} shard")
        if shard["bytes"] > max_shard_bytes(shard["num_samples"]):
            raise FormatError(f"{entry_where}: {shard['name']} claims {shard['bytes']} bytes, more "
                              f"than a shard of {shard['num_samples']} samples can hold (at most "
                              f"{max_shard_bytes(shard['num_samples'])}): the manifest was "
                              f"edited or damaged; convert the source again")
        if shard["first_sample"] != expected_first:
            raise FormatError(f"{entry_where}: first_sample {shard['first_sample']}, expected "
                              f"{expected_first} (shards must tile the sample range)")
        expected_first += shard["num_samples"]
    if expected_first != manifest["num_samples"]:
        raise FormatError(f"{where}: shards hold {expected_first} samples, num_samples says "
                          f"{manifest['num_samples']}")


def validate_manifest(manifest: dict, where: str) -> dict:
    """Check a parsed manifest against the schema and its own checksum; return it.

    Raises FormatError naming ``where`` and the offending field on any inconsistency, so
    callers can index shards and classes without further checks.
    """
    _check_fields(manifest, MANIFEST_FIELDS, where)
    if manifest["kind"] != MANIFEST_KIND:
        raise FormatError(f"{where}: kind is {manifest['kind']!r}, expected {MANIFEST_KIND!r}")
    readable = READABLE_VERSIONS + (RETIRING_VERSION,)  # a manifest may also retire records
    if manifest["version"] not in readable:
        raise FormatError(version_error(where, manifest["version"], readable))
    try:
        computed = manifest_checksum(manifest)
    except (RecursionError, ValueError) as exc:
        raise FormatError(f"{where}: cannot re-encode the manifest to check its checksum "
                          f"({type(exc).__name__}): nested too deeply or damaged") from None
    if computed != manifest["checksum"]:
        raise FormatError(f"{where}: manifest checksum mismatch (stored {manifest['checksum']:#x}, "
                          f"computed {computed:#x}): the manifest was edited or damaged")
    if manifest["format"] not in FORMATS or manifest["mode"] not in MODES:
        raise FormatError(f"{where}: format {manifest['format']!r:.40} / mode "
                          f"{manifest['mode']!r:.40}: expected format {' or '.join(FORMATS)} "
                          f"and mode {' or '.join(MODES)}")
    _check_shard_entries(manifest, where)
    _check_details(manifest, where)
    check_retired(manifest, where)
    _check_fields_entry(manifest, where)
    check_history(manifest, where)
    return manifest


def accounting_problem(manifest: dict) -> str | None:
    """What is wrong with a (validated) manifest's accounting of its inputs, or None:
    every input the conversion saw was either packed or rejected, so num_inputs ==
    num_samples + len(rejects). Manifests without ``source.num_inputs`` (written before it
    was recorded) have nothing to check. Not part of validate_manifest: a reader needs
    only the shards; ``verify`` reports it and the packer refuses to write a manifest
    that fails it."""
    inputs = manifest["source"].get("num_inputs")
    if inputs is None:
        return None
    packed, rejected = manifest["num_samples"], len(manifest["rejects"])
    if inputs == packed + rejected:
        return None
    return (f"accounting: source.num_inputs is {inputs}, but {packed} samples packed + "
            f"{rejected} rejects = {packed + rejected}: {abs(inputs - packed - rejected)} "
            f"input(s) {'unaccounted for' if inputs > packed + rejected else 'counted twice'}; "
            f"convert the source again")
def _check_fields_entry(manifest: dict, where: str) -> None:
    """Format 3 (and 4, which retires records) declares its fields (maybe none); format 2
    has none, so no ``fields``."""
    if manifest["version"] < FORMAT_VERSION:
        if "fields" in manifest:
            raise FormatError(f"{where}: a format-{manifest['version']} manifest has no "
                              f"'fields'; version {FORMAT_VERSION} is needed for fields")
        return
    if "fields" not in manifest:
        raise FormatError(f"{where}: missing required field 'fields' (format {FORMAT_VERSION})")
    check_field_schema(manifest["fields"], f"{where}: fields")


# The input-stat record (``inputstat.json`` beside the manifest): the size and mtime
# (nanoseconds) of every packed input file when it was packed, so that ``dlpack convert
# --append`` can skip hashing the files that look unchanged (rsync's quick check).
#
# It lives outside the shards on purpose: a shard's bytes must not depend on file times (two
# conversions of the same source give the same shards). Readers of the data set never open
# it; an append reads it and treats it as untrusted input: size bounded before it is read,
# JSON depth bounded, a CRC-32 over its canonical JSON, every number checked. It names the
# checksum of the manifest it was written with (it is written just before that manifest):
# a record naming another manifest (a crash between the two writes, a conversion that did
# not write one) is stale and ignored, and the append hashes every file, as it always did.
#
# Layout: ``{"kind", "version", "manifest": manifest checksum, "paths": [...],
# "size": [...], "mtime_ns": [...], "checksum": CRC-32 of the rest}``, the three lists in
# step (paths as the shard metadata records them).

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
