"""dlpack verify detects every kind of damage and names where it is."""
import json
import os
import shutil

import pytest

from dlpack_io.packer import convert
from dlpack_io.reader import format as fmt
from dlpack_io.reader.shard import RecordShard
from dlpack_io.tools.verification import verify


@pytest.fixture(scope="module")
def packed(image_folder, tmp_path_factory):
    out = {}
    for data_format in ("record", "lmdb"):
        dst = tmp_path_factory.mktemp(data_format) / "ds"
        convert(image_folder, dst, format=data_format, shard_size="40KB", workers=0, progress=False)
        out[data_format] = dst
    return out


@pytest.fixture
def record_copy(packed, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(packed["record"], dst)
    return dst


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def _problems(dst, decode=False):
    report = verify(dst, decode=decode, progress=False)
    assert not report.ok
    return " | ".join(f"{p['where']}: {p['problem']}" for p in report.problems)


def test_intact_datasets_verify(packed):
    for dst in packed.values():
        report = verify(dst, decode=True, progress=False)
        assert report.ok, report.problems
        assert report.records_checked == 24


def _sections(dst):
    shard = RecordShard(str(dst / "shard-00001.rec"))
    h = shard.header
    return shard.path, h


@pytest.mark.parametrize("section", ["magic", "counts", "header_padding", "index_label",
                                     "index_offset", "data_first", "data_last", "padding",
                                     "meta"])
def test_flipped_byte_in_each_section_is_detected(record_copy, section):
    path, h = _sections(record_copy)
    index = RecordShard(path).index
    offsets = {"magic": 0, "counts": 16, "header_padding": 2000,
               "index_label": h.index_offset + 12, "index_offset": h.index_offset + 32,
               "data_first": h.data_offset, "data_last": int(index["offset"][-1] + index["length"][-1] - 1),
               "meta": h.meta_offset + 3}
    gaps = [int(o + n) for o, n in zip(index["offset"], index["length"]) if (o + n) % 64]
    offsets["padding"] = gaps[0]
    _flip(path, offsets[section])
    assert "shard-00001.rec" in _problems(record_copy)


@pytest.mark.parametrize("cut", ["header", "data", "index", "meta", "one_byte"])
def test_truncated_shard_is_detected(record_copy, cut):
    path, h = _sections(record_copy)
    size = {"header": 100, "data": h.data_offset + 10, "index": h.index_offset + 5,
            "meta": h.meta_offset + 1, "one_byte": h.meta_offset + h.meta_size - 1}[cut]
    os.truncate(path, size)
    assert "shard-00001.rec" in _problems(record_copy)


def test_missing_and_zero_length_shards(record_copy):
    os.unlink(record_copy / "shard-00000.rec")
    open(record_copy / "shard-00001.rec", "wb").close()
    text = _problems(record_copy)
    assert "shard-00000.rec" in text and "missing" in text
    assert "shard-00001.rec" in text


def test_edited_manifest_is_detected(record_copy):
    path = record_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["class_counts"][0] += 1  # still valid JSON, still the right types
    path.write_text(json.dumps(manifest))
    assert "checksum" in _problems(record_copy)


def test_flipped_byte_in_manifest_is_detected(record_copy):
    path = record_copy / "manifest.json"
    for offset in (0, 40, len(path.read_bytes()) // 2, len(path.read_bytes()) - 1):
        shutil.copy(path, path.with_suffix(".bak"))
        _flip(path, offset)
        assert "manifest.json" in _problems(record_copy)
        shutil.copy(path.with_suffix(".bak"), path)


def test_missing_manifest(record_copy):
    os.unlink(record_copy / "manifest.json")
    report = verify(record_copy, progress=False)
    assert not report.ok and report.not_a_dataset
    assert "not a dlpack data set (no manifest.json): it holds shard files but no manifest" \
        in report.problems[0]["problem"]


def test_damaged_lmdb_record_is_detected(packed, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(packed["lmdb"], dst)
    from dlpack_io.reader import Dataset

    payload = bytes(Dataset(dst).record(5)[0])
    path = dst / Dataset(dst).manifest["shards"][Dataset(dst).locate(5)[0]]["name"]
    where = path.read_bytes().find(payload[100:200])
    assert where > 0
    _flip(path, where + 7)
    assert "record" in _problems(dst)


def test_truncated_lmdb_shard_is_detected(packed, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(packed["lmdb"], dst)
    os.truncate(dst / "shard-00000.lmdb", 8192)
    assert "shard-00000.lmdb" in _problems(dst)


def _rewrite_record_consistently(dst, junk_byte: int) -> None:
    """Replace record 0 of shard 1 by junk and re-seal every checksum up to the manifest,
    as a buggy writer (not bit rot) would: only --decode can tell."""
    path, h = _sections(dst)
    index = RecordShard(path).index.copy()
    start, length = int(index["offset"][0]), int(index["length"][0])
    junk = bytes([junk_byte]) * length
    index["crc"][0] = fmt.crc32(junk)
    index_bytes = index.tobytes()
    page, header = fmt.pack_header(h.num_records, h.data_size, h.meta_size,
                                   fmt.crc32(index_bytes), h.meta_crc)
    with open(path, "r+b") as f:
        for offset, data in ((start, junk), (h.index_offset, index_bytes), (0, page)):
            f.seek(offset)
            f.write(data)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["shards"][1]["crc"] = header.header_crc
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    (dst / "manifest.json").write_text(json.dumps(manifest))


def test_decode_catches_undecodable_record_with_valid_checksums(record_copy):
    _rewrite_record_consistently(record_copy, 0x41)
    assert verify(record_copy, progress=False).ok
    text = _problems(record_copy, decode=True)
    assert "shard-00001.rec record 0" in text and "decode" in text


def test_resealed_shard_without_manifest_update_is_detected(record_copy):
    _rewrite_record_consistently(record_copy, 0x41)
    manifest = json.loads((record_copy / "manifest.json").read_text())
    manifest["shards"][1]["crc"] ^= 1
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    (record_copy / "manifest.json").write_text(json.dumps(manifest))
    assert "differs from the manifest" in _problems(record_copy)
