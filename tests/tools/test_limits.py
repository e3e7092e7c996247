"""The reader's pixel limit (issue 16 item 2): a documented default, the same as convert's
--max-pixels, overridable on Dataset and the CLI, applied before anything is sized."""
import io
import pickle
import struct

import numpy as np
import pytest
from click.testing import CliRunner

from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.reader import jpegdecode
from dlpack_io.reader.decode import decode_record
from dlpack_io.tools.cli import main
from dlpack_io.tools.verification import verify


@pytest.fixture(scope="module")
def packed(image_folder, tmp_path_factory):
    from dlpack_io.packer import convert

    dst = tmp_path_factory.mktemp("limits") / "ds"
    convert(image_folder, dst, workers=0, progress=False)
    return dst


def test_default_is_documented_and_shared():
    assert fmt.DEFAULT_MAX_PIXELS == 89_478_485 and fmt.MAX_SIDE == 65535


def test_a_lower_limit_refuses_the_shard_and_travels_with_the_dataset(packed):
    largest = max(int(h) * int(w) for s in Dataset(packed).shards
                  for h, w in zip(s.index["height"], s.index["width"]))
    ds = Dataset(packed, max_pixels=largest - 1)
    with pytest.raises(fmt.FormatError, match=f"more than the limit of {largest - 1}"):
        for i in range(len(ds)):
            ds[i]
    again = pickle.loads(pickle.dumps(ds))  # what a process worker receives
    assert again.max_pixels == largest - 1
    with pytest.raises(fmt.FormatError, match="max_pixels=N"):
        again.shards[0].index
    assert Dataset(packed, max_pixels=largest)[0][0].shape[2] == 3


def test_verify_and_inspect_take_the_limit(packed):
    report = verify(packed, progress=False, max_pixels=100)
    assert not report.ok and "more than the limit of 100" in report.problems[0]["problem"]
    assert verify(packed, progress=False).ok
    out = CliRunner().invoke(main, ["verify", str(packed), "--quiet", "--max-pixels", "100"])
    assert out.exit_code == 1 and "more than the limit of 100" in out.output
    out = CliRunner().invoke(main, ["inspect", str(packed), "--max-pixels", "100"])
    assert out.exit_code == 1 and "more than the limit of 100" in out.output


def test_pil_path_refuses_a_header_larger_than_the_index(monkeypatch):
    """Without the C extension, PIL reads the header first: a JPEG claiming more pixels
    than its index entry is refused before PIL decodes (and allocates) anything."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    at = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, at + 5, 9000, 9000)
    entry = np.zeros(1, fmt.INDEX_DTYPE)[0]
    entry["height"], entry["width"], entry["channels"], entry["kind"] = 8, 8, 3, fmt.KIND_JPEG
    entry["orientation"] = 1
    monkeypatch.setattr(jpegdecode, "_jpeg", None)
    with pytest.raises(fmt.FormatError, match="claims 9000 x 9000 pixels, more than the 64"):
        decode_record(bytes(data), entry, "x.rec record 0")
