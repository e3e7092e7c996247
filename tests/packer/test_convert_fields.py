"""dlpack convert with fields: sidecar files (WebDataset's convention), JSON Lines and
CSV lists with extra columns; bad sidecars and lines become rejects naming file and line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dlpack_io.packer import convert
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader import Dataset
from dlpack_io.tools.cli import main
from dlpack_io.tools.verification import verify


def _images(src, names):
    for k, name in enumerate(names):
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8 + k, 3), 10 * k, np.uint8)).save(path, quality=90)


def _by_path(ds):
    paths = [p for k in range(len(ds.shards)) for p in ds.shards[k].meta()["paths"]]
    return {p: ds.sample(i) for i, p in enumerate(paths)}


@pytest.fixture
def sidecar_src(tmp_path):
    src = tmp_path / "src"
    _images(src, ["cat/a.jpg", "cat/b.jpg", "dog/c.jpg", "dog/d.jpg", "dog/e.jpg"])
    for stem, k in (("cat/a", 0), ("cat/b", 1), ("dog/c", 2), ("dog/d", 3), ("dog/e", 4)):
        (src / f"{stem}.txt").write_text(f"caption {k} é")
        (src / f"{stem}.json").write_text(json.dumps({"k": k}))
        (src / f"{stem}.cls").write_text(" ".join(str(k + j) for j in range(k % 3)))
        np.save(src / f"{stem}.npy", np.full((k, 2), k, np.int16))
    (src / "cat" / "README.txt").write_text("not a sidecar: no image is called README")
    (src / "dog" / "d.json").write_bytes(b"{broken")
    (src / "dog" / "e.cls").write_text("3 x")
    return src


def test_sidecars_become_typed_fields_and_bad_ones_rejects(sidecar_src, tmp_path):
    out = convert(sidecar_src, tmp_path / "ds", workers=1, progress=False)
    ds = Dataset(tmp_path / "ds", verify_checksums=True)
    assert ds.manifest["version"] == 3 and out["fields"] == ds.fields == {
        "cls": {"type": "array", "dtype": "int64", "ndim": 1, "shape": None},
        "json": {"type": "json"},
        "npy": {"type": "array", "dtype": "int16", "ndim": 2, "shape": None},
        "txt": {"type": "str"}}
    rejects = {r["path"]: r["reason"] for r in ds.manifest["rejects"]}
    assert set(rejects) == {"dog/d.jpg", "dog/e.jpg"}
    assert rejects["dog/d.jpg"].startswith(f"sidecar {sidecar_src}/dog/d.json is not valid JSON")
    assert rejects["dog/e.jpg"].startswith(f"sidecar {sidecar_src}/dog/e.cls is not "
                                           f"whitespace-separated integers")
    got = _by_path(ds)
    for path, k in (("cat/a.jpg", 0), ("cat/b.jpg", 1), ("dog/c.jpg", 2)):
        s = got[path]
        assert s["txt"] == f"caption {k} é" and s["json"] == {"k": k}
        assert s["cls"].tolist() == [k + j for j in range(k % 3)]
        assert s["npy"].shape == (k, 2) and s["npy"].dtype == np.int16 and (s["npy"] == k).all()
    assert verify(tmp_path / "ds", progress=False).ok


def test_fields_option_chooses_sidecars(sidecar_src, tmp_path):
    convert(sidecar_src, tmp_path / "two", workers=1, progress=False, fields="txt,npy")
    assert sorted(Dataset(tmp_path / "two").fields) == ["npy", "txt"]
    convert(sidecar_src, tmp_path / "none", workers=1, progress=False, fields="none")
    none = Dataset(tmp_path / "none")
    assert none.manifest["version"] == 2 and none.fields == {} and len(none) == 5
    with pytest.raises(ValueError, match=r"'png' is not one of the fields there are "
                                         r"\(txt,json,cls,npy\)"):
        convert(sidecar_src, tmp_path / "bad", workers=1, progress=False, fields="txt,png")


def test_a_missing_sidecar_is_a_reject_and_on_error_fail_stops(tmp_path):
    src = tmp_path / "src"
    _images(src, ["c/a.jpg", "c/b.jpg"])
    (src / "c" / "a.txt").write_text("only a has one")
    convert(src, tmp_path / "ds", workers=1, progress=False)
    ds = Dataset(tmp_path / "ds")
    assert len(ds) == 1 and ds.sample(0)["txt"] == "only a has one"
    assert ds.manifest["rejects"] == [{"path": "c/b.jpg", "reason": "missing sidecar b.txt "
                                       "(other images have one; --fields chooses which "
                                       "sidecars to pack)"}]
    with pytest.raises(ConversionError, match="c/b.jpg: missing sidecar b.txt"):
        convert(src, tmp_path / "ds2", workers=1, progress=False, on_error="fail", shuffle=False)


def test_jsonl_list_fields_and_bad_lines(tmp_path):
    src = tmp_path / "src"
    _images(src, ["a.jpg", "b.jpg", "c.jpg", "d.jpg"])
    lines = [{"path": "a.jpg", "label": 1, "caption": "a cat", "tags": ["pet"], "id": 17, "s": 1},
             {"path": "b.jpg", "label": 0, "caption": "b", "tags": {"x": 1}, "id": 18, "s": 0.5},
             [1, 2], {"label": 0, "caption": "no path"},
             {"path": "c.jpg", "label": 0, "caption": "c", "tags": None, "s": 2},
             {"path": "d.jpg", "label": 0, "caption": "d", "tags": 1, "id": 3, "s": 1, "label_": 2}]
    listing = tmp_path / "list.jsonl"
    listing.write_text("\n".join(json.dumps(x) for x in lines[:5]) + "\n\n"
                       + json.dumps(lines[5]).replace('"label_"', '"image"') + "\n")
    CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "ds"), "--list", str(listing),
                              "--workers", "1", "--quiet"], catch_exceptions=False)
    ds = Dataset(tmp_path / "ds")
    assert ds.fields == {"caption": {"type": "str"}, "id": {"type": "int"},
                         "s": {"type": "float"}, "tags": {"type": "json"}}
    got = _by_path(ds)
    assert set(got) == {"a.jpg", "b.jpg"}
    assert got["a.jpg"]["label"] == 1 and got["a.jpg"]["caption"] == "a cat"
    assert got["a.jpg"]["tags"] == ["pet"] and got["a.jpg"]["id"] == 17 and got["a.jpg"]["s"] == 1.0
    assert got["b.jpg"]["tags"] == {"x": 1} and got["b.jpg"]["s"] == 0.5
    reasons = {r["path"]: r["reason"] for r in ds.manifest["rejects"]}
    assert reasons == {
        "list.jsonl:3": f"{listing}:3: expected a JSON object, found list",
        "list.jsonl:4": f"{listing}:4: no \"path\" (text) in the object",
        "c.jpg": f"{listing}:5: no 'id' for c.jpg (other lines have that field)",
        "list.jsonl:7": f"{listing}:7: field name 'image' clashes with the sample's own "
                        f"'image'; rename the field (e.g. 'image_2')"}


def test_csv_extra_columns_are_str_fields(tmp_path):
    src = tmp_path / "src"
    _images(src, ["a.jpg", "b.jpg", "c.jpg"])
    listing = tmp_path / "list.tsv"
    listing.write_text("path\tlabel\tcaption\tsource\na.jpg\tcat\ta cat\tweb\n"
                       "b.jpg\tdog\ta dog\tbook\nc.jpg\tdog\tshort row\n")
    convert(src, tmp_path / "ds", list_file=listing, workers=1, progress=False, shuffle=False)
    ds = Dataset(tmp_path / "ds")
    assert ds.fields == {"caption": {"type": "str"}, "source": {"type": "str"}}
    assert [ds.sample(i)["caption"] for i in range(len(ds))] == ["a cat", "a dog"]
    assert ds.sample(1)["source"] == "book" and ds.classes == ["cat", "dog"]
    assert ds.manifest["rejects"] == [{"path": "c.jpg", "reason": f"{listing}:4: 3 columns, "
                                                                 f"other rows have 4"}]


def test_jsonl_lines_from_the_wild_are_rejects_not_allocations(tmp_path):
    """A label far beyond any class count and a path with a NUL are rejects naming their
    line (a label of 10**12 must not make 10**12 class names); the other lines are packed."""
    src = tmp_path / "src"
    _images(src, ["a.jpg", "b.jpg"])
    listing = tmp_path / "list.jsonl"
    listing.write_text("\n".join(json.dumps(x) for x in (
        {"path": "a.jpg", "label": 2}, {"path": "b.jpg", "label": 10**12},
        {"path": "a\u0000.jpg", "label": 1})) + "\n")
    done = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "ds"), "--list",
                                     str(listing), "--workers", "1", "--quiet",
                                     "--max-rejects", "2"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    ds = Dataset(tmp_path / "ds")
    assert len(ds) == 1 and ds.classes == ["0", "1", "2"]
    reasons = sorted(r["reason"] for r in ds.manifest["rejects"])
    assert reasons == [f"{listing}:2: label 1000000000000 is above 1048576, the largest class "
                       f"number a list may use",
                       f"{listing}:3: the path holds a NUL byte (shown as \\x00)"]
