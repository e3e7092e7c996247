"""dlpack convert / inspect / verify against a real S3 server (SeaweedFS)."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from dlpack_io.packer import convert
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.schema import INPUTSTAT_NAME
from dlpack_io.reader.remote.storage import Store
from dlpack_io.tools.cli import main
from dlpack_io.tools.synth import make_image_folder

BUCKET = "dlpack-test"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("s3src")
    make_image_folder(root, 40, 3, seed=3, size=(48, 64))
    return root


def _objects(url):
    store = Store(url)
    return {name: store.get(name) for name in store.list()}


def test_convert_to_s3_gives_the_same_bytes_as_local(s3_env, src, tmp_path):
    local = tmp_path / "local"
    convert(src, local, shard_size="40KB", workers=1, progress=False)
    url = f"s3://{BUCKET}/convert/same"
    result = convert(src, url, shard_size="40KB", workers=1, progress=False)
    assert result["num_shards"] > 2 and result["dst"] == url
    remote = _objects(url)
    assert sorted(remote) == sorted(os.listdir(local))  # no journal or temp objects left
    for name, data in remote.items():
        if name not in (fmt.MANIFEST_NAME, INPUTSTAT_NAME):  # the record names its manifest
            assert data == (local / name).read_bytes(), name
    mine, theirs = json.loads(remote[fmt.MANIFEST_NAME]), json.loads((local / fmt.MANIFEST_NAME).read_bytes())
    for key in fmt.VOLATILE_MANIFEST_KEYS:
        mine.pop(key), theirs.pop(key)
    assert mine == theirs


def test_existing_data_set_needs_resume_or_overwrite(s3_env, src):
    url = f"s3://{BUCKET}/convert/exists"
    convert(src, url, shard_size="40KB", workers=1, progress=False)
    with pytest.raises(ConversionError, match="is not empty.*--resume.*--overwrite"):
        convert(src, url, shard_size="40KB", workers=1, progress=False)
    assert convert(src, url, resume=True, shard_size="40KB", workers=1,
                   progress=False)["already_complete"]
    result = convert(src, url, overwrite=True, shard_size="80KB", workers=1, progress=False)
    names = set(Store(url).list())
    assert len([n for n in names if n.startswith("shard-")]) == result["num_shards"]


def test_interrupted_upload_is_invisible_and_resumes_to_the_same_bytes(s3_env, src, monkeypatch):
    from dlpack_io.packer import upload

    url = f"s3://{BUCKET}/convert/resume"
    real, calls = upload.upload_shard, []

    def failing(store, staging, entry):
        calls.append(entry["name"])
        if len(calls) == 3:
            raise OSError("network went away (injected)")
        real(store, staging, entry)
    monkeypatch.setattr(upload, "upload_shard", failing)
    with pytest.raises(ConversionError, match="upload failed.*--resume"):
        convert(src, url, shard_size="40KB", workers=1, progress=False)
    names = set(Store(url).list())
    assert fmt.MANIFEST_NAME not in names  # not a data set yet
    assert ".dlpack-convert.journal" in names and {"shard-00000.rec", "shard-00001.rec"} <= names
    monkeypatch.setattr(upload, "upload_shard", real)
    result = convert(src, url, resume=True, shard_size="40KB", workers=1, progress=False)
    assert result["resumed_from"] > 0
    fresh = f"s3://{BUCKET}/convert/resume-fresh"
    convert(src, fresh, shard_size="40KB", workers=1, progress=False)
    a, b = _objects(url), _objects(fresh)
    assert INPUTSTAT_NAME not in a and INPUTSTAT_NAME in b  # the resumed run did not stat all
    b.pop(INPUTSTAT_NAME)
    assert sorted(a) == sorted(b)
    assert all(a[n] == b[n] for n in a if n != fmt.MANIFEST_NAME)
    mine, theirs = json.loads(a[fmt.MANIFEST_NAME]), json.loads(b[fmt.MANIFEST_NAME])
    for key in fmt.VOLATILE_MANIFEST_KEYS:
        mine.pop(key), theirs.pop(key)
    assert mine["lossless"] and mine == theirs  # the kept shards' counts were taken over


def test_resume_with_other_options_is_refused(s3_env, src, monkeypatch):
    from dlpack_io.packer import upload

    url = f"s3://{BUCKET}/convert/other-options"
    with monkeypatch.context() as m:
        m.setattr(upload, "upload_shard", lambda *a: (_ for _ in ()).throw(OSError("cut")))
        with pytest.raises(ConversionError, match="cut"):
            convert(src, url, shard_size="40KB", workers=1, progress=False)
    with pytest.raises(ConversionError, match=rf"s3://{BUCKET}/convert/other-options: cannot "
                                              r"resume: shard_size: 40000 then, 50000 now"):
        convert(src, url, resume=True, shard_size="50KB", workers=1, progress=False)


def test_cli_convert_inspect_verify_remote(s3_env, src):
    url = f"s3://{BUCKET}/convert/cli"
    runner = CliRunner()
    out = runner.invoke(main, ["convert", str(src), url, "--shard-size", "40KB", "--workers", "1",
                               "--quiet"])
    assert out.exit_code == 0, out.output
    out = runner.invoke(main, ["inspect", url, "--json"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["num_samples"] == 40 and summary["path"] == url
    out = runner.invoke(main, ["inspect", url, "--index", "7", "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["crc_ok"] is True
    out = runner.invoke(main, ["verify", url, "--quiet", "--decode", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["ok"] and report["records_checked"] == 40


def test_verify_names_the_damaged_object(s3_env, src, tmp_path):
    url = f"s3://{BUCKET}/convert/damaged"
    convert(src, url, shard_size="40KB", workers=1, progress=False)
    store = Store(url)
    data = bytearray(store.get("shard-00001.rec"))
    data[fmt.HEADER_SIZE + 100] ^= 0xFF  # inside the first record: its CRC must catch it
    store.put("shard-00001.rec", bytes(data))
    store.put("shard-00002.rec", store.get("shard-00002.rec")[:-10])
    out = CliRunner().invoke(main, ["verify", url, "--quiet", "--json"])
    assert out.exit_code == 1
    problems = json.loads(out.output)["problems"]
    assert {"where": f"s3://{BUCKET}/convert/damaged/shard-00001.rec record 0",
            "problem": "record checksum mismatch: damaged data"} in problems
    assert any(p["where"] == f"s3://{BUCKET}/convert/damaged/shard-00002.rec" and
               "truncated or replaced" in p["problem"] for p in problems)


def test_cli_remote_errors_are_one_line(s3_env, tmp_path):
    out = CliRunner().invoke(main, ["inspect", f"s3://{BUCKET}/convert/nothing-here"])
    assert out.exit_code == 1
    assert out.output == (f"dlpack: error: s3://{BUCKET}/convert/nothing-here is not a dlpack "
                          f"data set (no manifest.json): an upload still running or "
                          f"interrupted, or the wrong prefix\n")
    out = CliRunner().invoke(main, ["verify", f"s3://{BUCKET}/convert/nothing-here", "--quiet"])
    assert out.exit_code == 3  # not a data set, as for a local folder


def test_lmdb_data_sets_upload_and_verify_but_are_not_read_by_range(s3_env, src):
    from dlpack_io.reader.dataset import Dataset
    from dlpack_io.tools.verification import verify

    url = f"s3://{BUCKET}/convert/lmdb"
    convert(src, url, format="lmdb", shard_size="40KB", workers=1, progress=False)
    report = verify(url, progress=False)
    assert report.ok and report.records_checked == 40
    with pytest.raises(ValueError, match="supports format 'record'.*--format record"):
        Dataset(url)
