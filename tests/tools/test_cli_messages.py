"""What the dlpack command says when it is pointed at the wrong thing (issue 13 item 5):
plain words, one line, the right next step, a distinct exit status, no log spam."""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dlpack_io.tools.cli import main
from dlpack_io.tools.verification import EXIT_NOT_A_DATASET


@pytest.fixture(scope="module")
def one_shard(image_folder, tmp_path_factory):
    dst = tmp_path_factory.mktemp("msg") / "ds"
    result = CliRunner().invoke(main, ["convert", str(image_folder), str(dst), "--quiet",
                                       "--workers", "1"])
    assert result.exit_code == 0, result.output
    return dst


def test_verify_on_a_jpeg_folder_says_it_is_not_a_data_set(image_folder):
    """Before: "DAMAGED (1 problems)", exit 1, as for a damaged data set."""
    result = CliRunner().invoke(main, ["verify", str(image_folder), "--quiet"])
    assert result.exit_code == EXIT_NOT_A_DATASET == 3
    assert "looks like a folder of images: pack it with 'dlpack convert" in result.output
    assert "DAMAGED" not in result.output and "problems" not in result.output
    report = json.loads(CliRunner().invoke(main, ["verify", str(image_folder), "--quiet",
                                                  "--json"]).output)
    assert report["not_a_dataset"] and report["exit_code"] == 3


def test_inspect_on_a_jpeg_folder_does_not_suggest_resume(image_folder):
    result = CliRunner().invoke(main, ["inspect", str(image_folder)])
    assert result.exit_code == 1
    assert "is not a dlpack data set (no manifest.json)" in result.output
    assert "--resume" not in result.output and "dlpack convert" in result.output


def test_inspect_on_an_interrupted_conversion_does_suggest_resume(tmp_path):
    (tmp_path / ".dlpack-convert.journal").write_text("{}\n")
    result = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert result.exit_code == 1 and "--resume" in result.output


def test_grid_without_an_extension_writes_a_png(one_shard, tmp_path):
    """Before: "unknown file extension: "."""
    result = CliRunner().invoke(main, ["inspect", str(one_shard), "--grid",
                                       str(tmp_path / "sheet2"), "--grid-count", "4"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sheet2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "4 images)" in result.output
    bad = CliRunner().invoke(main, ["inspect", str(one_shard), "--grid", str(tmp_path / "x.foo")])
    assert bad.exit_code == 1 and "cannot write a .foo image; use .png" in bad.output


def test_index_minus_one_is_the_last_sample(one_shard):
    """Before: printed "sample -1"."""
    result = CliRunner().invoke(main, ["inspect", str(one_shard), "--index", "-1"])
    assert result.exit_code == 0, result.output
    assert "sample    23" in result.output and "-1" not in result.output.split("\n")[0]


def test_counts_are_plain_words(one_shard):
    """Before: "1 shards", Python list reprs of label counts."""
    summary = CliRunner().invoke(main, ["inspect", str(one_shard)]).output
    assert "24 samples in 1 shard," in summary and "1 shards" not in summary
    shard = CliRunner().invoke(main, ["inspect", str(one_shard), "--shard", "0"]).output
    assert "label counts 0: 8, 1: 8, 2: 8" in shard and "[" not in shard
    ok = CliRunner().invoke(main, ["verify", str(one_shard), "--quiet"]).output
    assert "OK: " in ok and "1 shard, 24 records" in ok


def test_nothing_packed_lists_reasons_without_python_reprs(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.jpg").write_text("not an image")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "src"), str(tmp_path / "ds"),
                                       "--quiet", "--workers", "1"])
    assert result.exit_code == 1
    assert "none of the 1 inputs could be packed; most common reasons: " in result.output
    assert "[(" not in result.output and "(1x)" in result.output


def test_progress_is_not_redrawn_into_a_log_file(image_folder, tmp_path):
    """Before: a tqdm bar's carriage returns filled batch logs (stderr not a terminal)."""
    done = subprocess.run([sys.executable, "-m", "dlpack_io.tools.cli", "convert",
                           str(image_folder), str(tmp_path / "ds"), "--workers", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    verify = subprocess.run([sys.executable, "-m", "dlpack_io.tools.cli", "verify",
                             str(tmp_path / "ds")], capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0 and "\r" not in verify.stderr
