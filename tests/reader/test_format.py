"""The byte layout of reader/format.py: header, index, manifest schema."""
import numpy as np
import pytest

from dlpack_io.reader import format as fmt


def test_header_round_trip():
    page, header = fmt.pack_header(3, 3 * 64, 17, 0x1234, 0x5678)
    assert len(page) == fmt.HEADER_SIZE
    size = header.meta_offset + header.meta_size
    parsed = fmt.unpack_header(page, size, "x.rec")
    assert parsed == header
    assert header.index_offset == fmt.HEADER_SIZE + 3 * 64
    assert header.meta_offset == header.index_offset + 3 * fmt.INDEX_ENTRY_SIZE


@pytest.mark.parametrize("offset", [0, 8, 12, 20, 60, 100])
def test_header_any_flipped_byte_is_a_format_error(offset):
    page, header = fmt.pack_header(2, 128, 10, 1, 2)
    damaged = bytearray(page)
    damaged[offset] ^= 0x40
    with pytest.raises(fmt.FormatError, match="x.rec"):
        fmt.unpack_header(bytes(damaged), header.meta_offset + header.meta_size, "x.rec")


def test_header_rejects_wrong_file_size():
    page, header = fmt.pack_header(2, 128, 10, 1, 2)
    with pytest.raises(fmt.FormatError, match="truncated"):
        fmt.unpack_header(page, header.meta_offset + header.meta_size - 1, "x.rec")


def test_index_entry_is_32_bytes_little_endian():
    assert fmt.INDEX_DTYPE.itemsize == 32
    entry = np.zeros(1, fmt.INDEX_DTYPE)
    entry["offset"] = 0x0102030405060708
    assert entry.tobytes()[:8] == bytes([8, 7, 6, 5, 4, 3, 2, 1])


def test_index_bounds_are_checked():
    from dlpack_io.reader.format.checks import check_layout

    index = np.zeros(2, fmt.INDEX_DTYPE)
    index["offset"] = [4096, 4096 + 64]
    index["length"] = [10, 100]
    check_layout(index, "s.rec", 4096, 4096 + 64 + 128)  # 100 bytes padded to 128
    with pytest.raises(fmt.FormatError, match="records end at 4288, the data section at 4224"):
        check_layout(index, "s.rec", 4096, 4096 + 128)


def test_record_offsets_formula():
    starts, end = fmt.record_offsets(np.array([1, 64, 65, 2**32 - 1], dtype=np.uint32), 4096)
    assert starts.tolist() == [4096, 4160, 4224, 4352]
    assert end == 4352 + 2**32


@pytest.mark.parametrize("name", ["../shard-00000.rec", "/etc/passwd", "shard-1.rec",
                                  "shard-00000.rec/..", 7, "sub/shard-00000.rec"])
def test_shard_names_cannot_escape_the_folder(name):
    with pytest.raises(fmt.FormatError, match=r"manifest: shard name .* is not of the form "
                                              r"'shard-NNNNN.rec' or 'shard-NNNNN.lmdb'"):
        fmt.check_shard_name(name, "manifest")


def _manifest():
    m = {"kind": fmt.MANIFEST_KIND, "version": fmt.PLAIN_VERSION, "format": "record",
         "mode": "jpeg", "num_samples": 3, "num_bytes": 10, "classes": ["a"],
         "class_counts": [3], "options": {}, "source": {}, "rejects": [], "reencoded": {},
         "lossless": {},
         "created": {}, "shards": [{"name": "shard-00000.rec", "num_samples": 3,
                                    "first_sample": 0, "bytes": 10, "crc": 1}]}
    m["checksum"] = fmt.manifest_checksum(m)
    return m


def test_manifest_validates_and_detects_edits():
    fmt.validate_manifest(_manifest(), "m")
    edited = _manifest()
    edited["num_samples"] = 4
    with pytest.raises(fmt.FormatError, match="checksum"):
        fmt.validate_manifest(edited, "m")


@pytest.mark.parametrize("key,value,match", [
    ("shards", [{"name": "../x.rec", "num_samples": 3, "first_sample": 0, "bytes": 1, "crc": 1}],
     "shard name"),
    ("num_samples", -1, "negative"),
    ("format", "zip", "format"),
    ("classes", "abc", "classes"),
])
def test_manifest_schema_errors(key, value, match):
    m = _manifest()
    m[key] = value
    m["checksum"] = fmt.manifest_checksum(m)
    with pytest.raises(fmt.FormatError, match=match):
        fmt.validate_manifest(m, "m")


def test_decode_json_rejects_non_objects():
    with pytest.raises(fmt.FormatError, match="JSON"):
        fmt.decode_json(b"{not json", "m")
    with pytest.raises(fmt.FormatError, match="object"):
        fmt.decode_json(b"[1, 2]", "m")
