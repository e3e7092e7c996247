"""dlpack convert with detection and segmentation targets (issue 25): COCO files, boxes in
JSON Lines lists, masks as sidecars or under --masks, EXIF orientation applied to boxes
and masks exactly as to the image, and bad annotations as rejects naming their id."""
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


def _image(path, w, h, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((h, w, 3), value, np.uint8)).save(path, quality=95)


def _by_path(ds):
    paths = [p for k in range(len(ds.shards)) for p in ds.shards[k].meta()["paths"]]
    return {p: ds.sample(i) for i, p in enumerate(paths)}


def _rejects(ds):
    return {r["path"]: r["reason"] for r in ds.manifest["rejects"]}


def _coco(tmp_path, annotations, images=None, categories=None):
    images = images or [{"id": 10 + k, "file_name": f"imgs/{k}.jpg", "width": 64,
                         "height": 48} for k in range(3)]
    for img in images:  # only the well-formed names: never a file outside tmp_path
        name = img.get("file_name")
        if isinstance(name, str) and ".." not in name and not name.startswith("/"):
            _image(tmp_path / "src" / img["file_name"], 64, 48)
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories":
                                categories or [{"id": 1, "name": "person"},
                                               {"id": 3, "name": "car"}]}))
    return path


GOOD = [{"id": 100, "image_id": 10, "category_id": 1, "bbox": [1, 2, 10, 20], "iscrowd": 0},
        {"id": 101, "image_id": 10, "category_id": 3, "bbox": [5.5, 6, 3, 4], "iscrowd": 1},
        {"id": 102, "image_id": 11, "category_id": 3, "bbox": [0, 0, 64, 48]}]


def test_coco_boxes_categories_iscrowd_and_image_id(tmp_path):
    coco = _coco(tmp_path, GOOD)
    convert(tmp_path / "src", tmp_path / "ds", coco=str(coco), workers=0, progress=False)
    ds = Dataset(tmp_path / "ds", verify_checksums=True)
    assert ds.fields["categories"]["names"] == {"1": "person", "3": "car"}
    assert ds.manifest["options"]["coco"] == "instances.json"  # a file name, not a path
    got = _by_path(ds)
    a, b, empty = got["imgs/0.jpg"], got["imgs/1.jpg"], got["imgs/2.jpg"]
    np.testing.assert_array_equal(a["boxes"], np.array([[1, 2, 11, 22], [5.5, 6, 8.5, 10]],
                                                        np.float32))
    assert a["boxes"].dtype == np.float32 and a["categories"].dtype == np.int64
    assert a["categories"].tolist() == [1, 3] and a["iscrowd"].tolist() == [0, 1]
    assert (a["image_id"], b["image_id"], empty["image_id"]) == (10, 11, 12)
    assert b["boxes"].tolist() == [[0, 0, 64, 48]]
    assert empty["boxes"].shape == (0, 4) and empty["categories"].shape == (0,)
    assert ds.manifest["rejects"] == []


def test_skip_empty_leaves_out_images_without_boxes(tmp_path):
    coco = _coco(tmp_path, GOOD)
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "src"), str(tmp_path / "ds"),
                                       "--coco", str(coco), "--skip-empty", "--quiet",
                                       "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert sorted(_by_path(Dataset(tmp_path / "ds"))) == ["imgs/0.jpg", "imgs/1.jpg"]


BAD = [({"id": 7, "image_id": 10, "category_id": 1, "bbox": [60, 6, 10, 4]},
        "box [60, 6, 10, 4] (x, y, w, h) lies outside the 64x48 image (width x height)"),
       ({"id": 8, "image_id": 11, "category_id": 1, "bbox": [6, 6, -1, 4]},
        "box [6, 6, -1, 4] (x, y, w, h) has a negative width"),
       ({"id": 9, "image_id": 12, "category_id": 1, "bbox": [6, float("nan"), 1, 4]},
        "box [6, nan, 1, 4] (x, y, w, h) has a non-finite number"),
       ({"id": 12, "image_id": 13, "category_id": 2, "bbox": [1, 1, 1, 1]},
        "category_id 2 is not one of the file's categories"),
       ({"id": 14, "image_id": 15, "category_id": 1, "bbox": [10**400, 1, 1, 1]},
        "bbox [1000000000"),
       ({"id": 15, "image_id": 16, "category_id": 1, "bbox": [1, 1, 1, "1"]},
        "bbox [1, 1, 1, '1'] is not 4 numbers (x, y, width, height)"),
       ({"id": 16, "image_id": 17, "category_id": 1, "bbox": [1, 1, 1, 1], "iscrowd": True},
        "iscrowd True, expected 0 or 1"),
       ({"id": 17, "image_id": 10, "category_id": 3, "bbox": [5, 6, 0, 4]},
        "box [5, 6, 0, 4] (x, y, w, h) has zero width (clipped to the 64x48 image)"),
       ({"id": 18, "image_id": 10, "category_id": 3, "bbox": [5, 48, 3, 0.005]},
        "box [5, 48, 3, 0.005] (x, y, w, h) has zero height (clipped to the 64x48 image)")]


def _tsv(dst):
    lines = (dst / "rejects.tsv").read_text().splitlines()
    assert lines[0] == "path\treason"
    return dict(line.split("\t") for line in lines[1:])


def test_bad_annotations_are_rejected_alone_and_their_images_kept(tmp_path):
    good = [{"id": 1, "image_id": 10, "category_id": 3, "bbox": [1, 2, 3, 4], "iscrowd": 1},
            {"id": 2, "image_id": 10, "category_id": 1, "bbox": [0, 0, 64.004, 48]},
            {"id": 3, "image_id": 14, "category_id": 1, "bbox": [2, 2, 2, 2]}]
    orphan = {"id": 11, "image_id": 99, "category_id": 1, "bbox": [1, 1, 1, 1]}
    anns = [good[0], BAD[0][0], good[1]] + [a for a, _ in BAD[1:]] + [good[2], orphan]
    images = [{"id": 10 + k, "file_name": f"imgs/{k}.jpg", "width": 64, "height": 48}
              for k in range(8)]
    coco = _coco(tmp_path, anns, images)
    result = convert(tmp_path / "src", tmp_path / "ds", coco=str(coco), workers=0,
                     progress=False)
    assert (result["num_samples"], result["rejects"], result["annotation_rejects"]) == \
        (8, 1, len(BAD))
    ds = Dataset(tmp_path / "ds")
    assert list(_rejects(ds)) == ["instances.json:annotation 11"]  # no image to keep
    tsv = _tsv(tmp_path / "ds")
    assert tsv.pop("instances.json:annotation 11").endswith("image_id 99 is not an image "
                                                            "of the file")
    image_of = {a["id"]: a["image_id"] for a, _ in BAD}
    assert sorted(tsv) == sorted(f"instances.json:annotation {a['id']}" for a, _ in BAD)
    for a, why in BAD:
        head = f"annotation {a['id']} of image {a['image_id']} " \
               f"(imgs/{image_of[a['id']] - 10}.jpg): "
        assert tsv[f"instances.json:annotation {a['id']}"].startswith(head + why)
    got = _by_path(ds)
    kept = got["imgs/0.jpg"]  # its good boxes, in file order, categories aligned
    np.testing.assert_array_equal(kept["boxes"], np.array([[1, 2, 4, 6], [0, 0, 64, 48]],
                                                          np.float32))
    assert kept["categories"].tolist() == [3, 1] and kept["iscrowd"].tolist() == [1, 0]
    assert got["imgs/4.jpg"]["boxes"].tolist() == [[2, 2, 4, 4]]
    for k in (1, 2, 3, 5, 6, 7):  # every annotation bad: kept with N = 0
        assert got[f"imgs/{k}.jpg"]["boxes"].shape == (0, 4)
        assert got[f"imgs/{k}.jpg"]["categories"].shape == (0,)
    out = CliRunner().invoke(main, ["convert", str(tmp_path / "src"), str(tmp_path / "d2"),
                                    "--coco", str(coco), "--skip-empty", "--workers", "0"])
    assert out.exit_code == 3, out.output  # the orphan annotation's reject is an input's
    assert "skipped 1 (see rejects.tsv)\nannotations rejected: 9 (their images packed " \
           "without them; see rejects.tsv)" in out.output
    assert sorted(_by_path(Dataset(tmp_path / "d2"))) == ["imgs/0.jpg", "imgs/4.jpg"]
    with pytest.raises(ConversionError, match=r"instances.json:annotation 7: annotation 7 "
                                              r"of image 10 \(imgs/0.jpg\): box .* outside"):
        convert(tmp_path / "src", tmp_path / "d3", coco=str(coco), workers=0,
                progress=False, on_error="fail", shuffle=False)
    assert not (tmp_path / "d3").exists()


def test_boxes_of_an_image_without_a_size_in_the_file_are_checked_against_its_header(
        tmp_path):
    anns = [{"id": 1, "image_id": 10, "category_id": 1, "bbox": [50, 1, 20, 4]},
            {"id": 2, "image_id": 10, "category_id": 1, "bbox": [50, 1, 14, 4]}]
    coco = _coco(tmp_path, anns, [{"id": 10, "file_name": "imgs/0.jpg"}])
    out = CliRunner().invoke(main, ["convert", str(tmp_path / "src"), str(tmp_path / "ds"),
                                    "--coco", str(coco), "--workers", "0"])
    assert out.exit_code == 0, out.output  # --max-rejects counts inputs, not annotations
    assert "annotations rejected: 1 " in out.output
    assert _tsv(tmp_path / "ds") == {"instances.json:annotation 1": "annotation 1 of image "
                                     "10 (imgs/0.jpg): box [50, 1, 20, 4] (x, y, w, h) lies "
                                     "outside the 64x48 image (width x height)"}
    assert _by_path(Dataset(tmp_path / "ds"))["imgs/0.jpg"]["boxes"].tolist() == \
        [[50, 1, 64, 5]]


@pytest.mark.parametrize("text, match", [
    ("[" * 100_000 + "]" * 100_000, "nested deeper than Python's recursion limit"),
    ('{"images": 3}', "expected an object with lists"),
    ('{"images": [], "categories": [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]}',
     r"categories\[1\]"),
    ('{"images": [], "categories": [{"id": true, "name": "a"}]}', r"categories\[0\]"),
    ('{"images": [{"id": 1, "file_name": "x.jpg"}], "annotations": [], "categories": '
     '[{"id": 1' + "0" * 30 + ', "name": "a"}]}', r"categories\[0\]"),
    ('{"images": [', "not valid JSON"),
    # more categories than a field spec's name table holds: refused here, not written as a
    # data set whose manifest every reader then refuses
    (json.dumps({"images": [], "categories": [{"id": k, "name": "c"} for k in
                                              range(100_001)]}), "100001 categories"),
])
def test_hostile_coco_files_are_refused_naming_the_file(tmp_path, text, match):
    (tmp_path / "src").mkdir()
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        convert(tmp_path / "src", tmp_path / "ds", coco=str(tmp_path / "bad.json"), workers=0,
                progress=False)
    assert "bad.json" in str(info.value)


def test_hostile_image_entries_are_rejects_and_nothing_outside_src_is_read(tmp_path):
    (tmp_path / "secret.jpg").write_bytes(b"not for us")
    images = [{"id": 1, "file_name": "../secret.jpg"}, {"id": 2, "file_name": "/etc/passwd"},
              {"id": 3, "file_name": "ok.jpg", "width": -5, "height": 48},
              {"id": 4, "file_name": "ok.jpg"}, {"id": 4, "file_name": "ok2.jpg"},
              {"id": "5", "file_name": "ok3.jpg"}, {"id": 6, "file_name": 7}]
    coco = _coco(tmp_path, [], images)
    _image(tmp_path / "src" / "ok2.jpg", 64, 48)
    convert(tmp_path / "src", tmp_path / "ds", coco=str(coco), workers=0, progress=False)
    ds = Dataset(tmp_path / "ds")
    why = sorted(_rejects(ds).values())
    assert len(why) == 6 and all(w.startswith(f"{coco}: images[") for w in why)
    assert any("must be relative to SRC" in w and "secret" in w for w in why)
    assert any("image 4: the id is repeated" in w for w in why)
    assert any("width, height -5, 48" in w for w in why)
    assert list(_by_path(ds)) == ["ok.jpg"]


def test_jsonl_boxes_are_checked_like_coco(tmp_path):
    src = tmp_path / "src"
    for k in range(4):
        _image(src / f"{k}.jpg", 32, 16)
    lines = [{"path": "0.jpg", "boxes": [[1, 2, 3.5, 4]], "categories": [7], "iscrowd": [0],
              "caption": "a"},
             {"path": "1.jpg", "boxes": [[1, 2, 40, 4], [2, 3, 5, 6], [4, 4, 4, 9]],
              "categories": [7, 9, 8], "iscrowd": [0, 1, 0], "caption": "b"},
             {"path": "2.jpg", "boxes": [], "categories": [], "iscrowd": [], "caption": "c"},
             {"path": "3.jpg", "boxes": [[1, 2, 3, 4]], "categories": [7, 8], "iscrowd": [0],
              "caption": "d"}]
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    result = convert(src, tmp_path / "ds", list_file=str(tmp_path / "l.jsonl"), workers=0,
                     progress=False)
    assert (result["rejects"], result["annotation_rejects"]) == (1, 2)
    ds = Dataset(tmp_path / "ds")
    assert set(ds.fields) == {"boxes", "categories", "iscrowd", "caption"}
    got = _by_path(ds)
    assert got["0.jpg"]["boxes"].tolist() == [[1, 2, 3.5, 4]]
    assert got["0.jpg"]["categories"].tolist() == [7] and got["0.jpg"]["caption"] == "a"
    kept = got["1.jpg"]  # box 1 alone is good: kept with its category and iscrowd
    assert kept["boxes"].tolist() == [[2, 3, 5, 6]] and kept["categories"].tolist() == [9]
    assert kept["iscrowd"].tolist() == [1] and kept["caption"] == "b"
    assert got["2.jpg"]["boxes"].shape == (0, 4)
    assert _rejects(ds) == {"3.jpg": "3.jpg: categories [7, 8]: expected 1 integers "
                                     "-9223372036854775808..9223372036854775807, one per box"}
    assert {k: v for k, v in _tsv(tmp_path / "ds").items() if "box" in k} == {
        "l.jsonl:1.jpg:box 0": "box 0 of 1.jpg: box [1, 2, 40, 4] (x0, y0, x1, y1) lies "
                               "outside the 32x16 image (width x height)",
        "l.jsonl:1.jpg:box 2": "box 2 of 1.jpg: box [4, 4, 4, 9] (x0, y0, x1, y1) has zero "
                               "width (clipped to the 32x16 image)"}
    with pytest.raises(ConversionError, match="l.jsonl:1.jpg:box 0: box 0 of 1.jpg: .* lies "
                                              "outside"):
        convert(src, tmp_path / "d2", list_file=str(tmp_path / "l.jsonl"), workers=0,
                progress=False, on_error="fail")


def _label_map(w, h, rect, value, mode="L"):
    arr = np.zeros((h, w), np.uint16 if mode == "I;16" else np.uint8)
    x0, y0, x1, y1 = rect
    arr[y0:y1, x0:x1] = value
    return Image.fromarray(arr) if mode != "P" else Image.fromarray(arr).convert("P")


def test_sidecar_masks_are_fields_not_inputs_and_size_is_checked(tmp_path):
    src = tmp_path / "src" / "cls"
    for k in range(4):
        _image(src / f"{k}.jpg", 20, 10)
    _label_map(20, 10, (2, 3, 5, 7), 9).save(src / "0.mask.png")
    _label_map(20, 10, (0, 0, 20, 1), 300, "I;16").save(src / "1.mask.png")
    _label_map(21, 10, (0, 0, 1, 1), 1).save(src / "2.mask.png")
    convert(tmp_path / "src", tmp_path / "ds", workers=0, progress=False)
    ds = Dataset(tmp_path / "ds", verify_checksums=True)
    assert ds.fields["mask"] == {"type": "array", "dtype": "uint8", "ndim": 2, "shape": None,
                                 "codec": "zlib"}
    got = _by_path(ds)
    assert sorted(got) == ["cls/0.jpg"]  # no .mask.png became an image
    mask = got["cls/0.jpg"]["mask"]
    assert mask.shape == (10, 20) and mask.dtype == np.uint8
    assert mask.sum() == 9 * 12 and (mask[3:7, 2:5] == 9).all()
    rejects = _rejects(ds)
    assert "holds class ids 0..300" in rejects["cls/1.jpg"]
    assert rejects["cls/2.jpg"] == f"mask {src}/2.mask.png is 21x10, its image is 20x10 " \
                                   f"(width x height, as stored)"
    assert rejects["cls/3.jpg"].startswith(f"no mask {src}/3.mask.png")


def test_masks_dir_mirrors_src_palette_and_16_bit(tmp_path):
    src, masks = tmp_path / "src", tmp_path / "masks"
    _image(src / "a" / "x.jpg", 12, 8)
    _image(src / "a" / "y.jpg", 12, 8)
    _image(src / "b" / "z.jpg", 12, 8)
    (masks / "a").mkdir(parents=True)
    (masks / "b").mkdir()
    _label_map(12, 8, (1, 1, 3, 2), 1000, "I;16").save(masks / "a" / "x.png")
    _label_map(12, 8, (4, 4, 6, 8), 21, "P").save(masks / "a" / "y.png")
    Image.new("RGB", (12, 8), (255, 0, 0)).save(masks / "b" / "z.png")
    convert(src, tmp_path / "ds", masks=str(masks), workers=0, progress=False)
    ds = Dataset(tmp_path / "ds")
    assert ds.fields["mask"]["dtype"] == "uint16"  # the first mask decides
    got = _by_path(ds)
    assert got["a/x.jpg"]["mask"].dtype == np.uint16
    assert np.argwhere(got["a/x.jpg"]["mask"] == 1000).tolist() == [[1, 1], [1, 2]]
    assert int(got["a/y.jpg"]["mask"].sum()) == 21 * 8
    assert "is a RGB image; expected a label map" in _rejects(ds)["b/z.jpg"]


def _exif_jpeg(path, arr, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(arr).save(path, quality=100, exif=exif.tobytes())


@pytest.mark.parametrize("orientation, box, where", [
    (6, [14, 4, 22, 12], (slice(4, 12), slice(14, 22))),   # turned clockwise: 24 x 40
    (3, [28, 14, 36, 22], (slice(14, 22), slice(28, 36))),  # turned half round: 40 x 24
    (8, [2, 28, 10, 36], (slice(28, 36), slice(2, 10)))])  # counter-clockwise: 24 x 40
def test_exif_orientation_moves_boxes_and_mask_with_the_image(tmp_path, orientation, box, where):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    raw = np.zeros((24, 40, 3), np.uint8)
    raw[2:10, 4:12] = 255  # the object, stored at x 4..12, y 2..10 of a 40 x 24 image
    _exif_jpeg(src / "r.jpg", raw, orientation)
    _label_map(40, 24, (4, 2, 12, 10), 5).save(src / "r.mask.png")
    (tmp_path / "l.jsonl").write_text(json.dumps(
        {"path": "c/r.jpg", "boxes": [[4, 2, 12, 10]], "categories": [1]}))
    convert(tmp_path / "src", tmp_path / "ds", list_file=str(tmp_path / "l.jsonl"),
            workers=0, progress=False)
    s = Dataset(tmp_path / "ds").sample(0)
    assert s["boxes"].tolist() == [box]
    expected = np.zeros(s["image"].shape[:2], np.uint8)
    expected[where] = 5
    np.testing.assert_array_equal(s["mask"], expected)  # every pixel pinned
    bright = s["image"].mean(axis=2) > 127
    np.testing.assert_array_equal(bright, expected == 5)  # the image's object is there too


def test_resizing_options_are_refused_with_targets(tmp_path):
    coco = _coco(tmp_path, GOOD)
    with pytest.raises(ValueError, match="--size / --max-side would resize the image"):
        convert(tmp_path / "src", tmp_path / "ds", coco=str(coco), max_side=32, workers=0,
                progress=False)


def test_deep_coco_is_measured_before_parsing_where_the_recursion_limit_is_high(
        tmp_path, monkeypatch):
    import sys

    from dlpack_io.packer import targetinputs

    monkeypatch.setattr(targetinputs, "_CHUNK", 4096)  # several chunks, a carry across each
    (tmp_path / "src").mkdir()
    # a string of brackets ending in an escaped backslash, then the real nesting
    text = '{"images": [], "x": "' + "[" * 9000 + chr(92) * 2 + '"}' + "[" * 100_000 \
        + "]" * 100_000
    (tmp_path / "deep.json").write_text(text)
    monkeypatch.setattr(sys, "getrecursionlimit", lambda: 1_000_000)  # never parsed
    with pytest.raises(ValueError, match="deep.json: JSON nested 100000 levels"):
        convert(tmp_path / "src", tmp_path / "ds", coco=str(tmp_path / "deep.json"),
                workers=0, progress=False)


def test_skip_empty_with_a_list(tmp_path):
    src = tmp_path / "src"
    for k in range(3):
        _image(src / f"{k}.jpg", 32, 16)
    lines = [{"path": f"{k}.jpg", "boxes": [[1, 1, 2, 2]] * k, "categories": [1] * k}
             for k in range(3)]
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    convert(src, tmp_path / "ds", list_file=str(tmp_path / "l.jsonl"), skip_empty=True,
            workers=0, progress=False)
    got = _by_path(Dataset(tmp_path / "ds"))
    assert sorted(got) == ["1.jpg", "2.jpg"] and got["2.jpg"]["boxes"].shape == (2, 4)
