"""Convert never writes what its own reader refuses: a JSON sidecar nested deeper than a
reader parses (40 levels, or 200,000: no RecursionError), a .npy whose header claims 2^40
elements (checked against the file's bytes before numpy allocates), text with a lone
surrogate (not UTF-8), a path or a class name longer than any can be. Each is a reject
naming the file (or the list line), the run goes on, and `dlpack verify` passes the result."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from dlpack_io.packer import Writer, convert
from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.fields import decode_value
from dlpack_io.tools.verification import verify

OPTS = dict(workers=1, progress=False)


def _jpeg(path, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)


def _rejects(dst) -> dict:
    return {r["path"]: r["reason"] for r in Dataset(dst).manifest["rejects"]}


def _npy_claiming(path, count: int) -> None:
    """A .npy file of 4 float32 values whose header claims ``count`` of them."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (count,)})
        f.write(np.zeros(4, np.float32).tobytes())


@pytest.mark.parametrize("depth", [40, 200_000])
def test_a_json_sidecar_nested_too_deep_is_a_reject(tmp_path, depth):
    src = tmp_path / "src"
    for k in range(3):
        _jpeg(src / "a" / f"{k}.jpg", k)
        (src / "a" / f"{k}.json").write_text('{"k": %d}' % k)
    (src / "a" / "1.json").write_text("[" * depth + "]" * depth)
    convert(src, tmp_path / "ds", **OPTS)
    why = _rejects(tmp_path / "ds")["a/1.jpg"]
    assert "1.json" in why and f"nested {depth} levels" in why and "at most 32" in why
    assert verify(str(tmp_path / "ds")).ok and len(Dataset(tmp_path / "ds")) == 2


def test_a_npy_header_claiming_more_than_its_bytes_is_a_reject(tmp_path):
    src = tmp_path / "src"
    for k in range(3):
        _jpeg(src / "a" / f"{k}.jpg", k)
        np.save(src / "a" / f"{k}.npy", np.full(4, k, np.float32))
    _npy_claiming(src / "a" / "2.npy", 2**40)
    _npy_claiming(src / "a" / "0.npy", 2**40)   # the first one, which fixes the dtype
    convert(src, tmp_path / "ds", **OPTS)
    why = _rejects(tmp_path / "ds")
    assert set(why) == {"a/0.jpg", "a/2.jpg"}
    assert f"claims shape ({2**40},) of float32 ({2**42} bytes), the file holds 16" in why["a/2.jpg"]
    assert Dataset(tmp_path / "ds").sample(0)["npy"].tolist() == [1, 1, 1, 1]


def test_text_with_a_lone_surrogate_is_a_reject(tmp_path):
    src = tmp_path / "src"
    for k in range(3):
        _jpeg(src / "a" / f"{k}.jpg", k)
    jsonl = tmp_path / "list.jsonl"
    jsonl.write_text("".join(json.dumps({"path": f"a/{k}.jpg", "caption": c}) + "\n"
                             for k, c in enumerate(["fine", "bad \ud800 text", "ok"])))
    convert(src, tmp_path / "j", list_file=str(jsonl), **OPTS)
    assert "lone surrogate (U+D800 at character 4)" in _rejects(tmp_path / "j")["a/1.jpg"]
    csv = tmp_path / "list.csv"
    csv.write_bytes(b"path,label,caption\na/0.jpg,x,fine\na/1.jpg,x,caf\xe9\na/2.jpg,x,ok\n")
    convert(src, tmp_path / "c", list_file=str(csv), **OPTS)
    assert "lone surrogate" in _rejects(tmp_path / "c")["a/1.jpg"]
    for dst in ("j", "c"):
        assert verify(str(tmp_path / dst)).ok
        assert sorted(Dataset(tmp_path / dst).sample(i)["caption"] for i in range(2)) == \
            ["fine", "ok"]
    with Writer(tmp_path / "w") as w:
        with pytest.raises(ValueError, match="lone surrogate"):
            w.write(image=np.zeros((4, 4, 3), np.uint8), label=0, caption="\udcff")
        w.write(image=np.zeros((4, 4, 3), np.uint8), label=0, caption="fine")


def test_a_reader_refuses_str_bytes_that_are_not_utf8():
    with pytest.raises(fmt.FormatError, match="not valid UTF-8"):
        decode_value("x\ud800".encode("utf-8", "surrogatepass"), {"type": "str"}, "here")


def test_giant_paths_and_labels_are_rejects_and_the_manifest_stays_small(tmp_path):
    src = tmp_path / "src"
    _jpeg(src / "a" / "ok.jpg")
    jsonl = tmp_path / "list.jsonl"
    giant = "d/" * 150_000 + "x.jpg"
    jsonl.write_text("\n".join([json.dumps({"path": "a/ok.jpg", "label": "cat"}),
                                json.dumps({"path": giant, "label": "cat"}),
                                json.dumps({"path": "a/ok.jpg", "label": "L" * 5000})]) + "\n")
    convert(src, tmp_path / "j", list_file=str(jsonl), **OPTS)
    csv = tmp_path / "list.csv"
    csv.write_text(f"a/ok.jpg,cat\n{giant},cat\na/ok.jpg,{'L' * 5000}\n")
    convert(src, tmp_path / "c", list_file=str(csv), **OPTS)
    for dst in ("j", "c"):
        manifest = Dataset(tmp_path / dst).manifest
        assert manifest["classes"] == ["cat"] and len(manifest["rejects"]) == 2
        assert (tmp_path / dst / fmt.MANIFEST_NAME).stat().st_size < 20_000
        reasons = " ".join(r["reason"] for r in manifest["rejects"])
        assert "a path of 300005 characters, more than the 4096" in reasons
        assert "a label of 5000 characters, more than the 1024" in reasons
        assert verify(str(tmp_path / dst)).ok
