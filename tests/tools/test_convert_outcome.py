"""How `dlpack convert` ends: Ctrl-C names the command that resumes, rejects above
--max-rejects exit 3 with a summary line, every mode's summary says what was stored, and
ImageFolder's extensions and hidden files are handled and counted."""
import os
import shlex
import signal
import subprocess
import sys

import pytest
from PIL import Image

from dlpack_io.reader import Dataset
from dlpack_io.tools.convert_outcome import (EXIT_REJECTS, parse_max_rejects, rejects_verdict,
                                             resume_command)
from dlpack_io.tools.synth import make_image_folder

from helpers import STOPPING_CONVERT

CLI = [sys.executable, "-m", "dlpack_io.tools.cli"]


def _convert(*args, check_rc=None):
    done = subprocess.run(CLI + ["convert", *map(str, args)], capture_output=True, text=True,
                          timeout=300)
    if check_rc is not None:
        assert done.returncode == check_rc, done.stderr
    return done


@pytest.fixture
def src(tmp_path):
    make_image_folder(tmp_path / "src", 8, 2, seed=1, size=(48, 64))
    return tmp_path / "src"


# ---- --max-rejects --------------------------------------------------------------------------
@pytest.mark.parametrize("text,parsed", [("0", (0, False)), ("12", (12, False)),
                                         ("2.5%", (2.5, True)), (" 100 % ", (100, True))])
def test_max_rejects_takes_a_count_or_a_percentage(text, parsed):
    assert parse_max_rejects(text) == parsed


@pytest.mark.parametrize("text,match", [("2x", "a count .* or a percentage"),
                                        ("-1", "a count"), ("101%", "at most 100%"),
                                        ("2.5", "whole number")])
def test_max_rejects_refuses_what_it_cannot_mean(text, match):
    with pytest.raises(ValueError, match=match):
        parse_max_rejects(text)


def test_rejects_verdict_counts_and_percentages():
    assert rejects_verdict(0, 8, (0, False)) == ("", False)
    line, over = rejects_verdict(5, 3, (0, False), "d/rejects.tsv")
    assert over and line.startswith("rejects: 5 of 8 inputs (62.5%) were rejected and are "
                                    "listed in d/rejects.tsv; the data set holds the other 3")
    assert "more than --max-rejects 0: exit code 3" in line
    assert rejects_verdict(5, 3, (5, False))[1] is False
    assert rejects_verdict(5, 3, (62.5, True))[1] is False
    assert rejects_verdict(5, 3, (62.4, True))[1] is True


def test_a_convert_with_rejects_exits_3_and_says_so_the_data_set_is_complete(src, tmp_path):
    for k in range(5):
        (src / "class_01" / f"bad{k}.jpg").write_bytes(b"not a jpeg")
    done = _convert(src, tmp_path / "ds", "--quiet", check_rc=EXIT_REJECTS)
    assert (f"rejects: 5 of 13 inputs (38.5%) were rejected and are listed in "
            f"{tmp_path / 'ds'}/rejects.tsv; the data set holds the other 8") in done.stderr
    assert Dataset(tmp_path / "ds").manifest["num_samples"] == 8
    assert _convert(src, tmp_path / "ds2", "--quiet", "--max-rejects", "5", check_rc=0)
    assert _convert(src, tmp_path / "ds3", "--quiet", "--max-rejects", "38%",
                    check_rc=EXIT_REJECTS)
    assert _convert(src, tmp_path / "ds4", "--json", "--max-rejects", "40%", check_rc=0)
    help_text = subprocess.run(CLI + ["convert", "--help"], capture_output=True,
                               text=True).stdout
    assert "3 done, but more rejects than --max-rejects" in help_text
    assert "130 interrupted" in help_text


# ---- Ctrl-C ------------------------------------------------------------------------------
def _stopped_convert(args):
    """A convert (see helpers.STOPPING_CONVERT) stopped as it journals its second shard."""
    env = dict(os.environ, DLPACK_TEST_STOP_AT="journal:2")
    proc = subprocess.Popen([sys.executable, "-c", STOPPING_CONVERT, "convert", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)  # blocks until it stops (or ends)
    assert os.WIFSTOPPED(status), "convert ended before its first shard"
    return proc


def test_ctrl_c_ends_with_the_one_command_that_resumes(src, tmp_path):
    dst = tmp_path / "ds"
    args = [str(src), str(dst), "--shard-size", "8KB", "--workers", "1", "--quiet",
            "--overwrite"]
    proc = _stopped_convert(args)
    os.kill(proc.pid, signal.SIGINT)
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    expected = shlex.join(["dlpack", "convert", *args[:-1], "--resume"])  # --overwrite dropped
    assert err.strip().endswith(f"to finish this conversion run: {expected}"), err
    assert "Aborted!" not in err and "Traceback" not in err
    resumed = subprocess.run(CLI + shlex.split(expected)[1:], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at input" in resumed.stdout
    assert Dataset(dst).manifest["num_samples"] == 8


def test_resume_command_keeps_overwrite_when_the_old_data_set_was_not_touched(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")  # a finished data set, no journal
    argv = ["convert", "s", str(tmp_path), "--overwrite"]
    assert resume_command(argv, str(tmp_path)) == shlex.join(["dlpack"] + argv)
    assert resume_command(["convert", "s", "s3://b/p", "--resume"], "s3://b/p") == \
        "dlpack convert s s3://b/p --resume"


# ---- every mode's summary is true ------------------------------------------------------------
def test_raw_mode_summary_says_pixels_were_decoded_not_kept(src, tmp_path):
    done = _convert(src, tmp_path / "raw", "--mode", "raw", "--size", "32", "--quiet",
                    check_rc=0)
    assert "original bytes" not in done.stdout
    assert ("decoded to raw RGB pixels: 8 (raw mode: shorter side resized to 32 and "
            "center-cropped to 32x32 (--size))") in done.stdout
    shown = subprocess.run(CLI + ["inspect", str(tmp_path / "raw")], capture_output=True,
                           text=True).stdout
    assert "with their original bytes" not in shown
    assert "stored        decoded to raw RGB pixels: 8" in shown
    done = _convert(src, tmp_path / "side", "--mode", "raw", "--max-side", "40", "--quiet",
                    check_rc=0)
    assert "decoded to raw RGB pixels: 8 (raw mode: longer side bounded to 40" in done.stdout
    done = _convert(src, tmp_path / "jpeg", "--quiet", check_rc=0)
    assert "original bytes kept: 0; transformed losslessly: 8 (8 restart markers" in done.stdout


# ---- ImageFolder's extensions; hidden files counted --------------------------------------------
def test_ppm_and_pgm_are_packed_as_imagefolder_reads_them(src, tmp_path):
    Image.new("RGB", (10, 6), (200, 10, 30)).save(src / "class_00" / "x.ppm")
    Image.new("L", (7, 5), 99).save(src / "class_01" / "y.pgm")
    _convert(src, tmp_path / "ds", "--quiet", check_rc=0)
    ds = Dataset(tmp_path / "ds")
    got = {ds.source(i, relative=True): ds[i] for i in range(len(ds))}
    pixels, label = got["class_00/x.ppm"]
    assert label == 0 and pixels.shape == (6, 10, 3) and (pixels == (200, 10, 30)).all()
    pixels, label = got["class_01/y.pgm"]
    assert label == 1 and pixels.shape == (5, 7, 3) and (pixels == 99).all()


def test_hidden_files_and_folders_are_skipped_and_counted(src, tmp_path):
    (src / ".ipynb_checkpoints").mkdir()  # ImageFolder: a class, shifting every index
    Image.new("RGB", (8, 8)).save(src / ".ipynb_checkpoints" / "a.jpg")
    (src / "class_00" / ".cache").mkdir()
    Image.new("RGB", (8, 8)).save(src / "class_00" / ".cache" / "b.jpg")
    (src / "class_00" / "._img.jpg").write_bytes(b"\0\5\26\7")  # macOS AppleDouble
    (src / "class_01" / ".DS_Store").write_bytes(b"x")
    done = _convert(src, tmp_path / "ds", "--quiet", check_rc=0)
    assert ("hidden: 2 files and 2 folders whose name starts with '.' skipped "
            "(torchvision's ImageFolder would read them)") in done.stdout
    ds = Dataset(tmp_path / "ds")
    assert ds.classes == ["class_00", "class_01"] and len(ds) == 8
