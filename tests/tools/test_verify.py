"""dlpack verify detects every kind of damage and names where it is."""
import json
import os
import re
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


def _problem_list(dst, decode=False) -> list:
    report = verify(dst, decode=decode, progress=False)
    assert not report.ok and report.exit_code == 1
    return [(p["where"], p["problem"]) for p in report.problems]


def test_intact_datasets_verify(packed):
    for dst in packed.values():
        report = verify(dst, decode=True, progress=False)
        assert report.ok, report.problems
        assert report.records_checked == 24


def _sections(dst):
    shard = RecordShard(str(dst / "shard-00001.rec"))
    h = shard.header
    return shard.path, h


HEX = "0x[0-9a-f]{8}"
# The problem each flipped byte must be reported as (the first check it reaches).
SECTION_PROBLEM = {
    "magic": ("{path}", r"{path}: magic is b'[^']+', expected b'DLPKSHRD': not a dlpack record shard"),
    "counts": ("{path}", rf"{{path}}: header checksum mismatch \(stored {HEX}, computed {HEX}\)"),
    "header_padding": ("{path}", rf"{{path}}: header padding \(bytes {fmt.HEADER_STRUCT.size}..4095\) "
                                 r"is not zero"),
    "index_label": ("{path}", rf"{{path}}: index checksum mismatch \(stored {HEX}, computed {HEX}\)"),
    "index_offset": ("{path}", r"{path}: index checksum mismatch"),
    "data_first": ("{path} record 0", r"record checksum mismatch: damaged data"),
    "data_last": ("{path} record {last}", r"record checksum mismatch: damaged data"),
    "padding": ("{path} record {gap}", r"padding bytes \d+..\d+ after the record are not \d+ zeros"),
    "meta": ("{path}", rf"{{path}}: metadata checksum mismatch \(stored {HEX}, computed {HEX}\)"),
}


@pytest.mark.parametrize("section", sorted(SECTION_PROBLEM))
def test_flipped_byte_in_each_section_is_detected(record_copy, section):
    path, h = _sections(record_copy)
    index = RecordShard(path).index
    offsets = {"magic": 0, "counts": 16, "header_padding": 2000,
               "index_label": h.index_offset + 12, "index_offset": h.index_offset + 32,
               "data_first": h.data_offset, "data_last": int(index["offset"][-1] + index["length"][-1] - 1),
               "meta": h.meta_offset + 3}
    gaps = [j for j, (o, n) in enumerate(zip(index["offset"], index["length"])) if (o + n) % 64]
    offsets["padding"] = int(index["offset"][gaps[0]] + index["length"][gaps[0]])
    _flip(path, offsets[section])
    report = verify(record_copy, progress=False)
    where, problem = SECTION_PROBLEM[section]
    names = dict(path=path, last=len(index) - 1, gap=gaps[0])
    assert [p["where"] for p in report.problems] == [where.format(**names)], report.problems
    assert re.fullmatch(problem.replace("{path}", re.escape(path)) + ".*",
                        report.problems[0]["problem"]), report.problems
    assert report.exit_code == 1


@pytest.mark.parametrize("cut", ["header", "data", "index", "meta", "one_byte"])
def test_truncated_shard_is_detected(record_copy, cut):
    path, h = _sections(record_copy)
    whole = h.meta_offset + h.meta_size
    size = {"header": 100, "data": h.data_offset + 10, "index": h.index_offset + 5,
            "meta": h.meta_offset + 1, "one_byte": whole - 1}[cut]
    os.truncate(path, size)
    assert _problem_list(record_copy) == [
        (path, f"file is {size} bytes, the manifest says {whole} (truncated or appended to)")]


def test_missing_and_zero_length_shards(record_copy):
    os.unlink(record_copy / "shard-00000.rec")
    open(record_copy / "shard-00001.rec", "wb").close()
    problems = _problem_list(record_copy)
    assert problems[0] == (str(record_copy / "shard-00000.rec"),
                           "shard listed in the manifest is missing")
    assert problems[1][0] == str(record_copy / "shard-00001.rec")
    assert re.fullmatch(r"file is 0 bytes, the manifest says \d+ \(truncated or appended to\)",
                        problems[1][1])


def test_edited_manifest_is_detected(record_copy):
    path = record_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["class_counts"][0] += 1  # still valid JSON, still the right types
    manifest["class_counts"][1] -= 1
    path.write_text(json.dumps(manifest))
    problems = _problem_list(record_copy)
    assert len(problems) == 1 and problems[0][0] == str(path)
    assert re.fullmatch(rf"{re.escape(str(path))}: manifest checksum mismatch \(stored 0x[0-9a-f]+, "
                        r"computed 0x[0-9a-f]+\): the manifest was edited or damaged",
                        problems[0][1])


def test_flipped_byte_in_manifest_is_detected(record_copy):
    """Whatever byte flips, verify says the manifest is damaged (and which check saw it)."""
    path = record_copy / "manifest.json"
    data = path.read_bytes()
    for offset in (0, 40, len(data) // 2, len(data) - 1):
        damaged = bytearray(data)
        damaged[offset] ^= 0x10
        path.write_bytes(bytes(damaged))
        report = verify(record_copy, progress=False)
        assert [p["where"] for p in report.problems] == [str(path)]
        assert report.exit_code == 1
        assert re.search(r"not valid UTF-8 JSON|manifest checksum mismatch|missing required "
                         r"field|expected a JSON object", report.problems[0]["problem"]), offset
    path.write_bytes(data)
    assert verify(record_copy, progress=False).ok


def test_missing_manifest(record_copy):
    os.unlink(record_copy / "manifest.json")
    report = verify(record_copy, progress=False)
    assert not report.ok and report.not_a_dataset and report.exit_code == 3
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
    _, j = Dataset(dst).locate(5)
    assert _problem_list(dst) == [(f"{path} record {j}", "record checksum mismatch: damaged data")]


def test_truncated_lmdb_shard_is_detected(packed, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(packed["lmdb"], dst)
    whole = (dst / "shard-00000.lmdb").stat().st_size
    os.truncate(dst / "shard-00000.lmdb", 8192)
    assert _problem_list(dst) == [(str(dst / "shard-00000.lmdb"), f"file is 8192 bytes, the "
                                   f"manifest says {whole} (truncated or appended to)")]


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
    problems = _problem_list(record_copy, decode=True)
    path = str(record_copy / "shard-00001.rec")
    assert [w for w, _ in problems] == [f"{path} record 0"]
    assert problems[0][1].startswith(f"{path} record 0: cannot decode JPEG payload (")


def test_resealed_shard_without_manifest_update_is_detected(record_copy):
    _rewrite_record_consistently(record_copy, 0x41)
    manifest = json.loads((record_copy / "manifest.json").read_text())
    manifest["shards"][1]["crc"] ^= 1
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    (record_copy / "manifest.json").write_text(json.dumps(manifest))
    path = str(record_copy / "shard-00001.rec")
    problems = _problem_list(record_copy)
    assert [w for w, _ in problems] == [path]
    assert re.fullmatch(rf"{re.escape(path)}: shard checksum 0x[0-9a-f]{{8}} differs from the "
                        r"manifest's 0x[0-9a-f]{8}: the file was replaced or damaged", problems[0][1])


def test_many_damaged_records_are_counted_and_20_listed(tmp_path):
    """A shard of 30 records, 25 of them damaged (record CRCs left stale): 20 listed one
    by one, then the count."""
    from dlpack_io.tools.synth import make_image_folder

    make_image_folder(tmp_path / "src", 30, 2, seed=2, size=(16, 16))
    convert(tmp_path / "src", tmp_path / "ds", mode="raw", size=8, shard_size="1MB", workers=0,
            progress=False)
    path = tmp_path / "ds" / "shard-00000.rec"
    index = RecordShard(str(path)).index
    for j in range(25):
        _flip(path, int(index["offset"][j]) + 5)
    problems = _problem_list(tmp_path / "ds")
    assert problems[:20] == [(f"{path} record {j}", "record checksum mismatch: damaged data")
                             for j in range(20)]
    assert problems[20:] == [(str(path), "25 damaged records in all (20 listed)")]


def test_class_counts_must_match_the_stored_labels(record_copy):
    """A label moved to the other class, every CRC up to the manifest resealed but the
    manifest's class_counts left as they were."""
    from crafted import read_shard, reseal_shard

    path = record_copy / "shard-00001.rec"
    _, data, index, meta = read_shard(path)
    old = int(index["label"][0])
    new = (old + 1) % 3
    index["label"][0] = new
    reseal_shard(record_copy, 1, data, index, meta, counts=False)
    manifest = json.loads((record_copy / "manifest.json").read_text())
    stored, names = manifest["class_counts"], manifest["classes"]
    counted = list(stored)
    counted[old] -= 1
    counted[new] += 1
    differ = "; ".join(f"{names[c]}: {counted[c]} stored, {stored[c]} in the manifest"
                       for c in sorted((old, new)))
    assert _problem_list(record_copy) == [(
        str(record_copy / "manifest.json"),
        f"class_counts differ from the labels stored in the shards ({differ})")]


@pytest.mark.parametrize("when", ["after-open", "after-metadata"])
def test_shard_truncated_while_verify_reads_it(record_copy, monkeypatch, when):
    """The shard shrinks while verify reads it (its map was made at open): what can no
    longer be read is reported, never a crash. Truncated right after the open, the
    metadata at the end of the file faults first; after the metadata was read, every
    record does (the guarded copy turns each SIGBUS into an error)."""
    from dlpack_io.reader import jpegdecode
    from dlpack_io.tools import shardcheck

    if not jpegdecode.have_extension():
        pytest.skip("the SIGBUS guard is in the C extension")
    real_open = shardcheck.open_shard
    path = str(record_copy / "shard-00001.rec")

    def open_then_truncate(dataset, entry, *args, **kw):
        shard = real_open(dataset, entry, *args, **kw)
        if shard.path != path:
            return shard
        shard.index  # mapped now
        if when == "after-open":
            os.truncate(path, fmt.HEADER_SIZE)
        else:
            real_meta = shard.meta

            def meta_then_truncate():
                out = real_meta()
                os.truncate(path, fmt.HEADER_SIZE)
                return out
            shard.meta = meta_then_truncate
        return shard

    monkeypatch.setattr(shardcheck, "open_shard", open_then_truncate)
    problems = _problem_list(record_copy)
    if when == "after-open":
        assert [w for w, _ in problems] == [path]
        assert problems[0][1].startswith("cannot read the shard (gather: bus error reading byte")
    else:
        count = json.loads((record_copy / "manifest.json").read_text())["shards"][1]["num_samples"]
        assert [w for w, _ in problems] == [f"{path} record {j}" for j in range(count)]
        assert all(p.startswith("cannot read the record (gather: bus error reading")
                   for _, p in problems)
