"""The convert summary names the fields it found beside the images and how many sidecar
files of each; sidecars are not counted as ignored files (those not packed are)."""
from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner
from PIL import Image

from dlpack_io.tools.cli import main


def _src(root):
    for k, name in enumerate(["a/x", "a/y", "b/z"]):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), 40 * k, np.uint8)).save(root / f"{name}.jpg")
        (root / f"{name}.txt").write_text(f"caption {k}")
    (root / "a" / "x.json").write_text('{"k": 0}')
    (root / "a" / "y.json").write_text('{"k": 1}')
    (root / "a" / "README.txt").write_text("beside no image: not a sidecar")
    (root / "b" / "notes.md").write_text("not an image")
    (root / "b" / "z.TXT").write_text("another suffix than the sidecar's .txt")
    return root


def _convert(src, dst, *extra):
    result = CliRunner().invoke(main, ["convert", str(src), str(dst), "--workers", "1",
                                       "--quiet", *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_summary_counts_sidecars_per_field_not_as_ignored(tmp_path):
    src = _src(tmp_path / "src")
    out = _convert(src, tmp_path / "ds", "--max-rejects", "1")
    assert "fields: txt (str, 3 sidecar files found), json (json, 2 sidecar files found)" in out
    assert "ignored 3 files without an image suffix (.md 1, .txt 2)" in out  # README, z.TXT
    assert "skipped 1 (see rejects.tsv)" in out  # b/z.jpg has no .json
    summary = json.loads(_convert(src, tmp_path / "js", "--json", "--max-rejects", "1"))
    assert summary["sidecars"] == {"txt": 3, "json": 2}
    assert summary["ignored"] == {".md": 1, ".txt": 2}


def test_sidecars_left_out_by_fields_are_ignored_files(tmp_path):
    src = _src(tmp_path / "src")
    summary = json.loads(_convert(src, tmp_path / "ds", "--fields", "txt", "--json"))
    assert summary["sidecars"] == {"txt": 3} and list(summary["fields"]) == ["txt"]
    assert summary["ignored"] == {".json": 2, ".md": 1, ".txt": 2} and summary["rejects"] == 0
    summary = json.loads(_convert(src, tmp_path / "none", "--fields", "none", "--json"))
    assert summary["sidecars"] == {} and summary["fields"] == {}
    assert summary["ignored"] == {".json": 2, ".md": 1, ".txt": 5}
