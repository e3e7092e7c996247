"""A COCO file or a list names files relative to SRC; one that is a symlink (or lies in a
linked folder) leading outside SRC is followed like a folder scan's entries, and the
summary says so: never "0 outside SRC" for an image read from elsewhere."""
from __future__ import annotations

import json
import os

import numpy as np
from click.testing import CliRunner
from PIL import Image

from dlpack_io.packer import convert
from dlpack_io.tools.cli import main


def _jpeg(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((16, 24, 3), value, np.uint8)).save(path)


def _layout(tmp_path):
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    _jpeg(src / "in.jpg", 10)
    _jpeg(src / "real" / "inside.jpg", 20)
    _jpeg(elsewhere / "secret.jpg", 30)
    _jpeg(elsewhere / "photos" / "far.jpg", 40)
    os.symlink(elsewhere / "secret.jpg", src / "link.jpg")         # a file link, outside
    os.symlink(elsewhere / "photos", src / "photos")               # a folder link, outside
    os.symlink(src / "real" / "inside.jpg", src / "alias.jpg")     # a link inside SRC
    return src, ["in.jpg", "link.jpg", "photos/far.jpg", "alias.jpg"]


def test_coco_images_through_links_are_counted(tmp_path):
    src, names = _layout(tmp_path)
    coco = tmp_path / "instances.json"
    coco.write_text(json.dumps({
        "images": [{"id": k, "file_name": n, "width": 24, "height": 16}
                   for k, n in enumerate(names)],
        "annotations": [], "categories": [{"id": 1, "name": "person"}]}))
    summary = convert(src, tmp_path / "ds", coco=str(coco), workers=1, progress=False)
    assert summary["num_samples"] == 4
    assert (summary["via_links"], summary["outside_src"]) == (3, 2)
    out = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "cli"), "--coco",
                                    str(coco), "--workers", "1", "--quiet"])
    assert "symlinks: 3 inputs reached through a link, 2 of them outside SRC" in out.output


def test_list_inputs_through_links_are_counted(tmp_path):
    src, names = _layout(tmp_path)
    listed = tmp_path / "list.csv"
    listed.write_text("".join(f"{n},c{k % 2}\n" for k, n in enumerate(names)))
    summary = convert(src, tmp_path / "ds", list_file=str(listed), workers=1, progress=False)
    assert (summary["via_links"], summary["outside_src"]) == (3, 2)
