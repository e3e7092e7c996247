"""dlpack export --to webdataset|parquet: read back by the webdataset library and by
pyarrow sample for sample, and round trips folder -> dlpack -> WebDataset / Parquet ->
dlpack that give the same pixels, labels, fields and order."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from dlpack_io.packer import convert
from dlpack_io.reader import Dataset
from dlpack_io.reader.dataset import read_fields
from dlpack_io.tools.cli import main
from dlpack_io.tools.export import export
from dlpack_io.tools.synth import make_image_folder

QUICK = dict(workers=1, progress=False, shuffle=False)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A data set of 12 JPEGs in 3 classes with str, json, int-array and float-array fields."""
    root = tmp_path_factory.mktemp("export")
    for k, path in enumerate(sorted(make_image_folder(root / "src", 12, 3, seed=7, size=(30, 40)))):
        path.with_suffix(".txt").write_text(f"caption {k}")
        path.with_suffix(".json").write_text(json.dumps({"k": k, "tags": ["a"] * (k % 3)}))
        path.with_suffix(".cls").write_text(f"{k} {k + 1}")
        np.save(path.with_suffix(".npy"), np.full((2, k % 3 + 1), k, np.float32))
    convert(root / "src", root / "set", shard_size="20KB", **QUICK)
    return root


def _same(a: Dataset, b: Dataset) -> None:
    assert len(a) == len(b) and a.classes == b.classes and a.labels.tolist() == b.labels.tolist()
    for i in range(len(a)):
        x, y = a.sample(i), b.sample(i)
        assert set(x) == set(y), i
        for name in x:
            assert np.array_equal(x[name], y[name]) if isinstance(x[name], np.ndarray) \
                else x[name] == y[name], (i, name)


def test_webdataset_export_reads_back_with_webdataset_and_converts_back(packed, tmp_path):
    import webdataset as wds

    ds = Dataset(packed / "set")
    result = export(packed / "set", tmp_path / "wds", to="webdataset", shard_size="30KB",
                    progress=False)
    assert result["shards"] > 1 and result["num_samples"] == len(ds)
    tars = sorted(str(p) for p in (tmp_path / "wds").glob("shard-*.tar"))
    samples = list(wds.WebDataset(tars, shardshuffle=False).decode())
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in range(len(ds))]
    for i, s in enumerate(samples):
        payload, entry = ds.record(i)
        fields = read_fields(ds, i)
        assert s["jpg"] == bytes(payload) and s["cls"] == int(entry["label"])
        assert s["txt"] == fields["txt"] and s["json"] == fields["json"]
        assert np.array_equal(s["npy"], fields["npy"]) and s["cls.npy"].tolist() == \
            fields["cls"].tolist()
    convert(tmp_path / "wds", tmp_path / "back", **QUICK)
    _same(ds, Dataset(tmp_path / "back"))


def test_parquet_export_reads_back_with_pyarrow_and_converts_back(packed, tmp_path):
    import pyarrow.parquet as pq

    ds = Dataset(packed / "set")
    export(packed / "set", tmp_path / "pq", to="parquet", shard_size="30KB", progress=False)
    table = pq.read_table(tmp_path / "pq")  # _export.json is skipped by pyarrow
    assert table.num_rows == len(ds) and table.column_names[:2] == ["image", "label"]
    features = json.loads(table.schema.metadata[b"huggingface"])["info"]["features"]
    assert features["label"]["names"] == ds.classes and features["image"] == {"_type": "Image"}
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        payload, entry = ds.record(i)
        fields = read_fields(ds, i)
        assert row["image"]["bytes"] == bytes(payload) and row["label"] == int(entry["label"])
        assert row["txt"] == fields["txt"] and json.loads(row["json"]) == fields["json"]
        assert np.array_equal(np.asarray(row["npy"], np.float32), fields["npy"])
    convert(tmp_path / "pq", tmp_path / "back", **QUICK)
    _same(ds, Dataset(tmp_path / "back"))


def test_raw_records_go_out_as_png_with_the_same_pixels(packed, tmp_path):
    convert(packed / "src", tmp_path / "raw", mode="raw", fields="none", **QUICK)
    runner = CliRunner()
    done = runner.invoke(main, ["export", str(tmp_path / "raw"), str(tmp_path / "out"),
                                "--to", "webdataset", "--quiet"])
    assert done.exit_code == 0, done.output
    assert "exported 12 samples" in done.output
    assert "PNG" in (tmp_path / "out" / "shard-000000.tar").read_bytes()[512:1024].decode("latin-1")
    convert(tmp_path / "out", tmp_path / "back", mode="raw", **QUICK)
    _same(Dataset(tmp_path / "raw"), Dataset(tmp_path / "back"))
    again = runner.invoke(main, ["export", str(tmp_path / "raw"), str(tmp_path / "out"),
                                 "--to", "parquet"])
    assert again.exit_code == 1 and "not empty" in again.output
