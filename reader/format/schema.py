"""Shard metadata and manifest JSON: canonical encoding, the depth-checked parser, and the
manifest schema with its own checksum. Imported through :mod:`dlpack_io.reader.format`."""
from __future__ import annotations

import json
import re

import numpy as np

from dlpack_io.reader.format.fieldschema import check_field_schema
from dlpack_io.reader.format.history import check_history
from dlpack_io.reader.format.retired import RETIRING_VERSION, check_retired
from dlpack_io.reader.format.spec import (FORMAT_VERSION, FORMATS, MAGIC, MANIFEST_KIND,
                                          MAX_JSON_INT, MODES, PLAIN_VERSION, READABLE_VERSIONS,
                                          SHARD_NAME_RE, SHARD_SUFFIX, FormatError, crc32,
                                          index_dtype, max_shard_bytes, version_error)


def encode_meta(meta: dict) -> bytes:
    """Canonical JSON bytes for shard metadata or a manifest (sorted keys, compact)."""
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


MAX_JSON_DEPTH = 32  # our manifests and shard metadata nest 3 deep
_JSON_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: fast
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[[ord("["), ord("{")]], _BRACKET_STEP[[ord("]"), ord("}")]] = 1, -1


def json_depth(data: bytes) -> int:
    """How deep the brackets of JSON text ``data`` nest, strings left out (no recursion)."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cannot nest deeper than that: the common small case costs nothing
    bare = np.frombuffer(_JSON_STRING_RE.sub(b'""', data), dtype=np.uint8)
    return int(np.cumsum(_BRACKET_STEP[bare], dtype=np.int64).max(initial=0))


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
