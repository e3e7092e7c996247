"""packer.Writer: samples from code, with fields, into the same shards convert writes."""
from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from dlpack_io.packer import Writer
from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.tools.verification import verify


def _jpeg(h, w, seed):
    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _write(dst, n=7, data_format="record", shard_size="1KB"):
    with Writer(dst, format=data_format, shard_size=shard_size) as w:
        for i in range(n):
            image = _jpeg(16 + i, 24, i) if i % 2 else np.full((10 + i, 12, 3), i, np.uint8)
            w.write(image=image, label=i % 3, caption=f"a cat {i}" + "é" * i, n=i - 3,
                    score=i / 4, emb=np.arange(4, dtype=np.float16) + i,
                    mask=np.full((i, 2), i, np.uint16), meta={"id": i, "tags": ["x"] * i})
    return Dataset(dst, verify_checksums=True)


@pytest.mark.parametrize("data_format", ["record", "lmdb"])
def test_fields_round_trip_exactly(tmp_path, data_format):
    ds = _write(tmp_path / "ds", data_format=data_format)
    assert ds.manifest["version"] == 3 and len(ds) == 7 and len(ds.shards) > 1
    assert ds.fields == {
        "caption": {"type": "str"}, "emb": {"type": "array", "dtype": "float16", "ndim": 1,
                                            "shape": [4]},
        "mask": {"type": "array", "dtype": "uint16", "ndim": 2, "shape": None},
        "meta": {"type": "json"}, "n": {"type": "int"}, "score": {"type": "float"}}
    for i in range(7):
        s = ds.sample(i)
        assert s["label"] == i % 3 and s["caption"] == f"a cat {i}" + "é" * i
        assert s["n"] == i - 3 and s["score"] == i / 4 and s["meta"] == {"id": i, "tags": ["x"] * i}
        assert s["emb"].dtype == np.float16 and s["emb"].tolist() == [i, i + 1, i + 2, i + 3]
        assert s["mask"].shape == (i, 2) and s["mask"].dtype == np.uint16 and (s["mask"] == i).all()
        image, label = ds[i]  # ds[i] is unchanged: (pixels, label)
        assert label == i % 3 and image.shape == ((16 + i, 24, 3) if i % 2 else (10 + i, 12, 3))
    assert (ds.sample(4)["image"] == 4).all()  # an array image is stored losslessly
    assert verify(tmp_path / "ds").ok


def test_no_fields_writes_format_2_bytes(tmp_path):
    with Writer(tmp_path / "ds") as w:
        w.write(image=np.zeros((4, 5, 3), np.uint8))
    ds = Dataset(tmp_path / "ds")
    assert ds.manifest["version"] == 2 and "fields" not in ds.manifest and ds.classes == []
    assert ds.sample(0)["label"] == -1 and set(ds.sample(0)) == {"image", "label"}
    with open(tmp_path / "ds" / "shard-00000.rec", "rb") as f:
        assert fmt.unpack_header(f.read(4096), os.path.getsize(f.name), "x").version == 2


@pytest.mark.parametrize("fields,match", [
    ({"caption": "ok"}, r"sample 1: fields \['caption'\], the schema .* missing \['emb'\]"),
    ({"caption": "ok", "emb": np.zeros(3, np.float32), "x": 1}, r"unknown \['x'\]"),
    ({"caption": 3, "emb": np.zeros(3, np.float32)}, r"sample 1 field 'caption': int 3, the schema says str"),
    ({"caption": "ok", "emb": np.zeros(3, np.float64)},
     r"sample 1 field 'emb': float64 array of ndim 1, the schema says float32 array of ndim 1"),
    ({"caption": "ok", "emb": np.zeros((1, 3), np.float32)}, r"ndim 2, the schema says .* ndim 1"),
])
def test_a_sample_off_the_schema_is_refused_before_anything_is_written(tmp_path, fields, match):
    w = Writer(tmp_path / "ds")
    w.write(image=np.zeros((4, 4, 3), np.uint8), caption="first", emb=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=match):
        w.write(image=np.zeros((4, 4, 3), np.uint8), **fields)
    w.write(image=np.zeros((4, 4, 3), np.uint8), caption="third", emb=np.ones(3, np.float32))
    w.close()
    ds = Dataset(tmp_path / "ds")
    assert len(ds) == 2 and ds.sample(1)["caption"] == "third"


@pytest.mark.parametrize("kwargs,match", [
    ({"image": np.zeros((4, 4, 3), np.uint8), "label": 1}, "give every sample a label or none"),
    ({"image": b"not an image"}, r"sample 1: image \(bytes\) cannot be packed"),
    ({"image": np.zeros((4, 4, 3), np.float32)}, "expected uint8"),
])
def test_bad_samples_name_the_sample(tmp_path, kwargs, match):
    w = Writer(tmp_path / "ds")
    w.write(image=np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match=match):
        w.write(**kwargs)
    w.abort()


@pytest.mark.parametrize("name", ["index", "1x", "a-b", "x" * 65])
def test_field_names_that_clash_or_are_not_identifiers(tmp_path, name):
    with pytest.raises(ValueError, match=f"field name '{name}'"):
        Writer(tmp_path / "ds").write(np.zeros((4, 4, 3), np.uint8), **{name: 1})


@pytest.mark.parametrize("name", ["image", "label"])
def test_image_and_label_are_not_field_names(name):
    with pytest.raises(fmt.FormatError, match=f"field name '{name}' clashes with the sample's own"):
        fmt.check_field_name(name, "manifest")


def test_nothing_is_a_data_set_until_close_and_an_error_leaves_no_manifest(tmp_path):
    dst = tmp_path / "ds"
    with pytest.raises(RuntimeError):
        with Writer(dst) as w:
            w.write(image=np.zeros((4, 4, 3), np.uint8), caption="x")
            assert not (dst / fmt.MANIFEST_NAME).exists()
            raise RuntimeError("the user's code failed")
    assert not (dst / fmt.MANIFEST_NAME).exists()
    assert not [p for p in os.listdir(dst) if p.endswith(".partial")]


def test_a_non_empty_destination_is_refused(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="ds: exists and is not an empty folder"):
        Writer(tmp_path / "ds")


def test_classes_name_the_labels(tmp_path):
    with Writer(tmp_path / "ds", classes=["cat", "dog"]) as w:
        w.write(image=np.zeros((4, 4, 3), np.uint8), label=1)
        with pytest.raises(ValueError, match=r"label 2: expected an integer 0..1"):
            w.write(image=np.zeros((4, 4, 3), np.uint8), label=2)
    m = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert m["classes"] == ["cat", "dog"] and m["class_counts"] == [0, 1]
