"""The field block of a format-3 record: how a sample's fields become bytes and back.

Layout (docs/FORMAT.md, "Fields"): the fields of the manifest's schema in sorted name
order; first one u32 length per field, then the values back to back, so
``fields_length = 4 * F + sum(lengths)``. Values: int ``<i8``; float ``<f8``; str UTF-8;
json UTF-8 JSON text (any JSON value); bytes as they are; array ``ndim`` u32 dimensions,
then ``prod(shape)`` little-endian elements in C order. Decoding trusts nothing: every
length, count and shape is checked against the bytes there are before anything is sized
from it, and JSON gets the manifest's depth limit.
"""
from __future__ import annotations

import json
import math
import struct

import numpy as np

from dlpack_io.reader.format.arraycodec import check_shape, compress, decompress
from dlpack_io.reader.format.fieldschema import ARRAY_DTYPES, check_field_name
from dlpack_io.reader.format.schema import MAX_JSON_DEPTH, json_depth
from dlpack_io.reader.format.spec import FormatError

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
    if spec.get("codec"):  # e.g. masks: lossless and ~100x smaller (arraycodec.py)
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
