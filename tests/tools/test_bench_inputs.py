"""`dlpack bench` takes every input `dlpack convert` accepts (PNG, EXIF-rotated, grey, CMYK
JPEGs) and ends with a message, never a traceback, for bad input."""
from __future__ import annotations

import os

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image, ImageOps

from dlpack_io.tools.bench.prepare import PREPARED, bench_source, classify
from dlpack_io.tools.cli import main


def _odd_folder(root):
    """One of each input kind convert accepts, plus a plain JPEG and a broken file."""
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(root / "a" / "p.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    Image.fromarray(np.tile(np.arange(60, dtype=np.uint8) * 4, (32, 1))[..., None].repeat(3, 2)) \
        .save(root / "a" / "rot.jpg", exif=exif, quality=98)
    Image.new("L", (30, 20), 77).save(root / "b" / "grey.jpg")
    Image.new("CMYK", (30, 20), (10, 20, 30, 40)).save(root / "b" / "cmyk.jpg")
    Image.new("RGB", (36, 28), (9, 99, 199)).save(root / "b" / "plain.jpg")
    (root / "b" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    return root


def test_classify_names_what_each_input_needs(tmp_path):
    src = _odd_folder(tmp_path / "src")
    assert classify(str(src / "a" / "p.png")) == "reencode: PNG image"
    assert classify(str(src / "a" / "rot.jpg")) == "reencode: EXIF-rotated JPEG"
    assert classify(str(src / "b" / "grey.jpg")) == "reencode: L JPEG"
    assert classify(str(src / "b" / "cmyk.jpg")) == "reencode: CMYK JPEG"
    assert classify(str(src / "b" / "plain.jpg")) == "plain"
    assert classify(str(src / "b" / "broken.jpg")).startswith("bad: ")


def test_odd_inputs_become_upright_rgb_jpegs_and_bad_ones_are_left_out(tmp_path):
    src = _odd_folder(tmp_path / "src")
    folder, changed = bench_source(str(src), str(tmp_path / "out"), workers=1)
    assert folder == str(tmp_path / "out" / PREPARED)
    assert sorted(k for k in changed if not k.startswith("bad")) == [
        "reencode: CMYK JPEG", "reencode: EXIF-rotated JPEG", "reencode: L JPEG",
        "reencode: PNG image"]
    assert sum(n for k, n in changed.items() if k.startswith("bad")) == 1
    made = sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, files in os.walk(folder) for f in files)
    assert made == ["a/p.png.jpg", "a/rot.jpg.jpg", "b/cmyk.jpg.jpg", "b/grey.jpg.jpg",
                    "b/plain.jpg"]
    assert os.path.samefile(os.path.join(folder, "b", "plain.jpg"), src / "b" / "plain.jpg")
    for rel in made:
        with Image.open(os.path.join(folder, rel)) as img:
            assert (img.format, img.mode) == ("JPEG", "RGB")
            assert img.getexif().get(0x0112, 1) == 1
    with Image.open(src / "a" / "rot.jpg") as original:
        upright = np.asarray(ImageOps.exif_transpose(original).convert("RGB"), dtype=np.int16)
    with Image.open(os.path.join(folder, "a", "rot.jpg.jpg")) as img:
        got = np.asarray(img, dtype=np.int16)
    assert got.shape == (60, 32, 3) == upright.shape  # turned upright: 32x60 -> 60 tall
    assert np.abs(got - upright).mean() < 3  # one more JPEG generation at quality 95


def test_a_folder_of_plain_jpegs_is_used_as_it_is(tmp_path):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    Image.new("RGB", (20, 20)).save(src / "x.jpg")
    assert bench_source(str(tmp_path / "src"), str(tmp_path / "out"), workers=1) == \
        (str(tmp_path / "src"), {})


def test_nothing_readable_is_a_message_not_a_traceback(tmp_path):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "x.jpg").write_bytes(b"nope")
    (src / "y.png").write_bytes(b"")
    result = CliRunner().invoke(main, ["bench", str(tmp_path / "src"), "--quick", "--out",
                                       str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    assert "none of its 2 image files can be read" in result.output
    assert "Traceback" not in result.output and result.exception.__class__ is SystemExit


@pytest.mark.parametrize("only", ["serial,ours-thread"])
def test_bench_runs_through_on_every_kind_of_input(tmp_path, only):
    """The run that crashed (a PNG: UnidentifiedImageError; an EXIF-rotated JPEG: a crop box
    outside the image) now measures both contenders and the limits."""
    from dlpack_io.tools.bench.runner import run_bench

    src = _odd_folder(tmp_path / "src")
    result = run_bench(str(src), str(tmp_path / "out"), workers=(1,), batch_sizes=(2,),
                       only=only, epochs=1, modes=("jpeg",))
    rows = [r for g in result["groups"] for r in g["rows"]]
    assert rows and all(r.get("images") == 5 and not r.get("error") for r in rows), rows
    assert result["limits"]["decode_limit_ours-record-jpeg"] > 0
    assert "re-encoded inputs as upright RGB JPEGs" in (tmp_path / "out" / "bench.md").read_text()
