"""TFRecord and MXNet RecordIO files as conversion inputs, read without TensorFlow or MXNet.

TFRecord: records ``u64 length, u32 masked CRC-32C of it, data, u32 masked CRC-32C of the
data`` (little-endian; masked: rotated right 15, plus 0xa282ead8), both CRCs checked; gzip'd
files are inflated into the spool first. The data, a ``tf.train.Example``, is parsed here
with every varint and length bounded by its message: ``image/encoded`` (--image-key) is the
image, ``image/class/label`` (--label-key; a text feature: class names) the label, every
other feature a field (``image/height`` -> ``image_height``): its one value (int, float,
str, bytes), or an int64/float32 array (a list of texts) when any record holds other than one.
RecordIO (im2rec): ``u32 magic 0xced7230a, u32 flag << 29 | length``, data padded to 4
bytes; split records (flags 1, 2, 3) are joined with the magic between their parts. Data:
IRHeader ``u32 flag, f32 label, u64 id, u64 id2``, ``flag`` float32 labels, the image.
Labels all integers: classes (else a float field ``target``); ``id``, ``labels`` (flag > 0):
fields. ``NAME.idx`` (``key<TAB>offset``) lists the records. A bad record is a reject naming
file and offset; a bad length (the framing is lost) rejects the rest of that file only.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from dlpack_io.packer.records import inflated
from dlpack_io.packer.scan import field_name, shown

MAX_RECORD_BYTES = 2**31  # one record is read whole (its image and its features)
RECORDIO_MAGIC = 0xCED7230A
IRHEADER = struct.Struct("<IfQQ")
_state: dict = {}


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of ``data``, by the ``crc32c`` package (hardware instructions);
    ImportError saying how to install it."""
    if "crc32c" not in _state:
        try:
            from crc32c import crc32c as fast
        except ImportError:
            raise ImportError("TFRecord CRCs need the crc32c package: pip install "
                              "'dlpack-io[tfrecord]'") from None
        _state["crc32c"] = fast
    return _state["crc32c"](data)


def masked_crc(data) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecords(fd: int, total: int):
    """Yield (offset, data) of each record of a TFRecord file, or (offset, reason) for a
    bad one; a length that cannot be trusted ends the file."""
    pos = 0
    while pos < total:
        head = os.pread(fd, 12, pos)
        length, stored = struct.unpack("<QI", head) if len(head) == 12 else (0, None)
        why = "truncated record header" if stored is None else f"length CRC-32C mismatch " \
            f"(stored {stored:#010x}, computed {masked_crc(head[:8]):#010x})" \
            if masked_crc(head[:8]) != stored else f"record length {length}, but " \
            f"{total - pos - 16} bytes are left (at most {MAX_RECORD_BYTES})" \
            if length > min(total - pos - 16, MAX_RECORD_BYTES) else None
        if why:
            yield pos, f"{why}; the rest of the file ({total - pos} bytes) is skipped"
            return
        data = os.pread(fd, length + 4, pos + 12)
        stored = int.from_bytes(data[length:], "little")
        if masked_crc(memoryview(data)[:length]) != stored:
            yield pos, (f"data CRC-32C mismatch (stored {stored:#010x}, computed "
                        f"{masked_crc(memoryview(data)[:length]):#010x}): damaged record")
        else:
            yield pos, memoryview(data)[:length]
        pos += 16 + length


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 64:
        value, pos, shift = value | (buf[pos] & 0x7F) << shift, pos + 1, shift + 7
        if buf[pos - 1] < 0x80 and value < 2**64:
            return value, pos
    raise ValueError(f"varint at +{pos} is truncated or over 64 bits")


def _fields(buf, pos: int, end: int):
    """Yield (field number, wire type, value or (start, end) span) of a message."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        wire = key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield key >> 3, 0, value
            continue
        if wire == 2:
            size, pos = _varint(buf, pos, end)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire} at +{pos} (only 0, 1, 2, 5 occur in an Example)")
        if size > end - pos:
            raise ValueError(f"field of {size} bytes at +{pos}, {end - pos} left in its message")
        yield key >> 3, wire, (pos, pos + size)
        pos += size


def _values(buf, span, kind: str) -> list:
    """The values of a BytesList (spans), FloatList or Int64List (packed or not)."""
    out = []
    for num, wire, v in _fields(buf, *span):
        if num != 1:
            continue
        if kind == "bytes" and wire == 2:
            out.append(v)
        elif kind == "float" and wire in (2, 5):
            if (v[1] - v[0]) % 4:
                raise ValueError(f"packed floats of {v[1] - v[0]} bytes at +{v[0]}")
            out.extend(np.frombuffer(buf[v[0]:v[1]], "<f4").tolist())
        elif kind == "int64" and wire == 0:
            out.append(v - 2**64 if v >= 2**63 else v)
        elif kind == "int64" and wire == 2:
            pos = v[0]
            while pos < v[1]:
                x, pos = _varint(buf, pos, v[1])
                out.append(x - 2**64 if x >= 2**63 else x)
    return out


def example_features(buf) -> dict:
    """name -> (kind, values) of a serialized tf.train.Example; ValueError when malformed."""
    out = {}
    for num, wire, features in _fields(buf, 0, len(buf)):
        for n2, w2, entry in (_fields(buf, *features) if (num, wire) == (1, 2) else ()):
            key = feature = None
            for n3, w3, v in (_fields(buf, *entry) if (n2, w2) == (1, 2) else ()):
                if w3 == 2 and n3 == 1:
                    key = bytes(buf[v[0]:v[1]]).decode("utf-8")
                elif w3 == 2 and n3 == 2:
                    feature = v
            kind, values = "bytes", []
            for n4, w4, lst in (_fields(buf, *feature) if feature else ()):
                if w4 == 2 and n4 in (1, 2, 3):
                    kind = ("bytes", "float", "int64")[n4 - 1]
                    values = _values(buf, lst, kind)
            if key is not None:
                out[key] = (kind, values)
    return out


def _example_row(data, at: int, image_key: str, label_key: str):
    """(label, features, image span in the file) of one record at offset ``at``."""
    try:
        features = example_features(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a tf.train.Example ({exc})") from None
    kind, values = features.pop(image_key, ("bytes", []))
    if kind != "bytes" or len(values) != 1:
        raise ValueError(f"no single {image_key!r} bytes feature (found {kind} x{len(values)};"
                         f" features: {', '.join(sorted(features))[:200]}); pass --image-key")
    label = features.pop(label_key, None)
    if label is not None:
        label = label[1][0] if len(label[1]) == 1 else None
        label = bytes(data[label[0]:label[1]]).decode("utf-8", "replace") \
            if isinstance(label, tuple) else label
    start, end = values[0]
    return label, features, (at + 12 + start, end - start)


def _text(values: list) -> list:
    try:  # text when every value is UTF-8, else bytes
        return [v.decode("utf-8") for v in values]
    except UnicodeDecodeError:
        return values


def _feature_value(kind: str, values: list, many: bool):
    if not many:
        return values[0]
    if kind == "bytes":
        return list(values)  # several texts: a JSON list
    return np.asarray(values, np.float32 if kind == "float" else np.int64)


def _settle(rows: list) -> list:
    """Rows with final field values: a feature holding other than one value in any record
    is an array (int64, float32) or a list of texts in every record, else its one value."""
    many = {n for *_, f in rows if not isinstance(f, str) for n, (_, v) in f.items() if len(v) - 1}
    return [(name, label, fields if isinstance(fields, str) else
             {field_name(n): _feature_value(k, v, n in many) for n, (k, v) in fields.items()})
            for name, label, fields in rows]


def _read_tfrecord(source, spool, members, rows, image_key, label_key) -> None:
    image_key, label_key = image_key or "image/encoded", label_key or "image/class/label"
    local = inflated(source, spool)
    with open(local.path, "rb") as f:
        for n, (at, data) in enumerate(tfrecords(f.fileno(), os.fstat(f.fileno()).st_size)):
            name = shown(f"{source.name}#{n}")
            try:
                if isinstance(data, str):
                    raise ValueError(data)
                label, features, (offset, length) = _example_row(data, at, image_key, label_key)
            except ValueError as exc:
                rows.append((name, None, f"{source.name}: record {n} at offset {at}: {exc}"))
                continue
            members.add(name, local.path, offset, length, source.stat)
            rows.append((name, label, {k: (kind, _text([bytes(data[a:b]) for a, b in v])
                                           if kind == "bytes" else v)
                                       for k, (kind, v) in features.items()}))


def _recordio_at(fd: int, pos: int, total: int):
    """(parts [(offset, length)], next offset) of the RecordIO record at ``pos``."""
    parts = []
    while True:
        head = os.pread(fd, 8, pos)
        magic, word = struct.unpack("<II", head) if len(head) == 8 else (None, 0)
        if magic != RECORDIO_MAGIC:
            raise ValueError(f"no RecordIO magic at offset {pos} (found "
                             f"{'end of file' if magic is None else hex(magic)})")
        flag, length = word >> 29, word & (2**29 - 1)
        if length > total - pos - 8 or (flag in (2, 3)) != bool(parts):
            raise ValueError(f"part at offset {pos}: length {length}, flag {flag} do not fit")
        parts.append((pos + 8, length))
        pos += 8 + length + (-length % 4)
        if flag in (0, 3):
            return parts, pos


def _irheader_row(fd: int, path: str, parts: list, name: str, members, spool, stat):
    """(label, fields) of one im2rec record; its image span goes into ``members``."""
    data = struct.pack("<I", RECORDIO_MAGIC).join(os.pread(fd, n, at) for at, n in parts) \
        if len(parts) > 1 else os.pread(fd, min(parts[0][1], IRHEADER.size + 4 * 2**16), parts[0][0])
    if len(data) < IRHEADER.size:
        raise ValueError(f"{len(data)} bytes, shorter than the 24-byte IRHeader")
    flag, label, ident, _ = IRHEADER.unpack_from(data)
    start = IRHEADER.size + 4 * flag
    total = len(data) if len(parts) > 1 else parts[0][1]  # split: the magic words back in
    if start >= total:
        raise ValueError(f"IRHeader flag {flag} claims {4 * flag} label bytes; the record has "
                         f"{total - IRHEADER.size} after its header and no image")
    fields = {"id": ident}
    if flag:
        fields["labels"] = np.frombuffer(data, "<f4", flag, IRHEADER.size).astype(np.float32)
    if len(parts) == 1:
        members.add(name, path, parts[0][0] + start, total - start, stat)
    else:  # a split record: its image is joined into the spool
        members.add(name, spool.write(name + ".joined", data[start:]), 0, total - start, stat)
    return (fields["labels"][0] if flag == 1 else None if flag else label), fields


def _recordio_offsets(source, total: int):
    """(key, offset) of the records NAME.idx beside the .rec lists; None without one."""
    idx = os.path.splitext(source.path)[0] + ".idx"
    if not os.path.isfile(idx):
        return None
    with open(idx, "rb") as f:
        lines = [(n, line.split()) for n, line in enumerate(f, 1) if line.strip()]
    for n, parts in lines:
        if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) >= total:
            raise ValueError(f"{idx}:{n}: expected 'key<TAB>offset' with an offset below the "
                             f".rec's {total} bytes; fix or delete the .idx")
    return [(parts[0].decode("utf-8", "replace"), int(parts[1])) for _, parts in lines]


def _read_recordio(source, spool, members, rows) -> None:
    with open(source.path, "rb") as f:
        fd, total = f.fileno(), os.fstat(f.fileno()).st_size
        listed, pos, n = _recordio_offsets(source, total), 0, 0
        while (n < len(listed)) if listed is not None else pos < total:
            key, at = listed[n] if listed is not None else (str(n), pos)
            name, n = shown(f"{source.name}#{key}"), n + 1
            try:
                parts, pos = _recordio_at(fd, at, total)
                label, fields = _irheader_row(fd, source.path, parts, name, members, spool,
                                              source.stat)
            except ValueError as exc:
                rows.append((name, None, f"{source.name}: record at offset {at}: {exc}" + (
                    "; the rest of the file is skipped" if listed is None else "")))
                if listed is None:
                    return
                continue
            rows.append((name, label, fields))


def _recordio_labels(rows: list) -> list:
    """Float labels as class numbers when all are integers, else a float field."""
    if all(float(x).is_integer() and x >= 0 for _, x, _ in rows if x is not None):
        return [(n, None if x is None else int(x), f) for n, x, f in rows]
    return [(n, None, f if isinstance(f, str) or x is None else dict(f, target=float(x)))
            for n, x, f in rows]


def read_framed(files, members, spool, *, kind: str, image_key=None, label_key=None, **_):
    """(rows, classes, schema) of TFRecord (``kind`` "tfrecord") or RecordIO files."""
    rows: list = []
    for source in files:
        _read_tfrecord(source, spool, members, rows, image_key, label_key) \
            if kind == "tfrecord" else _read_recordio(source, spool, members, rows)
    return (_settle(rows) if kind == "tfrecord" else _recordio_labels(rows)), None, None
