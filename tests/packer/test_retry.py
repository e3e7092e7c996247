"""A failed conversion is retried with one obvious command: no PIL is reported before any
work, a run that completed no shard leaves nothing behind, and the error names the retry."""
import os
import subprocess
import sys

import pytest

from dlpack_io.packer import convert
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader import Dataset
from dlpack_io.tools.synth import make_image_folder

FAST = dict(workers=1, progress=False)


@pytest.fixture
def folder(tmp_path):
    make_image_folder(tmp_path / "src", 6, 2, seed=3, size=(32, 40))
    return tmp_path / "src"


def test_missing_pil_is_one_line_before_the_scan(tmp_path):
    """With PIL unimportable, `dlpack convert` names the fix before looking at SRC (here a
    folder without any image, which would otherwise be the error)."""
    (tmp_path / "empty").mkdir()
    code = ("import sys; sys.modules['PIL'] = None; "
            "from dlpack_io.tools.cli import main; sys.argv = ['dlpack', 'convert', "
            f"{str(tmp_path / 'empty')!r}, {str(tmp_path / 'out')!r}]; main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "dlpack: error: no PIL provider is installed (dlpack needs one to read images): "
        "pip install 'dlpack-io[pillow]', or pillow-simd for faster resizing"]
    assert not (tmp_path / "out").exists()


def test_failed_run_leaves_nothing_and_the_same_command_works(folder, tmp_path):
    bad = folder / "class_00" / "img_000000.jpg"
    good = bad.read_bytes()
    bad.write_bytes(b"not a jpeg")
    dst = tmp_path / "ds"
    with pytest.raises(ConversionError, match=r"img_000000\.jpg.*nothing was left in .*ds: "
                                              r"after fixing this, run the same command again"):
        convert(folder, dst, on_error="fail", shuffle=False, **FAST)
    assert not dst.exists()
    bad.write_bytes(good)
    assert convert(folder, dst, on_error="fail", shuffle=False, **FAST)["num_samples"] == 6


def test_failed_run_into_an_existing_folder_keeps_the_folder_and_its_files(folder, tmp_path):
    dst = tmp_path / "ds"
    dst.mkdir()
    for path in folder.rglob("*.jpg"):
        path.write_bytes(b"")
    with pytest.raises(ConversionError, match="none of the 6 inputs could be packed.*run the "
                                              "same command again"):
        convert(folder, dst, **FAST)
    assert dst.is_dir() and os.listdir(dst) == []


def test_a_run_that_kept_shards_says_resume(folder, tmp_path):
    """Fail on the last input after shards were written: they stay, the advice is --resume."""
    paths = sorted(folder.rglob("*.jpg"))
    paths[-1].write_bytes(b"\xff\xd8 broken")
    dst = tmp_path / "ds"
    with pytest.raises(ConversionError, match="completed shards are kept .* with --resume"):
        convert(folder, dst, on_error="fail", shuffle=False, shard_size=1, **FAST)
    assert any(n.endswith(".rec") for n in os.listdir(dst))


def test_list_whose_files_are_all_missing_fails_before_writing(folder, tmp_path):
    listing = tmp_path / "list.csv"
    listing.write_text("a/1.jpg,0\nb/2.jpg,1\n")
    with pytest.raises(ConversionError, match=r"none of the 2 input files exist, e\.g\. "
                                              r".*src/a/1\.jpg \(paths in .*list\.csv are "
                                              r"relative to SRC\)"):
        convert(folder, tmp_path / "ds", list_file=listing, **FAST)
    assert not (tmp_path / "ds").exists()


def test_list_with_one_missing_file_packs_the_rest(folder, tmp_path):
    rows = [f"{p.relative_to(folder).as_posix()},{p.parent.name}" for p in sorted(folder.rglob("*.jpg"))]
    listing = tmp_path / "list.csv"
    listing.write_text("\n".join(rows + ["class_00/gone.jpg,class_00"]) + "\n")
    result = convert(folder, tmp_path / "ds", list_file=listing, **FAST)
    assert (result["num_samples"], result["rejects"]) == (6, 1)
    assert len(Dataset(tmp_path / "ds")) == 6
