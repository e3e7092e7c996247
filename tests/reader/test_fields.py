"""Format 3 fields on the read side: hostile field blocks, damaged bytes, the manifest's
field schema, and format-2 data sets made by the previous dlpack (tests/data)."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from dlpack_io.packer import Writer
from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.fields import decode_fields, encode_fields
from dlpack_io.tools.verification import verify

DATA = Path(__file__).resolve().parent.parent / "data"
# (label, shape, pixel sum) of every sample, read by the format-2 dlpack that packed them
V2_SAMPLES = [(1, (12, 16, 3), 75901), (0, (14, 16, 3), 84004), (1, (14, 16, 3), 85571),
              (1, (13, 16, 3), 79427), (0, (12, 16, 3), 71080), (0, (13, 16, 3), 78806)]


@pytest.mark.parametrize("name", ["v2_record", "v2_lmdb"])
def test_format_2_data_sets_keep_loading_and_verifying(name):
    ds = Dataset(DATA / name, verify_checksums=True)
    assert ds.manifest["version"] == 2 and ds.fields == {}
    got = [(ds[i][1], ds[i][0].shape, int(ds[i][0].astype(np.int64).sum())) for i in range(len(ds))]
    assert got == V2_SAMPLES
    assert set(ds.sample(0)) == {"image", "label"}
    assert verify(DATA / name, decode=True, progress=False).ok


SCHEMA = {"a": {"type": "array", "dtype": "int32", "ndim": 2, "shape": None},
          "j": {"type": "json"}, "s": {"type": "str"}, "n": {"type": "int"}}


def _block(a=np.zeros((2, 3), np.int32), j=None, s="x", n=1):
    return encode_fields({"a": a, "j": j, "s": s, "n": n}, SCHEMA, "w")


@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:10], "shorter than its 4-entry length table"),
    (lambda b: struct.pack("<I", 2**32 - 1) + b[4:], r"add up to \d+ bytes .* the block is"),
    (lambda b: b + b"\0", r"add up to \d+ bytes with their table, the block is"),
    # array shape claims 2**32-1 x 2**32-1 elements: refused before anything is sized
    (lambda b: b[:16] + struct.pack("<II", 2**32 - 1, 2**32 - 1) + b[24:],
     r"field 'a': shape \(4294967295, 4294967295\) of int32 needs \d+ bytes, the record holds 24"),
    (lambda b: b.replace(b"x", b"\xff"), "field 's': not valid UTF-8"),
    (lambda b: b.replace(b"null", b"nul!"), "field 'j': not valid JSON"),
])
def test_hostile_field_blocks_are_refused_naming_the_field(damage, match):
    with pytest.raises(fmt.FormatError, match=match):
        decode_fields(damage(_block()), SCHEMA, "r")


def test_json_depth_limit_applies_to_json_fields():
    deep = _block(j=json.loads("[" * 30 + "]" * 30))
    assert decode_fields(deep, SCHEMA, "r")["j"] == json.loads("[" * 30 + "]" * 30)
    parts = [struct.pack("<2I", 0, 0), b"[" * 40 + b"]" * 40, struct.pack("<q", 1), b"x"]
    too_deep = struct.pack("<4I", *map(len, parts)) + b"".join(parts)  # a, j, n, s
    with pytest.raises(fmt.FormatError, match="field 'j': JSON nested 40 levels, at most 32"):
        decode_fields(too_deep, SCHEMA, "r")


@pytest.mark.parametrize("data_format", ["record", "lmdb"])
def test_a_flipped_field_byte_is_found_by_verify_and_verify_checksums(tmp_path, data_format):
    dst = tmp_path / "ds"
    with Writer(dst, format=data_format) as w:
        for i in range(3):
            w.write(image=np.full((4, 4, 3), i, np.uint8), caption=f"caption number {i}")
    shard = dst / fmt.shard_name(0, data_format)
    data = bytearray(shard.read_bytes())
    at = data.find(b"caption number 1")
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))
    report = verify(dst, progress=False)
    assert [p["problem"] for p in report.problems] == ["field block checksum mismatch: damaged data"]
    assert report.problems[0]["where"].endswith("record 1")
    assert Dataset(dst).sample(1)["caption"] == "baption number 1"  # unchecked: as stored
    with pytest.raises(fmt.FormatError, match="record 1 .*field block checksum mismatch"):
        Dataset(dst, verify_checksums=True).sample(1)


@pytest.mark.parametrize("fields,match", [
    ({"image": {"type": "str"}}, "clashes with the sample's own 'image'"),
    ({"x": {"type": "tensor"}}, "expected an object with type one of"),
    ({"x": {"type": "array", "dtype": "complex64", "ndim": 1, "shape": None}}, "dtype 'complex64'"),
    ({"x": {"type": "array", "dtype": "uint8", "ndim": 2, "shape": [3]}}, "expected null or 2 integers"),
    ({"x": {"type": "str", "ndim": 1}}, r"unknown keys \['ndim'\]"),
])
def test_a_bad_field_schema_refuses_the_manifest(tmp_path, fields, match):
    dst = tmp_path / "ds"
    with Writer(dst) as w:
        w.write(image=np.zeros((4, 4, 3), np.uint8), caption="c")
    m = json.loads((dst / "manifest.json").read_text())
    m["fields"] = fields
    m["checksum"] = fmt.manifest_checksum(m)
    (dst / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(fmt.FormatError, match=match):
        Dataset(dst)


def test_fields_in_a_format_2_manifest_or_missing_from_format_3_are_refused(tmp_path):
    shutil.copytree(DATA / "v2_record", tmp_path / "ds")
    path = tmp_path / "ds" / "manifest.json"
    m = json.loads(path.read_text())
    m["fields"] = {}
    m["checksum"] = fmt.manifest_checksum(m)
    path.write_text(json.dumps(m))
    with pytest.raises(fmt.FormatError, match="a format-2 manifest has no 'fields'"):
        Dataset(tmp_path / "ds")
    del m["fields"]
    m["version"] = 3
    m["checksum"] = fmt.manifest_checksum(m)
    path.write_text(json.dumps(m))
    with pytest.raises(fmt.FormatError, match="missing required field 'fields'"):
        Dataset(tmp_path / "ds")
