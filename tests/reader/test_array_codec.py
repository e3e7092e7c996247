"""Compressed array fields (masks, issue 25): lossless round trips, and a damaged or
hostile stream refused before anything is sized from it (no decompression bomb)."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from dlpack_io.reader.format import FormatError
from dlpack_io.reader.format.arraycodec import MAX_DECODED_BYTES
from dlpack_io.reader.format.fields import decode_value, encode_value
from dlpack_io.reader.format.fieldschema import check_field_schema

SPEC = {"type": "array", "dtype": "uint16", "ndim": 2, "shape": None, "codec": "zlib"}


def test_round_trip_is_exact_and_small():
    mask = np.zeros((375, 500), np.uint16)
    mask[100:200, 50:300] = 1234
    mask[-1, -1] = 65535
    data = encode_value(mask, SPEC, "m")
    assert len(data) < 2000  # raw: 375 000 bytes
    out = decode_value(data, SPEC, "m")
    assert out.dtype == np.uint16 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, mask)
    empty = np.zeros((0, 7), np.uint16)
    assert decode_value(encode_value(empty, SPEC, "m"), SPEC, "m").shape == (0, 7)


def _value(shape, stream):
    return struct.pack(f"<{len(shape)}I", *shape) + stream


@pytest.mark.parametrize("value, match", [
    (_value((10, 10), zlib.compress(bytes(199))), r"decodes to 199 bytes.*needs exactly 200"),
    (_value((10, 10), zlib.compress(bytes(10**6))), r"more than 200 bytes"),  # a small bomb
    (_value((10, 10), zlib.compress(bytes(200)) + b"x"), r"damaged"),  # bytes after the end
    # an empty shape (no objects) must not lift the bound: zlib reads max_length 0 as none
    (_value((0, 7), zlib.compress(bytes(10**6))), r"more than 1 bytes.*needs exactly 0"),
    (_value((10, 10), zlib.compress(bytes(200))[:-6]), r"cut short"),
    (_value((10, 10), b"not zlib at all"), r"does not inflate"),
    (_value((2**32 - 1, 2**32 - 1), zlib.compress(b"")), f"more than {MAX_DECODED_BYTES}"),
    (b"\x01", r"cannot hold the 2 dimensions"),
])
def test_damaged_or_hostile_streams_are_refused(value, match):
    with pytest.raises(FormatError, match=match) as info:
        decode_value(value, SPEC, "shard-00000.dlp record 3 field 'mask'")
    assert "record 3 field 'mask'" in str(info.value)


@pytest.mark.parametrize("spec, match", [
    (dict(SPEC, codec="lz4"), "codec 'lz4'"),
    (dict(SPEC, dtype="int64", names={"1": "person", "x": "car"}), "names entry 'x'"),
    (dict(SPEC, dtype="float32", names={"1": "person"}), "integer array"),
    (dict(SPEC, dtype="int64", names={"1": 5}), "names entry '1'"),
])
def test_schema_refuses_unknown_codecs_and_bad_name_tables(spec, match):
    with pytest.raises(FormatError, match=match):
        check_field_schema({"f": spec}, "manifest.json")
    good = dict(SPEC, dtype="int64", names={"1": "person", "-3": "car"})
    assert check_field_schema({"f": good}, "manifest.json")["f"] is good
