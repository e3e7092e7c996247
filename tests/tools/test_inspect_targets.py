"""dlpack inspect --grid on a data set with boxes and masks (issue 25): the boxes drawn
where they are, in their category's colour, the mask blended over its pixels; and
--augmented draws what the Loader yields."""
from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner
from PIL import Image

from dlpack_io.packer import convert
from dlpack_io.tools.cli import main
from dlpack_io.tools.targetsheet import MASK_ALPHA, colour, draw_boxes

GREY = 10


def _dataset(tmp_path):
    """One 160 x 120 PNG (stored as raw pixels: exact), a box of category 3 "car" at
    x 40..100, y 30..90 and a mask of label 1 under it."""
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(np.full((120, 160, 3), GREY, np.uint8)).save(src / "a.png")
    mask = np.zeros((120, 160), np.uint8)
    mask[30:90, 40:100] = 1
    Image.fromarray(mask).save(src / "a.mask.png")
    coco = {"images": [{"id": 5, "file_name": "a.png", "width": 160, "height": 120}],
            "annotations": [{"id": 1, "image_id": 5, "category_id": 3, "bbox": [40, 30, 60, 60]}],
            "categories": [{"id": 3, "name": "car"}]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    convert(src, tmp_path / "ds", coco=str(tmp_path / "coco.json"), workers=0, progress=False)
    return str(tmp_path / "ds")


def test_grid_draws_boxes_and_mask_where_they_are(tmp_path):
    ds = _dataset(tmp_path)
    out = tmp_path / "sheet.png"
    result = CliRunner().invoke(main, ["inspect", ds, "--grid", str(out), "--json"])
    assert result.exit_code == 0, result.output
    # a 160 x 120 image in a 160 x 160 cell: not scaled, pasted 20 pixels down
    assert json.loads(result.output)["boxes"] == [[[40, 50, 99, 109]]]
    sheet = np.asarray(Image.open(out).convert("RGB")).astype(int)
    car = np.array(colour(3))
    for x, y in ((40, 80), (41, 80), (99, 80), (70, 109)):  # the outline, 2 pixels wide
        assert sheet[y, x].tolist() == car.tolist(), (x, y)
    blended = np.round(GREY * (1 - MASK_ALPHA) + np.array(colour(1)) * MASK_ALPHA)
    assert sheet[80, 70].tolist() == blended.tolist()  # inside the box: under the mask
    assert sheet[80, 20].tolist() == [GREY] * 3 and sheet[80, 120].tolist() == [GREY] * 3
    assert sheet[80, 38].tolist() == [GREY] * 3  # nothing drawn just outside the box
    assert (sheet[51:62, 44:60] == car).all(axis=2).sum() > 20  # the name tag of "car"


def test_boxes_thinner_than_a_thumbnail_pixel_are_drawn_and_damaged_ones_skipped():
    # a 640-pixel image in a 160-pixel cell: a 1-pixel COCO box is a quarter pixel wide
    thumb = Image.new("RGB", (160, 120), "black")
    drawn = draw_boxes(thumb, [[100, 100, 101, 110], [5, 5, 5.2, 5.2],
                               [float("nan"), 0, 4, 4]], [1, 2, 3], None, (0.25, 0.25))
    assert drawn == [[25, 25, 25, 27], [1, 1, 1, 1]]
    assert np.asarray(thumb)[26, 25].tolist() == list(colour(1))


def test_augmented_grid_draws_what_the_loader_yields(tmp_path):
    ds = _dataset(tmp_path)
    out = tmp_path / "aug.png"
    result = CliRunner().invoke(main, ["inspect", ds, "--grid", str(out), "--augmented",
                                       "--json"])
    assert result.exit_code == 0, result.output  # the Loader moves boxes and masks
    data = json.loads(result.output)
    assert data["samples"] == [0] and data["fields"] == ["boxes", "categories", "mask"]
    assert Image.open(out).size == (data["width"], data["height"]) == (1280, 176)
    assert len(data["boxes"]) == 1 and len(data["boxes"][0]) <= 1  # a crop may remove it
    # the Loader moves the mask with the image (224 x 224): none is left unmoved, no warning
    assert data["masks_not_moved"] == 0
    text = CliRunner().invoke(main, ["inspect", ds, "--grid", str(out), "--augmented"]).output
    assert "mask not of the size of the image" not in text
    result = CliRunner().invoke(main, ["inspect", ds, "--augmented"])
    assert result.exit_code != 0 and "give --grid FILE too" in result.output
