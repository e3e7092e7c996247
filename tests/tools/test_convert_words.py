"""The words of a conversion match what happened: the rate after --append or --resume is
this run's images over this run's seconds (not the data set's total), --on-error fail on
a bad annotation never first says its image is packed, and --replace-changed never counts
"original bytes kept: -1"."""
from __future__ import annotations

import json
import logging
import re

import numpy as np
from click.testing import CliRunner
from PIL import Image

from dlpack_io.packer import convert
from dlpack_io.packer.records import ConversionError
from dlpack_io.tools.cli import main
from dlpack_io.tools.synth import make_image_folder

from helpers import convert_stopped_at


def _cli(*args):
    return CliRunner().invoke(main, ["convert", *map(str, args), "--workers", "1", "--quiet"],
                              catch_exceptions=False)


def _first_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("packed "))


def test_an_append_reports_this_runs_images_and_rate(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "ds"
    make_image_folder(src, 40, 2, seed=0, size=(24, 24))
    assert _cli(src, dst).exit_code == 0
    make_image_folder(tmp_path / "more", 3, 1, seed=1, size=(24, 24))
    for path in (tmp_path / "more").rglob("*.jpg"):
        path.rename(src / "class_00" / f"new_{path.name}")
    out = _cli(src, dst, "--append").output
    line = _first_line(out)
    match = re.match(r"packed 3 images this run in ([\d.]+) s: (\d+) images/s, .* \(appended\); "
                     r"the data set holds 43 images in \d+ shards? ", line)
    assert match, line
    summary = json.loads(_cli(src, tmp_path / "js", "--json").output)
    assert summary["run_samples"] == summary["num_samples"] == 43
    assert abs(summary["images_per_s"] * summary["seconds"] - 43) < 1e-6


def test_on_error_fail_never_says_the_images_are_packed(tmp_path, caplog):
    (tmp_path / "src").mkdir()
    Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(tmp_path / "src" / "a.jpg")
    coco = tmp_path / "instances.json"
    coco.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
        "annotations": [{"id": 7, "image_id": 1, "category_id": 1, "bbox": [60, 1, 30, 4]}],
        "categories": [{"id": 1, "name": "person"}]}))
    caplog.set_level(logging.INFO)
    try:
        convert(tmp_path / "src", tmp_path / "ds", coco=str(coco), workers=0, progress=False,
                on_error="fail")
    except ConversionError as exc:
        assert "--on-error fail stops" in str(exc)
    else:
        raise AssertionError("--on-error fail packed a bad annotation")
    assert "packed" not in caplog.text, caplog.text
    assert not (tmp_path / "ds").exists()
    caplog.clear()
    convert(tmp_path / "src", tmp_path / "ok", coco=str(coco), workers=0, progress=False)
    assert "1 annotations rejected" in caplog.text and "packed with the other" in caplog.text


def test_replace_changed_counts_records_not_samples(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "ds"
    make_image_folder(src, 4, 1, seed=0, size=(24, 24))
    assert _cli(src, dst).exit_code == 0
    first = sorted((src / "class_00").iterdir())[0]
    Image.fromarray(np.zeros((24, 24, 3), np.uint8)).save(first)
    out = _cli(src, dst, "--append", "--replace-changed").output
    kept = re.search(r"original bytes kept: (-?\d+)", out)
    assert kept and int(kept.group(1)) >= 0, out
    assert "of the 5 records stored, 1 retired by --replace-changed" in out


def test_a_resumed_run_reports_the_images_it_packed(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "ds"
    make_image_folder(src, 30, 1, seed=0, size=(48, 48))
    convert_stopped_at("journal:1", ["convert", src, dst, "--shard-size", "20KB",
                                     "--workers", "1", "--quiet"][1:])
    out = _cli(src, dst, "--shard-size", "20KB", "--resume").output
    line = _first_line(out)
    match = re.match(r"packed (\d+) images this run in [\d.]+ s: \d+ images/s, .* \(resumed "
                     r"at input (\d+)\); the data set holds 30 images in", line)
    assert match, line
    assert int(match.group(1)) == 30 - int(match.group(2)) and int(match.group(2)) > 0
