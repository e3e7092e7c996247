"""dlpack convert from WebDataset tars, TFRecord, RecordIO and Parquet: samples, labels,
fields and rejects (a bad record names its file and offset; a hostile tar member is never
followed), brace patterns, --append, and the CRC-32C the TFRecord reader checks against
published test vectors."""
from __future__ import annotations

import gzip
import io
import json
import tarfile

import numpy as np
import pytest

from formatwriters import add_member, example, irheader, photos, recordio, tfrecord
from dlpack_io.packer import convert
from dlpack_io.packer.framed import crc32c, example_features, masked_crc, tfrecords
from dlpack_io.reader import Dataset

QUICK = dict(workers=1, progress=False, shuffle=False)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return photos(tmp_path_factory.mktemp("photos"), 9, seed=4)


def _rejects(dst) -> list:
    return (dst / "rejects.tsv").read_text().splitlines()[1:]


def test_crc32c_and_the_masked_crc_match_the_published_values():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(bytes(32)) == 0x8A9136AA and crc32c(b"\xff" * 32) == 0x62A8AB43  # RFC 3720
    assert masked_crc(b"123456789") == 0xC78AB0E5  # (rotr15(0xe3069283) + 0xa282ead8) mod 2^32
    # one record "abc" as TensorFlow's writer frames it (length, masked CRCs)
    golden = bytes.fromhex("0300000000000000b099490e6162636e57f121")
    import os
    import tempfile
    with tempfile.TemporaryFile() as f:
        f.write(golden + golden[:5])
        f.flush()
        found = list(tfrecords(f.fileno(), len(golden) + 5))
    assert bytes(found[0][1]) == b"abc" and found[1][0] == len(golden)
    assert "truncated record header" in found[1][1] and len(found) == 2
    os.sync  # (no file left behind: TemporaryFile)


def test_example_parser_reads_every_feature_kind_and_refuses_lies():
    buf = example({"b": [b"x", b"yz"], "f": [0.5, -2.0], "i": [-1, 2**40], "one": 7})
    found = example_features(buf)
    assert found["f"] == ("float", [0.5, -2.0]) and found["i"] == ("int64", [-1, 2**40])
    assert [bytes(buf[a:b]) for a, b in found["b"][1]] == [b"x", b"yz"]
    for bad in (buf[:-1], b"\x0a\xff\xff\xff\xff\x0f", b"\x0b", b"\x0a" + b"\xff" * 11):
        with pytest.raises(ValueError):
            example_features(bad)


def _tars(root, images):
    root.mkdir()
    for s in range(2):
        with tarfile.open(root / f"train-{s:04d}.tar", "w") as t:
            for k in range(4):
                key, i = f"d/s{s}_{k}", 4 * s + k
                add_member(t, f"{key}.jpg", images[i])
                add_member(t, f"{key}.cls", str(i % 3).encode())
                add_member(t, f"{key}.caption.txt", f"photo {i}".encode())
                out = io.BytesIO()
                np.save(out, np.full(3, i, np.float16))
                add_member(t, f"{key}.emb.npy", out.getvalue())
                add_member(t, f"{key}.json", json.dumps({"i": i}).encode())
            add_member(t, "evil.jpg", kind=tarfile.SYMTYPE, link="/etc/passwd")
            add_member(t, "hard.jpg", kind=tarfile.LNKTYPE, link="d/s0_0.jpg")
            add_member(t, "fifo.jpg", kind=tarfile.FIFOTYPE)
            add_member(t, "../../escape.jpg", b"x")
            add_member(t, "/abs.jpg", b"x")
            add_member(t, "nolabel.jpg", images[8])
    return root


def test_webdataset_tars_by_brace_pattern_with_fields_and_hostile_members(tmp_path, images):
    src = _tars(tmp_path / "wds", images)
    dst = tmp_path / "out"
    result = convert(str(src / "train-{0000..0001}.tar"), dst, **QUICK)
    assert result["num_samples"] == 8
    ds = Dataset(dst)
    assert ds.classes == ["0", "1", "2"] and set(ds.fields) == {"caption", "emb", "json"}
    s = ds.sample(5)
    assert (s["label"], s["caption"], s["json"], s["emb"].tolist()) == (2, "photo 5", {"i": 5},
                                                                        [5, 5, 5])
    rejects = _rejects(dst)
    assert len(rejects) == 12  # 5 hostile members + one unlabelled sample, per tar
    text = "\n".join(rejects)
    for what in ("symbolic link to '/etc/passwd'", "hard link", "FIFO", "'..'", "absolute"):
        assert what in text
    assert "train-0000.tar: offset " in text and "no label" in text
    assert not (tmp_path / "escape.jpg").exists() and not (tmp_path.parent / "escape.jpg").exists()


def test_a_tar_whose_header_lies_rejects_only_its_rest(tmp_path, images):
    src = _tars(tmp_path / "wds", images)
    with tarfile.open(src / "train-0001.tar") as t:
        at = t.getmembers()[5].offset  # the header of the second sample's image
    data = bytearray((src / "train-0001.tar").read_bytes())
    data[at + 124:at + 136] = b"77777777777\0"  # a size far past the end
    (src / "train-0001.tar").write_bytes(bytes(data))
    result = convert(src, tmp_path / "out", **QUICK)
    assert result["num_samples"] == 4 + 1  # the second tar's first sample came before
    assert any(f"train-0001.tar: offset {at}: header checksum" in r and
               "rest of this tar is skipped" in r for r in _rejects(tmp_path / "out"))


def test_tfrecord_plain_and_gzipped_crc_checked(tmp_path, images):
    recs = [example({"image/encoded": im, "image/class/label": k % 3,
                     "image/class/text": f"c{k % 3}".encode(), "box": [0.5] * (k % 2 + 1)})
            for k, im in enumerate(images)]
    src = tmp_path / "tf"
    src.mkdir()
    data = bytearray(tfrecord(recs[:4]))
    data[-10] ^= 0xFF  # one data byte of the last record: its CRC no longer matches
    (src / "a.tfrecord").write_bytes(bytes(data))
    (src / "b.tfrecord.gz").write_bytes(gzip.compress(tfrecord(recs[4:])))
    result = convert(src, tmp_path / "out", **QUICK)
    assert result["num_samples"] == 8
    [reject] = _rejects(tmp_path / "out")
    assert reject.startswith("a.tfrecord#3") and "data CRC-32C mismatch" in reject \
        and "offset" in reject
    ds = Dataset(tmp_path / "out")
    assert ds.classes == ["0", "1", "2"] and ds.fields["box"]["type"] == "array"
    assert ds.sample(3)["image_class_text"] == "c1" and ds.sample(3)["box"].tolist() == [.5]
    by_text = convert(src, tmp_path / "names", label_key="image/class/text", **QUICK)
    assert by_text["num_samples"] == 8 and Dataset(tmp_path / "names").classes == ["c0", "c1", "c2"]


def test_recordio_with_idx_and_a_split_record(tmp_path, images):
    payloads = [irheader(float(k % 3), 100 + k, im) for k, im in enumerate(images[:4])]
    payloads[2] = irheader(2.0, 0xCED7230A, images[2])  # the magic in its id: written split
    rec, idx = recordio(payloads)
    (tmp_path / "x.rec").write_bytes(rec + b"garbage!")
    result = convert(tmp_path / "x.rec", tmp_path / "seq", **QUICK)
    assert result["num_samples"] == 4 and "no RecordIO magic" in _rejects(tmp_path / "seq")[0]
    (tmp_path / "x.idx").write_text(idx)
    convert(tmp_path / "x.rec", tmp_path / "out", **QUICK)
    ds = Dataset(tmp_path / "out")
    assert [ds.sample(i)["id"] for i in range(4)] == [100, 101, 0xCED7230A, 103]
    assert (ds.sample(2)["image"] == Dataset(tmp_path / "seq").sample(2)["image"]).all()
    assert ds.labels.tolist() == [0, 1, 2, 0] and b"\x0a\x23\xd7\xce" in rec
    multi = recordio([irheader(0.0, k, im, labels=[k % 3, 0.5]) for k, im in enumerate(images)])
    (tmp_path / "m.rec").write_bytes(multi[0])
    convert(tmp_path / "m.rec", tmp_path / "multi", **QUICK)
    assert Dataset(tmp_path / "multi").sample(4)["labels"].tolist() == [1.0, 0.5]


def _parquet(path, images, labels=True):
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = {"image": {"_type": "Image"},
                "label": {"_type": "ClassLabel", "names": ["cat", "dog", "emu"]}}
    rows = {"image": [{"bytes": im, "path": f"{k}.jpg"} for k, im in enumerate(images)],
            "caption": [f"cap {k}" for k in range(len(images))],
            "emb": [[float(k)] * 4 for k in range(len(images))],
            "meta": [{"k": k} for k in range(len(images))]}
    rows["image"][3] = {"bytes": None, "path": "elsewhere.jpg"}
    if labels:
        rows["label"] = [k % 3 for k in range(len(images))]
    table = pa.table(rows).replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, path, row_group_size=2)


def test_parquet_in_the_datasets_layout_one_row_group_at_a_time(tmp_path, images):
    _parquet(tmp_path / "train.parquet", images)
    result = convert(tmp_path / "train.parquet", tmp_path / "out", **QUICK)
    assert result["num_samples"] == 8
    [reject] = _rejects(tmp_path / "out")
    assert reject.startswith("train.parquet#3") and "row group 1" in reject
    ds = Dataset(tmp_path / "out")
    assert ds.classes == ["cat", "dog", "emu"] and ds.fields["emb"]["dtype"] == "float64"
    assert ds.sample(3)["caption"] == "cap 4" and ds.sample(3)["meta"] == {"k": 4}


def test_append_from_tars_adds_only_new_samples(tmp_path, images):
    src = _tars(tmp_path / "wds", images)
    one = tmp_path / "one"
    one.mkdir()
    (src / "train-0000.tar").rename(one / "train-0000.tar")
    dst = tmp_path / "out"
    convert(one, dst, **QUICK)
    (src / "train-0001.tar").rename(one / "train-0001.tar")
    result = convert(one, dst, append=True, workers=1, progress=False)
    assert result["append"]["new_samples"] == 4 and result["num_samples"] == 8
    again = convert(one, dst, append=True, workers=1, progress=False)
    assert again["append"]["new_samples"] == 0 and again["append"]["quick"] == 8
    assert again["append"]["duplicates"] == 8  # the rejects are tried again, as a folder's


def test_webdataset_tars_from_s3_by_pattern_and_by_prefix(s3_env, tmp_path, images):
    from dlpack_io.reader.remote.storage import Store

    src = _tars(tmp_path / "wds", images)
    url = "s3://dlpack-test/formats/wds"
    store = Store(url)
    for name in ("train-0000.tar", "train-0001.tar"):
        store.put_file(name, src / name)
    local = convert(src, tmp_path / "local", **QUICK)
    for i, where in enumerate((f"{url}/train-{{0000..0001}}.tar", url)):
        result = convert(where, tmp_path / f"remote{i}", spool=str(tmp_path / "spool"), **QUICK)
        assert result["num_samples"] == local["num_samples"] == 8
        assert (tmp_path / f"remote{i}" / "rejects.tsv").read_text().count("symbolic link") == 2
        assert (Dataset(tmp_path / f"remote{i}").labels == Dataset(tmp_path / "local").labels).all()
    import gc
    gc.collect()
    assert not list((tmp_path / "spool").iterdir())  # the spool goes with the conversion


def test_a_killed_parquet_conversion_resumes_to_the_same_bytes(tmp_path, images):
    from helpers import convert_stopped_at

    _parquet(tmp_path / "train.parquet", images)
    whole = tmp_path / "whole"
    convert(tmp_path / "train.parquet", whole, shard_size="12KB", **QUICK)
    args = [tmp_path / "train.parquet", tmp_path / "out", "--shard-size", "12KB", "--workers",
            "1", "--quiet", "--no-shuffle", "--spool", tmp_path / "spool"]
    convert_stopped_at("journal:1", args)
    done = convert(tmp_path / "train.parquet", tmp_path / "out", shard_size="12KB", resume=True,
                   **QUICK)
    assert done["resumed_from"] > 0
    for shard in sorted(p.name for p in whole.glob("shard-*")):
        assert (whole / shard).read_bytes() == (tmp_path / "out" / shard).read_bytes(), shard


def test_a_gzip_bomb_is_cut_at_its_limit(tmp_path, images, monkeypatch, caplog):
    from dlpack_io.packer import records

    monkeypatch.setattr(records, "MAX_INFLATE", 2)
    monkeypatch.setattr(records, "INFLATE_SLACK", 0)
    data = tfrecord([example({"image/encoded": images[0], "image/class/label": 0})]) + \
        bytes(8 * 2**20)  # a valid record, then zeros that inflate far beyond the limit
    (tmp_path / "bomb.tfrecord.gz").write_bytes(gzip.compress(data))
    result = convert(tmp_path / "bomb.tfrecord.gz", tmp_path / "out", **QUICK)
    assert result["num_samples"] == 1 and "gzip bomb" in caplog.text
