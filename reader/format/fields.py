"""Fields of a format-3 data set: the schema a manifest declares for them (types, names,
array dtypes and shapes), and the field block of a record: how a sample's fields become
bytes and back (arrays optionally compressed, e.g. masks).

Layout (docs/FORMAT.md, "Fields"): the fields of the manifest's schema in sorted name
order; first one u32 length per field, then the values back to back, so
``fields_length = 4 * F + sum(lengths)``. Values: int ``<i8``; float ``<f8``; str UTF-8;
json UTF-8 JSON text (any JSON value); bytes as they are; array ``ndim`` u32 dimensions,
then ``prod(shape)`` little-endian elements in C order. Decoding trusts nothing: every
length, count and shape is checked against the bytes there are before anything is sized
from it, and JSON gets the manifest's depth limit."""
from __future__ import annotations

import json
import math
import re
import struct
import zlib

import numpy as np

from dlpack_io.reader.format.spec import MAX_JSON_DEPTH, FormatError, json_depth

# The field schema of a data set whose samples carry more than an image and a label.
#
# A format-3 manifest holds ``"fields": {name: spec}``; every record then carries one value
# of every field, in a field block after its image (encoded and decoded below).
# A spec is ``{"type": T}`` with T one of FIELD_TYPES; arrays add ``"dtype"`` (one of
# ARRAY_DTYPES), ``"ndim"`` and ``"shape"`` (the shape every record shares, or null when
# records differ). Imported through :mod:`dlpack_io.reader.format`.

# int: <i8; float: <f8; str: UTF-8 text; json: UTF-8 JSON text of any JSON value;
# bytes: opaque bytes; array: ndim x <u4 shape, then the C-order little-endian elements.
FIELD_TYPES = ("int", "float", "str", "json", "bytes", "array")
# "codec" of an array spec: its elements stored compressed (lossless), e.g. masks (issue 25)
ARRAY_CODECS = ("zlib",)
MAX_NAMES, MAX_NAME_CHARS = 100_000, 256  # an id -> name table of an integer array field
ARRAY_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64",
                "int64", "float16", "float32", "float64")
MAX_NDIM = 8
MAX_FIELDS = 256
RESERVED_NAMES = ("image", "label", "index")  # what a sample already has, or a Loader adds
FIELD_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def check_field_name(name, where: str) -> str:
    """Return ``name`` if it can name a field: an identifier of at most 64 characters that
    is not one of RESERVED_NAMES; FormatError naming ``where`` otherwise."""
    if not isinstance(name, str) or not FIELD_NAME_RE.match(name):
        raise FormatError(f"{where}: field name {name!r:.70} is not an identifier of 1..64 "
                          f"letters, digits and '_' (not starting with a digit)")
    if name in RESERVED_NAMES:
        raise FormatError(f"{where}: field name {name!r} clashes with the sample's own "
                          f"{name!r}; rename the field (e.g. {name + '_2'!r})")
    return name


def _check_array_spec(spec: dict, where: str) -> None:
    if spec.get("dtype") not in ARRAY_DTYPES:
        raise FormatError(f"{where}: dtype {spec.get('dtype')!r:.40} is not one of {ARRAY_DTYPES}")
    ndim = spec.get("ndim")
    if not isinstance(ndim, int) or isinstance(ndim, bool) or not 0 <= ndim <= MAX_NDIM:
        raise FormatError(f"{where}: ndim {ndim!r:.40}, expected an integer 0..{MAX_NDIM}")
    if "codec" in spec and spec["codec"] not in ARRAY_CODECS:
        raise FormatError(f"{where}: codec {spec['codec']!r:.40} is not one of {ARRAY_CODECS}")
    if "names" in spec:
        _check_names(spec["names"], spec["dtype"], where)
    shape = spec.get("shape")
    if shape is None:
        return
    if not isinstance(shape, list) or len(shape) != ndim or any(
            not isinstance(d, int) or isinstance(d, bool) or not 0 <= d < 2**32 for d in shape):
        raise FormatError(f"{where}: shape {shape!r:.60}, expected null or {ndim} integers "
                          f"0..{2**32 - 1}")


def _check_names(names, dtype: str, where: str) -> None:
    """An id -> name table (COCO's categories): str(int) keys, short str names."""
    if "int" not in dtype or not isinstance(names, dict) or len(names) > MAX_NAMES:
        raise FormatError(f"{where}: names must be an object of at most {MAX_NAMES} "
                          f"id -> name entries on an integer array")
    for key, name in names.items():
        if not re.fullmatch(r"-?[0-9]{1,19}", key) or not isinstance(name, str) \
                or len(name) > MAX_NAME_CHARS:
            raise FormatError(f"{where}: names entry {key!r:.30}: {name!r:.40}, expected a "
                              f"decimal id and a name of at most {MAX_NAME_CHARS} characters")


def check_field_schema(fields, where: str) -> dict:
    """Validate a manifest's ``fields`` object; return it. FormatError names the field."""
    if not isinstance(fields, dict) or len(fields) > MAX_FIELDS:
        raise FormatError(f"{where}: fields must be an object of at most {MAX_FIELDS} "
                          f"name -> spec entries")
    for name, spec in fields.items():
        at = f"{where}: fields[{name!r:.70}]"
        check_field_name(name, at)
        if not isinstance(spec, dict) or spec.get("type") not in FIELD_TYPES:
            raise FormatError(f"{at}: expected an object with type one of {FIELD_TYPES}")
        extra = set(spec) - ({"type", "dtype", "ndim", "shape", "codec", "names"}
                             if spec["type"] == "array"
                             else {"type"})
        if extra:
            raise FormatError(f"{at}: unknown keys {sorted(extra)} for type {spec['type']!r}")
        if spec["type"] == "array":
            _check_array_spec(spec, at)
    return fields


# Array field values stored compressed: the ``"codec"`` of an array spec (issue 25).
#
# Layout of such a value (docs/FORMAT.md, "Fields"): the ``ndim`` u32 dimensions as for
# any array, then one zlib stream of the ``prod(shape)`` little-endian elements in C order.
# zlib was chosen by measuring segmentation masks (benchmarks/mask_codec.py,
# docs/detection.md): 65x smaller than raw at level 1, decoded faster than PNG, and in the
# standard library. Level 1 because the packer compresses every mask: level 6 is ~2x
# smaller still (1.5 vs 2.9 KB for a 500 x 375 mask, next to a ~60 KB JPEG) but 2.5x
# slower to encode, and no faster to decode. The decoder reads any level. Decoding trusts nothing: the decoded size is computed from the shape
# (Python ints, no overflow), bounded by MAX_DECODED_BYTES before any allocation, and the
# stream is inflated with ``max_length`` so a decompression bomb stops at that size; a
# stream that decodes to any other size, or has bytes after its end, is damaged.
# When the caller knows the record's upright image size (its index entry), ``check_shape``
# bounds the shape by it before anything is inflated: the image's segmentation mask must be
# exactly (height, width), any other compressed value at most VALUES_PER_PIXEL elements per
# pixel; so a hostile shard cannot make a small image's value inflate to 2 GiB.

ZLIB_LEVEL = 1
MAX_DECODED_BYTES = 2**31  # one field value: 2 GiB (a 32768 x 32768 uint16 mask is 2 GiB)
# the packer compresses only masks (one element per pixel); 4 leaves room for a few
# planes per pixel while keeping a value within 4 x the image's own pixel count
VALUES_PER_PIXEL = 4
MASK_FIELD, MASK_DTYPES = "mask", ("uint8", "uint16")


def is_image_mask(name: str, spec: dict) -> bool:
    """True when field ``name`` is the image's segmentation mask as the packer writes it
    (packer/targets.py ``mask_spec``): a compressed 2-D uint8/uint16 ``"mask"``."""
    return name == MASK_FIELD and bool(spec.get("codec")) and spec.get("ndim") == 2 \
        and spec.get("dtype") in MASK_DTYPES


def check_shape(shape: tuple, name: str, spec: dict, image_size, where: str) -> None:
    """FormatError naming ``where`` unless the declared ``shape`` of compressed field
    ``name`` fits the record's upright ``image_size`` (height, width); checked before
    inflating. No check without an image size (a value decoded on its own)."""
    if image_size is None:
        return
    height, width = (int(v) for v in image_size)
    if is_image_mask(name, spec):
        if tuple(shape) != (height, width):
            raise FormatError(f"{where}: mask shape {tuple(shape)}, the record's image is "
                              f"{height}x{width}: a mask must be its image's size; the "
                              f"record is damaged or hostile, repack it")
        return
    count, budget = math.prod(shape), VALUES_PER_PIXEL * height * width
    if count > budget:
        raise FormatError(f"{where}: compressed array of shape {tuple(shape)} ({count} "
                          f"elements) for a {height}x{width} image, at most {budget} "
                          f"({VALUES_PER_PIXEL} per pixel): the record is damaged or hostile")


def compress(data: bytes, codec: str) -> bytes:
    """The stored bytes of an array's elements ``data`` under ``codec``."""
    if codec != "zlib":
        raise ValueError(f"codec {codec!r}: expected 'zlib'")
    return zlib.compress(data, ZLIB_LEVEL)


def decompress(stream, codec: str, expected: int, where: str) -> bytes:
    """The ``expected`` bytes of elements that ``stream`` holds; FormatError naming
    ``where`` when the stream is damaged, too large or decodes to another size."""
    if codec != "zlib":
        raise FormatError(f"{where}: codec {codec!r:.40}, this reader knows 'zlib'")
    if expected > MAX_DECODED_BYTES:
        raise FormatError(f"{where}: the shape asks for {expected} decoded bytes, more than "
                          f"{MAX_DECODED_BYTES} per value: the record is damaged or hostile")
    inflater = zlib.decompressobj()
    try:
        # stops at expected bytes; max_length 0 would mean "no limit", so an empty shape
        # (an image without objects) asks for 1 byte: any byte at all is then refused
        out = inflater.decompress(bytes(stream), max(expected, 1))
    except zlib.error as exc:
        raise FormatError(f"{where}: compressed array does not inflate ({exc})") from None
    if len(out) != expected or not inflater.eof or inflater.unconsumed_tail \
            or inflater.unused_data:
        raise FormatError(f"{where}: compressed array decodes to "
                          f"{'more than ' if inflater.unconsumed_tail else ''}{len(out)} "
                          f"bytes{'' if inflater.eof else ' (stream cut short)'}, its shape "
                          f"needs exactly {expected}: the record is damaged")
    return out


_I8, _F8 = struct.Struct("<q"), struct.Struct("<d")


def spec_of(value, where: str) -> dict:
    """The field spec a first value fixes (type; dtype and ndim for arrays); ValueError
    naming ``where`` for a value no field type can hold."""
    if isinstance(value, np.ndarray):
        if value.dtype.name not in ARRAY_DTYPES:
            raise ValueError(f"{where}: array dtype {value.dtype} is not one of {ARRAY_DTYPES}")
        return {"type": "array", "dtype": value.dtype.name, "ndim": value.ndim,
                "shape": list(value.shape)}
    if isinstance(value, (bool, np.bool_)) or value is None or isinstance(value, (list, tuple, dict)):
        return {"type": "json"}
    if isinstance(value, (int, np.integer)):
        return {"type": "int"}
    if isinstance(value, (float, np.floating)):
        return {"type": "float"}
    if isinstance(value, str):
        return {"type": "str"}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"type": "bytes"}
    raise ValueError(f"{where}: a {type(value).__name__} cannot be stored; use an int, "
                     f"float, str, bytes, numpy array or a JSON value (list, dict, bool, None)")


def _array_bytes(value, spec: dict, where: str) -> bytes:
    if not isinstance(value, np.ndarray) or value.dtype.name != spec["dtype"] \
            or value.ndim != spec["ndim"]:
        found = (f"{value.dtype.name} array of ndim {value.ndim}" if isinstance(value, np.ndarray)
                 else type(value).__name__)
        raise ValueError(f"{where}: {found}, the schema says {spec['dtype']} array of ndim "
                         f"{spec['ndim']} (fixed by the first sample)")
    if any(d >= 2**32 for d in value.shape):
        raise ValueError(f"{where}: shape {value.shape} has a dimension over {2**32 - 1}")
    data = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()
    if spec.get("codec"):  # e.g. masks: lossless and ~100x smaller (fields.py)
        data = compress(data, spec["codec"])
    return struct.pack(f"<{value.ndim}I", *value.shape) + data


def encode_value(value, spec: dict, where: str) -> bytes:
    """The bytes of one field value; ValueError naming ``where`` when it does not match
    ``spec`` (checked before anything is written)."""
    kind = spec["type"]
    if kind == "array":
        return _array_bytes(value, spec, where)
    if kind == "json":
        return _json_bytes(value, where)
    expected = {"int": (int, np.integer), "float": (int, float, np.integer, np.floating),
                "str": str, "bytes": (bytes, bytearray, memoryview)}[kind]
    if not isinstance(value, expected) or isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{where}: {type(value).__name__} {value!r:.40}, the schema says "
                         f"{kind} (fixed by the first sample)")
    if kind == "int":
        if not -2**63 <= int(value) < 2**63:
            raise ValueError(f"{where}: {int(value)} does not fit in a signed 64-bit int")
        return _I8.pack(int(value))
    if kind == "float":
        return _F8.pack(float(value))
    return _utf8(value, where) if kind == "str" else bytes(value)


def _utf8(text: str, where: str) -> bytes:
    """``text`` as UTF-8; ValueError naming a lone surrogate (no UTF-8 can hold one, and a
    reader refuses the bytes a lenient encoder would write)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where}: the text holds a lone surrogate (U+{ord(text[exc.start]):04X} "
                         f"at character {exc.start}), which is not Unicode and cannot be "
                         f"stored as UTF-8; decode the source as UTF-8 (or store bytes)") from None


def _json_bytes(value, where: str) -> bytes:
    """A JSON value as UTF-8 text a reader takes: nested at most MAX_JSON_DEPTH levels,
    no lone surrogate; ValueError naming ``where`` otherwise."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        raise ValueError(f"{where}: a JSON value nested deeper than Python can write; a "
                         f"reader takes at most {MAX_JSON_DEPTH} levels") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not a JSON value ({exc})") from None
    data = _utf8(text, where)
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{where}: JSON nested {depth} levels, a reader takes at most "
                         f"{MAX_JSON_DEPTH}")
    return data


def encode_fields(values: dict, schema: dict, where: str) -> bytes:
    """The field block of one record: ``values`` holds exactly the fields of ``schema``."""
    missing, extra = set(schema) - set(values), set(values) - set(schema)
    if missing or extra:
        raise ValueError(f"{where}: fields {sorted(values)}, the schema (fixed by the first "
                         f"sample) has {sorted(schema)}: missing {sorted(missing)}, "
                         f"unknown {sorted(extra)}")
    parts = [encode_value(values[n], schema[n], f"{where} field {n!r}") for n in sorted(schema)]
    return struct.pack(f"<{len(parts)}I", *map(len, parts)) + b"".join(parts)


def _decode_array(data, spec: dict, where: str, name: str, image_size):
    ndim, dtype = spec["ndim"], np.dtype(spec["dtype"]).newbyteorder("<")
    if len(data) < 4 * ndim:
        raise FormatError(f"{where}: {len(data)} bytes cannot hold the {ndim} dimensions "
                          f"of its shape")
    shape = struct.unpack_from(f"<{ndim}I", data)
    count = math.prod(shape)  # Python ints: no overflow, compared before anything is sized
    if spec.get("codec"):
        check_shape(shape, name, spec, image_size, where)  # before inflating anything
        data = memoryview(data)[:4 * ndim].tobytes() + decompress(
            memoryview(data)[4 * ndim:], spec["codec"], count * dtype.itemsize, where)
    if count * dtype.itemsize != len(data) - 4 * ndim:
        raise FormatError(f"{where}: shape {shape} of {dtype.name} needs "
                          f"{count * dtype.itemsize} bytes, the record holds {len(data) - 4 * ndim}")
    if spec.get("shape") is not None and list(shape) != spec["shape"]:
        raise FormatError(f"{where}: shape {shape}, the manifest says every record has "
                          f"{tuple(spec['shape'])}")
    return np.frombuffer(data, dtype, count, 4 * ndim).reshape(shape).astype(dtype.newbyteorder("="))


def decode_value(data, spec: dict, where: str, *, name: str = "", image_size=None):
    """One field value from its bytes (a bytes-like object the caller owns); a compressed
    array of field ``name`` is bounded by the record's ``image_size`` (height, width)."""
    kind = spec["type"]
    if kind in ("int", "float"):
        if len(data) != 8:
            raise FormatError(f"{where}: {kind} value is {len(data)} bytes, expected 8")
        return (_I8 if kind == "int" else _F8).unpack(data)[0]
    if kind == "array":
        return _decode_array(data, spec, where, name, image_size)
    if kind == "bytes":
        return bytes(data)
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{where}: not valid UTF-8 ({exc})") from None
    if kind == "str":
        return text
    depth = json_depth(text.encode())
    if depth > MAX_JSON_DEPTH:
        raise FormatError(f"{where}: JSON nested {depth} levels, at most {MAX_JSON_DEPTH}")
    try:
        return json.loads(text)
    except ValueError as exc:  # bad JSON, or an integer beyond Python's digit limit
        raise FormatError(f"{where}: not valid JSON ({exc})") from None


def field_spans(block, schema: dict, where: str) -> dict:
    """name -> (start, stop) of each value inside a record's field ``block``, after
    checking that the lengths table and the values exactly fill the block."""
    names = sorted(schema)
    table = 4 * len(names)
    if len(block) < table:
        raise FormatError(f"{where}: field block is {len(block)} bytes, shorter than its "
                          f"{len(names)}-entry length table")
    lengths = struct.unpack_from(f"<{len(names)}I", block)
    if table + sum(lengths) != len(block):  # Python ints: the sum cannot wrap
        raise FormatError(f"{where}: field lengths {list(lengths)[:8]} add up to "
                          f"{table + sum(lengths)} bytes with their table, the block is "
                          f"{len(block)}: the record is damaged")
    spans, pos = {}, table
    for name, n in zip(names, lengths):
        spans[name] = (pos, pos + n)
        pos += n
    return spans


def decode_fields(block, schema: dict, where: str, names=None, image_size=None) -> dict:
    """The values of a record's field ``block`` (bytes the caller owns): every field of
    ``schema``, or only ``names``; FormatError naming ``where`` and the field. With the
    record's upright ``image_size`` (height, width), compressed arrays are bounded by it."""
    spans = field_spans(block, schema, where)
    wanted = sorted(schema) if names is None else names
    view = memoryview(block)
    return {n: decode_value(view[slice(*spans[n])], schema[n], f"{where} field {n!r}",
                            name=n, image_size=image_size) for n in wanted}


__all__ = ["spec_of", "encode_value", "encode_fields", "decode_value", "decode_fields",
           "field_spans", "check_field_name"]
