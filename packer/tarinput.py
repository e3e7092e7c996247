"""WebDataset tars as conversion inputs (``dlpack convert train-{0000..0099}.tar DST``).

Members are grouped into samples as WebDataset groups them: a member's key is its name up
to the first "." of its base name (folders kept), the rest is its suffix (lower-cased);
consecutive members with the same key form one sample. The image is the member whose
suffix is jpg, jpeg, png or webp (another image suffix, or ``--image-key``); ``cls`` (else
``cls2``; ``--label-key``) is the label: an integer class number, or a class name. Every
other member is a field: ``txt`` -> str, ``json`` -> JSON, ``npy`` -> array, cls/id/index
-> int, anything else -> bytes; ``caption.txt`` is field ``caption`` (``txt`` alone: field
``txt``, as a sidecar of a folder conversion). An ``_export.json`` beside the tars (written
by ``dlpack export --to webdataset``) restores the class names and the field types.

Headers are parsed here, not by ``tarfile``: every size is bounded by the file before it is
used, pax and GNU long-name data are read only up to MAX_META_BYTES, and a member that is a
link (symbolic or hard), a device, a FIFO, or whose name is absolute or holds ".." is a
reject naming the tar and its offset, never followed and never written anywhere. A header
that breaks the framing (bad checksum, a size past the end) rejects the rest of that tar.
"""
from __future__ import annotations

import json
import os
import re

from dlpack_io.packer.fields import MAX_SIDECAR_BYTES, decode_sidecar
from dlpack_io.packer.records import RejectedInput, inflated
from dlpack_io.packer.scan import field_name, shown

BLOCK = 512
MAX_META_BYTES = 2**20
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "jfif", "bmp", "tif", "tiff", "gif", "ppm", "pgm")
INT_SUFFIXES = ("cls", "cls2", "class", "count", "index", "inx", "id")
KINDS = {"txt": "txt", "text": "txt", "json": "json", "jsn": "json", "npy": "npy"}
REGULAR, DIRECTORY = (b"0", b"\0", b"7"), b"5"
WHAT = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device",
        b"4": "a block device", b"6": "a FIFO"}
KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's base_plus_ext


class Broken(Exception):
    """A header that breaks the tar's framing: the rest of the file cannot be trusted.
    ``args``: (offset of the header, what is wrong)."""


def _number(raw: bytes, what: str, at: int) -> int:
    """A header number: octal text, or GNU base-256 (first byte 0x80); bounded to int64."""
    if raw[:1] == b"\x80":
        value = int.from_bytes(raw[1:], "big")
    elif raw[:1] and raw[0] & 0x80:
        raise Broken(at, f"negative or oversized {what}")
    else:
        text = raw.split(b"\0", 1)[0].strip(b" ")
        if text and not re.fullmatch(rb"[0-7]+", text):
            raise Broken(at, f"{what} {text[:20]!r} is not an octal number")
        value = int(text, 8) if text else 0
    if value >= 2**63:
        raise Broken(at, f"{what} {value} is out of range")
    return value


def _header(block: bytes, at: int) -> tuple:
    """(name, type, size, link name) of the header block at offset ``at``."""
    stored = _number(block[148:156], "checksum", at)
    unsigned = sum(block[:148]) + 256 + sum(block[156:])
    signed = unsigned - 2 * sum(b for b in block[:148] + block[156:] if b > 127)
    if stored not in (unsigned, signed):
        raise Broken(at, f"header checksum {stored}, the header sums to {unsigned}: not a "
                         f"tar, or damaged")
    name = block[:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0" and block[345]:
        name = block[345:500].split(b"\0", 1)[0] + b"/" + name
    return (name, block[156:157], _number(block[124:136], "size", at),
            block[157:257].split(b"\0", 1)[0])


def _pax(data: bytes, at: int) -> dict:
    """The records ``LEN key=value\\n`` of a pax extended header."""
    out, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        length = re.match(rb"(\d{1,7}) ", data[pos:pos + 9])
        end = pos + int(length.group(1)) if length else 0
        if not length or end > len(data) or end <= pos or data[end - 1:end] != b"\n":
            raise Broken(at, f"pax header record at +{pos} is malformed")
        key, _, value = data[pos + len(length.group(0)):end - 1].partition(b"=")
        out[key] = value
        pos = end
    return out


def members(f, total: int):
    """Yield (name, type, data offset, size, link name, header offset) of each member of
    the open tar ``f`` of ``total`` bytes; Broken when a header breaks the framing."""
    pos, pending = 0, {}
    while pos + BLOCK <= total:
        block = os.pread(f.fileno(), BLOCK, pos)
        if block == bytes(BLOCK):
            return
        name, kind, size, link = _header(block, pos)
        if b"size" in pending and kind not in (b"x", b"g"):
            text = pending.pop(b"size")
            if not re.fullmatch(rb"\d{1,19}", text):
                raise Broken(pos, f"pax size {text[:20]!r} is not a number")
            size = int(text)
        if size > total - pos - BLOCK:
            raise Broken(pos, f"member claims {size} bytes, the file has "
                              f"{total - pos - BLOCK} after its header: truncated or damaged")
        if kind in (b"x", b"g", b"L", b"K"):
            if size > MAX_META_BYTES:
                raise Broken(pos, f"extended header of {size} bytes, more than "
                                  f"{MAX_META_BYTES}")
            data = os.pread(f.fileno(), size, pos + BLOCK)
            if kind == b"x":
                pending.update(_pax(data, pos))
            elif kind in (b"L", b"K"):
                pending[b"path" if kind == b"L" else b"linkpath"] = data.split(b"\0", 1)[0]
        else:
            yield (pending.pop(b"path", name).decode("utf-8", "surrogateescape"), kind,
                   pos + BLOCK, size, pending.pop(b"linkpath", link), pos)
            pending.clear()
        pos += BLOCK + -(-size // BLOCK) * BLOCK


def _refusal(name: str, kind: bytes, link: bytes) -> str | None:
    """Why a member cannot be an input (a link, a device, a path leaving the tar), or None."""
    if kind in WHAT:
        to = f" to {shown(link.decode('utf-8', 'surrogateescape'))!r}" if kind in b"12" else ""
        return f"{WHAT[kind]}{to}: links and special files are never followed or extracted"
    if kind not in REGULAR:
        return f"member type {kind!r} is not a regular file"
    if name.startswith("/") or ".." in name.split("/"):
        return "an absolute path or one with '..': it would leave the archive"
    return None


def _samples(source, where_of):
    """Yield (key, {suffix: (data offset, size, header offset)}) or (name, reason) rejects
    of one tar, grouped by WebDataset's rule."""
    key, group = None, {}
    with open(source.path, "rb") as f:
        try:
            for name, kind, offset, size, link, at in members(f, os.fstat(f.fileno()).st_size):
                why = None if kind == DIRECTORY else _refusal(name, kind, link)
                if why:
                    yield name, f"{where_of(at)}: member {shown(name)!r} is {why}"
                    continue
                m = KEY_RE.match(name)
                if kind == DIRECTORY or m is None or re.match(r"__[^/]*__($|/)", name):
                    continue  # WebDataset skips these too: no suffix, or __meta__ members
                if m.group(1) != key and group:
                    yield key, group
                    group = {}
                key, suffix = m.group(1), m.group(2).lower()
                group[suffix] = (offset, size, at) if suffix not in group else None
        except Broken as exc:
            at, why = exc.args
            yield f"@{at}", f"{where_of(at)}: {why}; the rest of this tar is skipped"
        if group:
            yield key, group


def _value(f, source, suffix: str, span: tuple):
    """The field value of member ``suffix`` (read whole, at most MAX_SIDECAR_BYTES)."""
    offset, size, at = span
    where = f"{source.name}: member .{suffix} at offset {at}"
    if size > MAX_SIDECAR_BYTES:
        raise RejectedInput(f"{where}: {size} bytes, more than {MAX_SIDECAR_BYTES}")
    data = os.pread(f.fileno(), size, offset)
    ext = suffix.rsplit(".", 1)[-1]
    if ext in INT_SUFFIXES:
        text = data.strip()
        if not re.fullmatch(rb"-?\d{1,18}", text):
            raise RejectedInput(f"{where}: {text[:20]!r} is not an integer")
        return int(text)
    if ext in KINDS:
        from dlpack_io.reader.format.schema import MAX_JSON_DEPTH, json_depth

        if KINDS[ext] == "json" and json_depth(data) > MAX_JSON_DEPTH:
            raise RejectedInput(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        return decode_sidecar(data, KINDS[ext], where)
    return data


def _row(f, source, key: str, group: dict, image_key, label_key) -> tuple:
    """(label or None, fields, image span) of one sample; RejectedInput saying why not."""
    twice = [s for s, v in group.items() if v is None]
    if twice:
        raise RejectedInput(f"two members named {key}.{twice[0]}")
    image = image_key or next((s for s in IMAGE_SUFFIXES if s in group), None)
    if image not in group:
        raise RejectedInput(f"no image member ({image_key or '/'.join(IMAGE_SUFFIXES[:4])}) "
                            f"among .{', .'.join(sorted(group))}")
    label = label_key or next((s for s in ("cls", "cls2") if s in group), None)
    raw = None
    if label in group:
        raw = os.pread(f.fileno(), min(group[label][1], 4096), group[label][0]).strip()
        raw = int(raw) if re.fullmatch(rb"\d{1,18}", raw) else raw.decode("utf-8", "replace")
    fields = {}
    for suffix in sorted(set(group) - {image, label}):
        name = field_name(suffix.rsplit(".", 1)[0] if "." in suffix else suffix)
        if name in fields:
            raise RejectedInput(f"members .{suffix} and another both make field {name!r}")
        fields[name] = _value(f, source, suffix, group[suffix])
    return raw, fields, group[image]


def read_tars(files, members_, spool, *, image_key=None, label_key=None, root="", **_):
    """(rows, classes, schema) of the samples in WebDataset tars ``files`` (SourceFile);
    each image's span goes into ``members_``. Rows: (name, label, fields or reason)."""
    rows, seen = [], set()
    for source in files:
        tar = inflated(source, spool)
        with open(tar.path, "rb") as f:
            for key, group in _samples(tar, lambda at, s=source: f"{s.name}: offset {at}"):
                name = f"{source.name}/{key}"
                name = name if name not in seen else f"{name}#{len(seen)}"
                seen.add(name)
                if isinstance(group, str):
                    rows.append((shown(name), None, group))
                    continue
                try:
                    label, fields, (offset, size, _) = _row(f, source, key, group, image_key,
                                                            label_key)
                except RejectedInput as exc:
                    rows.append((shown(name), None, f"{source.name}: sample {key!r}: {exc}"))
                    continue
                members_.add(shown(name), tar.path, offset, size, source.stat)
                rows.append((shown(name), label, fields))
    classes, schema = exported_info(root)
    return rows, classes, schema


def exported_info(root) -> tuple:
    """(class names, field schema) from the ``_export.json`` beside the files, when
    ``dlpack export`` wrote one there; (None, None) otherwise."""
    path = os.path.join(root, "_export.json") if root and "://" not in root else None
    if not path or not os.path.isfile(path) or os.path.getsize(path) > 64 * 2**20:
        return None, None
    try:
        with open(path, "rb") as f:
            info = json.loads(f.read())
    except ValueError:
        return None, None
    if not isinstance(info, dict) or info.get("kind") != "dlpack-export":
        return None, None
    from dlpack_io.reader.format import FormatError
    from dlpack_io.reader.format.fields import check_field_schema

    classes, fields = info.get("classes") or None, info.get("fields") or None
    try:
        if fields is not None:
            check_field_schema(fields, path)
        if classes is not None and not all(isinstance(c, str) for c in classes):
            raise FormatError(f"{path}: classes must be a list of names")
    except FormatError as exc:
        raise ValueError(f"{exc}; remove {path} to convert the tars without it") from None
    return classes, fields
