"""Names and lists from the wild (issue 26, kind 4): file and folder names that are not
UTF-8, list rows with NUL bytes, labels in other scripts' digits or far beyond any class
count. Each is a reject naming the file or list line and the reason, or (a name the data
set must hold) recorded escaped; one bad name never stops a conversion, nothing is lost."""
from __future__ import annotations

import json
import os

import pytest

from dlpack_io.packer import convert
from dlpack_io.packer.scan import shown
from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.tools.synth import make_image_folder
from dlpack_io.tools.verification import verify

FAST = dict(workers=1, progress=False, shuffle=False)


def _manifest(dst):
    return json.loads((dst / fmt.MANIFEST_NAME).read_text())


def test_shown_escapes_only_what_json_and_tsv_cannot_hold():
    assert shown("class_00/img.jpg") == "class_00/img.jpg"
    assert shown("caf\u00e9/\u732b.jpg") == "caf\u00e9/\u732b.jpg"   # valid UTF-8 stays
    assert shown(os.fsdecode(b"a\xff\xfe.jpg")) == "a\\xff\\xfe.jpg"
    assert shown("a\x00b\tc\nd") == "a\\x00b\\x09c\\x0ad"


def test_names_that_are_not_utf8_are_packed_and_recorded_escaped(tmp_path):
    src = tmp_path / "src"
    make_image_folder(src, 6, 2, seed=1, size=(32, 32))
    first = sorted(os.listdir(src / "class_00"))[0]
    os.rename(os.fsencode(src / "class_00" / first), os.fsencode(src / "class_00") + b"/r\xff.jpg")
    os.rename(os.fsencode(src / "class_01"), os.fsencode(src) + b"/cl\xe9ss")
    summary = convert(src, tmp_path / "ds", **FAST)
    assert (summary["num_samples"], summary["rejects"]) == (6, 0)   # nothing lost
    manifest = _manifest(tmp_path / "ds")
    assert manifest["classes"] == ["class_00", "cl\\xe9ss"] and manifest["class_counts"] == [3, 3]
    paths = [p for s in Dataset(tmp_path / "ds").shards for p in s.meta()["paths"]]
    assert "class_00/r\\xff.jpg" in paths and sum(p.startswith("cl\\xe9ss/") for p in paths) == 3
    assert verify(str(tmp_path / "ds"), progress=False).ok
    # the journal digests the real bytes: a resume of the finished set has nothing to do
    assert convert(src, tmp_path / "ds", resume=True, **FAST) == \
        {"dst": str(tmp_path / "ds"), "already_complete": True}


@pytest.fixture
def listed(tmp_path):
    """(src, list file, good path): a list whose rows are each wrong in another way."""
    src = tmp_path / "src"
    make_image_folder(src, 4, 2, seed=2, size=(32, 32))
    good = sorted(os.listdir(src / "class_00"))
    os.rename(os.fsencode(src / "class_00" / good[1]), os.fsencode(src / "class_00") + b"/x\xfe.jpg")
    rows = [b"path,label",
            f"class_00/{good[0]},0".encode(),                     # line 2: fine
            f"class_00/{good[0]}\0evil,1".encode(),               # line 3: NUL in the path
            f"class_00/{good[0]},\u00b2".encode(),                # line 4: superscript two
            f"class_00/{good[0]},\u0661".encode(),                # line 5: Arabic-Indic one
            f"class_00/{good[0]},{10**12}".encode(),              # line 6: a label far out
            f"class_00/{good[0]},{'9' * 5000}".encode(),          # line 7: int() refuses it
            b"class_00/x\xfe.jpg,1"]                              # line 8: not UTF-8: packed
    (tmp_path / "list.csv").write_bytes(b"\n".join(rows) + b"\n")
    return src, tmp_path / "list.csv", good[0]


def test_bad_list_rows_are_rejects_naming_the_line(listed, tmp_path):
    src, list_file, good = listed
    summary = convert(src, tmp_path / "ds", list_file=list_file, **FAST)
    manifest = _manifest(tmp_path / "ds")
    assert (summary["num_samples"], summary["rejects"]) == (2, 5)
    assert manifest["source"]["num_inputs"] == 7 and manifest["classes"] == ["0", "1"]
    reasons = sorted(r["reason"] for r in manifest["rejects"])
    assert reasons == [
        f"{list_file}:3: the path holds a NUL byte (shown as \\x00)",
        f"{list_file}:4: label '\u00b2' is not written in digits 0-9",
        f"{list_file}:5: label '\u0661' is not written in digits 0-9",
        f"{list_file}:6: label {10**12} is above 1048576, the largest class number a list "
        f"may use",
        f"{list_file}:7: label {'9' * 20} is above 1048576, the largest class number a list "
        f"may use"]
    assert f"class_00/{good}\\x00evil" in [r["path"] for r in manifest["rejects"]]
    paths = [p for s in Dataset(tmp_path / "ds").shards for p in s.meta()["paths"]]
    assert sorted(paths) == sorted([f"class_00/{good}", "class_00/x\\xfe.jpg"])
    tsv = (tmp_path / "ds" / fmt.REJECTS_NAME).read_bytes()
    assert b"\0" not in tsv and len(tsv.splitlines()) == 6
    assert verify(str(tmp_path / "ds"), progress=False).ok


def test_a_list_of_class_names_keeps_odd_digits_as_names(tmp_path):
    src = tmp_path / "src"
    make_image_folder(src, 2, 1, seed=3, size=(32, 32))
    files = sorted(os.listdir(src / "class_00"))
    (tmp_path / "l.csv").write_text(f"class_00/{files[0]},cat\nclass_00/{files[1]},\u00b2\n")
    convert(src, tmp_path / "ds", list_file=tmp_path / "l.csv", **FAST)
    assert _manifest(tmp_path / "ds")["classes"] == ["cat", "\u00b2"]
