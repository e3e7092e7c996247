"""The contact sheet draws any class name: each character in a font that has it, a code
point where no font has it, never an empty box."""
import json

import pytest
from click.testing import CliRunner
from PIL import Image, ImageFont

from dlpack_io.reader import Dataset
from dlpack_io.tools import captions
from dlpack_io.tools.cli import main

NAMES = ["café", "Жук", "猫", "\ue000x"]  # Latin, Cyrillic, CJK, a private-use character


def test_runs_give_each_character_a_font_that_has_it():
    fonts = captions.fonts(12)
    for font, piece in captions.runs("".join(NAMES), fonts):
        for ch in piece:
            assert captions.covers(font, ch) or piece.startswith("U+"), (ch, font)
    assert not any(captions.covers(f, "\ue000") for f in fonts)  # no font draws it


def test_a_character_no_font_has_becomes_its_code_point():
    default = ImageFont.load_default(12)
    assert captions.runs("a\ue000b", (default,)) == [(default, "aU+E000b")]


def test_missing_glyph_detection_on_a_real_font():
    path = next((p for p in captions.font_files() if p.endswith("DejaVuSans.ttf")), None)
    if path is None:
        pytest.skip("DejaVu Sans is not installed here (fonts-dejavu-core)")
    font = ImageFont.truetype(path, 12)
    assert all(captions.covers(font, ch) for ch in "café Жук Ω")
    assert not captions.covers(font, "猫") and not captions.covers(font, "\ue000")


def test_font_files_only_lists_preferred_names_in_order(tmp_path):
    for name in ("unifont.otf", "DejaVuSans.ttf", "Other.ttf"):
        (tmp_path / "a" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "a" / name).write_bytes(b"")
    assert captions.font_files([str(tmp_path)]) == [str(tmp_path / "a" / "DejaVuSans.ttf"),
                                                    str(tmp_path / "a" / "unifont.otf")]


def test_contact_sheet_draws_non_ascii_class_names(tmp_path):
    src = tmp_path / "src"
    for k, name in enumerate(NAMES):
        (src / name).mkdir(parents=True)
        Image.new("RGB", (20, 16), (40 * k, 90, 200)).save(src / name / "a.jpg")
    dst = tmp_path / "ds"
    assert CliRunner().invoke(main, ["convert", str(src), str(dst), "--quiet"]).exit_code == 0
    out = CliRunner().invoke(main, ["inspect", str(dst), "--grid", str(tmp_path / "sheet"),
                                    "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    text = {"".join(piece for _, piece in runs) for runs in data["captions"]}
    ds = Dataset(dst)
    shown = {f"{i}: {ds.classes[ds[i][1]]}" for i in range(len(ds))}  # "sample: class"
    expected = {t.replace("\ue000", "U+E000") for t in shown}
    fonts = captions.fonts(12)
    if not any(captions.covers(f, "猫") for f in fonts):
        expected = {t.replace("猫", "U+732B") for t in expected}
    assert text == expected
    assert Image.open(tmp_path / "sheet.png").size == (data["width"], data["height"])
