"""Writer with boxes, categories and masks (issue 25): checked as dlpack convert checks
them, turned upright with an EXIF-rotated image, masks stored compressed."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from dlpack_io.packer import Writer
from dlpack_io.reader import Dataset


def test_writer_targets_round_trip_and_are_per_sample(tmp_path):
    image = np.zeros((20, 30, 3), np.uint8)
    mask = np.zeros((20, 30), np.uint8)
    mask[5:9, 1:4] = 3
    with Writer(tmp_path / "ds") as w:
        w.write(image=image, boxes=[[1, 2, 3, 4]], categories=[5], mask=mask)
        w.write(image=image, boxes=np.zeros((0, 4), np.float32), categories=[], mask=mask)
    ds = Dataset(tmp_path / "ds", verify_checksums=True)
    assert ds.fields["boxes"]["shape"] is None and ds.fields["mask"]["codec"] == "zlib"
    a, b = ds.sample(0), ds.sample(1)
    assert a["boxes"].dtype == np.float32 and a["boxes"].tolist() == [[1, 2, 3, 4]]
    assert a["categories"].tolist() == [5] and b["boxes"].shape == (0, 4)
    np.testing.assert_array_equal(b["mask"], mask)


@pytest.mark.parametrize("fields, match", [
    ({"boxes": [[1, 2, 33, 4]], "categories": [5]}, "box 0: .* lies outside the 30x20 image"),
    ({"boxes": [[3, 2, 1, 4]]}, "box 0: .* has a negative width"),
    ({"boxes": [[1, 2, float("inf"), 4]]}, "box 0: .* non-finite"),
    ({"boxes": [[1, 2, 3, 4], [5, 6, 5, 9]]}, r"box 1: box \[5, 6, 5, 9\] \(x0, y0, x1, y1\) "
                                             r"has zero width \(clipped to the 30x20 image\)"),
    ({"boxes": [[1, 20, 3, 20.004]]}, "box 0: .* has zero height"),
    ({"boxes": [[1, 2, 3]]}, "boxes: expected a list of"),
    ({"boxes": [[1, 2, 3, 4]], "categories": [5, 6]}, "categories .*expected 1 integers"),
])
def test_writer_refuses_bad_targets_naming_the_sample(tmp_path, fields, match):
    with Writer(tmp_path / "ds") as w:
        with pytest.raises(ValueError, match=f"sample 0: {match}"):
            w.write(image=np.zeros((20, 30, 3), np.uint8), **fields)
        w.write(image=np.zeros((20, 30, 3), np.uint8))
    assert len(Dataset(tmp_path / "ds")) == 1  # nothing was written for the refused call


def test_writer_turns_boxes_and_mask_with_an_exif_rotated_path(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 40 x 24, shown 24 x 40 (turned clockwise)
    Image.new("RGB", (40, 24)).save(tmp_path / "r.jpg", exif=exif.tobytes())
    mask = np.zeros((24, 40), np.uint8)
    mask[2:10, 4:12] = 1
    with Writer(tmp_path / "ds") as w:
        w.write(image=tmp_path / "r.jpg", boxes=[[4, 2, 12, 10]], mask=mask)
    s = Dataset(tmp_path / "ds").sample(0)
    assert s["image"].shape == (40, 24, 3) and s["boxes"].tolist() == [[14, 4, 22, 12]]
    assert np.argwhere(s["mask"]).min(0).tolist() == [4, 14]
    assert np.argwhere(s["mask"]).max(0).tolist() == [11, 21] and s["mask"].sum() == 64


def test_a_mask_of_another_shape_stays_an_ordinary_array(tmp_path):
    with Writer(tmp_path / "ds") as w:
        w.write(image=np.zeros((20, 30, 3), np.uint8), mask=np.ones((3, 2), np.uint16))
    ds = Dataset(tmp_path / "ds")
    assert "codec" not in ds.fields["mask"] and ds.sample(0)["mask"].tolist() == [[1, 1]] * 3


def test_a_later_mask_of_another_size_than_its_image_is_refused_before_it_is_written(tmp_path):
    """The first mask made "mask" a segmentation mask (readers hold it to its image's size):
    a later mask of another size would make an unreadable record, so the write is refused."""
    img = np.zeros((20, 30, 3), np.uint8)
    with Writer(tmp_path / "ds", mode="jpeg") as w:
        w.write(image=img, label=0, mask=np.full((20, 30), 3, np.uint8))
        with pytest.raises(ValueError, match=r"sample 1: field 'mask' of shape \(10, 30\) is "
                                             r"not a 2-D uint8/uint16 label map"):
            w.write(image=img, label=0, mask=np.zeros((10, 30), np.uint8))
        w.write(image=img, label=1, mask=np.full((20, 30), 5, np.uint8))
    ds = Dataset(tmp_path / "ds")
    assert len(ds) == 2 and [int(ds.sample(i)["mask"][0, 0]) for i in range(2)] == [3, 5]
