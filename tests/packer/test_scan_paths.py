"""The scan's relative paths (sliced from the walked path, not pathlib per file) and its
count of ``*.mask.png`` files, which spares the sidecar-mask probe a stat per input."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlpack_io.packer import targets
from dlpack_io.packer.scan import scan_image_folder
from dlpack_io.tools.synth import make_image_folder


@pytest.mark.parametrize("how", ["absolute", "relative", "dot", "trailing slash"])
def test_relative_paths_are_those_pathlib_gives(tmp_path, monkeypatch, how):
    make_image_folder(tmp_path / "src", 6, 2, seed=1, size=(16, 16))
    os.makedirs(tmp_path / "src" / "class_01" / "deeper")
    os.link(tmp_path / "src" / "class_00" / "img_000000.jpg",
            tmp_path / "src" / "class_01" / "deeper" / "x é.jpg")
    monkeypatch.chdir(tmp_path / "src" if how == "dot" else tmp_path)
    root = {"absolute": str(tmp_path / "src"), "relative": "src", "dot": ".",
            "trailing slash": str(tmp_path / "src") + "/"}[how]
    expected = sorted(p.relative_to(tmp_path / "src").as_posix()
                      for p in (tmp_path / "src").rglob("*.jpg"))
    inputs = scan_image_folder(root)
    assert sorted(inputs.paths) == expected and len(expected) == 7
    assert "class_01/deeper/x é.jpg" in inputs.paths


def test_no_mask_file_seen_means_no_probe(tmp_path, monkeypatch):
    make_image_folder(tmp_path / "src", 4, 1, seed=2, size=(16, 16))
    inputs = scan_image_folder(tmp_path / "src")
    assert inputs.mask_files == 0

    def no_stat(path):
        raise AssertionError(f"probed {path}")

    monkeypatch.setattr(targets.os.path, "isfile", no_stat)
    assert targets.sidecar_masks(inputs) == (inputs, None)


def test_a_mask_file_seen_means_the_probe_runs(tmp_path):
    make_image_folder(tmp_path / "src", 4, 1, seed=2, size=(16, 16))
    folder = tmp_path / "src" / "class_00"
    first = sorted(os.listdir(folder))[0]
    Path(folder / first.replace(".jpg", ".MASK.PNG")).write_bytes(b"x")  # counted: any case
    assert scan_image_folder(tmp_path / "src").mask_files == 1
    Path(folder / first.replace(".jpg", ".MASK.PNG")).unlink()
    Path(folder / first.replace(".jpg", ".mask.png")).write_bytes(b"x")
    inputs = scan_image_folder(tmp_path / "src")
    kept, masks = targets.sidecar_masks(inputs)
    assert inputs.mask_files == 1 and len(kept.paths) == 4
    assert masks[0] == str(folder / first.replace(".jpg", ".mask.png"))
