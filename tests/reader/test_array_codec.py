"""Compressed array fields (masks, issue 25): lossless round trips, and a damaged or
hostile stream refused before anything is sized from it (no decompression bomb)."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from dlpack_io.reader.format import FormatError
from dlpack_io.reader.format.fields import (MAX_DECODED_BYTES, VALUES_PER_PIXEL, check_field_schema,
                                            decode_fields, decode_value, encode_value)

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


def _bomb(shape, dtype="uint8"):
    """A value declaring ``shape`` whose stream really inflates to it (zeros, ~1000x)."""
    return _value(shape, zlib.compress(bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize), 9))


@pytest.mark.parametrize("shape, match", [
    ((2000, 3000), r"mask shape \(2000, 3000\), the record's image is 20x30"),
    ((30, 20), r"mask shape \(30, 20\), the record's image is 20x30"),  # 600 bytes: not a bomb
    ((20, 31), r"mask shape \(20, 31\)"),
])
def test_a_mask_must_be_its_records_image_size_before_inflating(shape, match):
    spec = dict(SPEC, dtype="uint8")
    with pytest.raises(FormatError, match=match) as info:
        decode_fields(struct.pack("<I", len(_bomb(shape))) + _bomb(shape), {"mask": spec},
                      "shard-00000.rec record 3", image_size=(20, 30))
    assert "shard-00000.rec record 3 field 'mask'" in str(info.value)
    ok = decode_fields(struct.pack("<I", len(_bomb((20, 30)))) + _bomb((20, 30)),
                       {"mask": spec}, "r", image_size=(20, 30))
    assert ok["mask"].shape == (20, 30) and not ok["mask"].any()


def test_other_compressed_arrays_get_a_budget_of_values_per_image_pixel():
    spec = dict(SPEC, ndim=1)  # not the image's mask: any shape within the budget
    budget = VALUES_PER_PIXEL * 20 * 30
    assert decode_value(_bomb((budget,), "uint16"), spec, "r", name="planes",
                        image_size=(20, 30)).shape == (budget,)
    with pytest.raises(FormatError, match=rf"shape \({budget + 1},\) \({budget + 1} elements\) "
                                          rf"for a 20x30 image, at most {budget}"):
        decode_value(_bomb((budget + 1,), "uint16"), spec, "r", name="planes",
                     image_size=(20, 30))
    # an uncompressed value is bounded by its own bytes: no image budget applies
    plain = {k: v for k, v in spec.items() if k != "codec"}
    raw = struct.pack("<I", budget + 1) + bytes(2 * (budget + 1))
    assert decode_value(raw, plain, "r", name="planes", image_size=(20, 30)).size == budget + 1


def test_a_reshaped_mask_in_a_shard_file_is_refused_naming_the_record(tmp_path):
    from dlpack_io.packer import Writer
    from dlpack_io.reader import Dataset

    mask = np.random.default_rng(0).integers(0, 255, (20, 30), dtype=np.uint8)
    with Writer(tmp_path / "ds") as w:
        w.write(image=np.zeros((20, 30, 3), np.uint8), mask=mask)
    shard = tmp_path / "ds" / "shard-00000.rec"
    blob = shard.read_bytes()
    at = blob.index(struct.pack("<2I", 20, 30) + zlib.compress(mask.tobytes(), 1))
    np.testing.assert_array_equal(Dataset(tmp_path / "ds").sample(0)["mask"], mask)
    # same length, same stream: only the declared shape changes (the block CRC is not
    # checked by default, so only the shape rule can see it)
    shard.write_bytes(blob[:at] + struct.pack("<2I", 30, 20) + blob[at + 8:])
    with pytest.raises(FormatError, match=rf"{shard.name} record 0 \(sample 0\) field 'mask': "
                                          rf"mask shape \(30, 20\), the record's image is 20x30"):
        Dataset(tmp_path / "ds").sample(0)
