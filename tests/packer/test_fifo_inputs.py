"""Anything convert opens as input may be a FIFO, a device or a link to one: a sidecar, a
mask, a COCO image read for its header, the list or COCO file itself, an input hashed by
--append, the destination's own shards read by --append (under the DST lock). Each is
refused naming the file and what it is, never read (a FIFO would block forever, /dev/zero
never ends). Conversions run as real processes; the timeout only guards the suite."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from dlpack_io.packer import Writer, convert
from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt

GUARD = 60  # seconds: a hang fails the test instead of the suite


def _dlpack(*args):
    return subprocess.run([sys.executable, "-m", "dlpack_io.tools.cli", "convert", *map(str, args),
                           "--workers", "1", "--quiet", "--json"], capture_output=True, text=True,
                          timeout=GUARD)


def _jpeg(path, value=0, size=(16, 24)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((*size, 3), value, np.uint8)).save(path)


def _rejects(dst) -> dict:
    return {r["path"]: r["reason"] for r in
            json.loads((dst / fmt.MANIFEST_NAME).read_text())["rejects"]}


def test_sidecars_and_masks_that_are_fifos_or_devices_are_rejects(tmp_path):
    src = tmp_path / "src"
    for k, name in enumerate(["ok", "fifo", "dev", "maskfifo"]):
        _jpeg(src / "a" / f"{name}.jpg", 10 * k)
        (src / "a" / f"{name}.mask.png").parent.mkdir(exist_ok=True)
        if name != "maskfifo":
            Image.fromarray(np.zeros((16, 24), np.uint8)).save(src / "a" / f"{name}.mask.png")
    for name in ("ok", "maskfifo"):
        (src / "a" / f"{name}.txt").write_text(f"caption {name}")
    os.mkfifo(src / "a" / "fifo.txt")
    os.symlink("/dev/zero", src / "a" / "dev.txt")
    os.mkfifo(src / "a" / "maskfifo.mask.png")
    done = _dlpack(src, tmp_path / "ds", "--max-rejects", "3")
    assert done.returncode == 0, done.stderr
    why = _rejects(tmp_path / "ds")
    assert "FIFO" in why["a/fifo.jpg"] and "fifo.txt" in why["a/fifo.jpg"]
    assert "character device" in why["a/dev.jpg"] and "dev.txt" in why["a/dev.jpg"]
    assert "FIFO" in why["a/maskfifo.jpg"] and "maskfifo.mask.png" in why["a/maskfifo.jpg"]
    assert Dataset(tmp_path / "ds").sample(0)["txt"] == "caption ok"


def test_a_coco_image_that_is_a_fifo_is_a_reject_not_a_hang(tmp_path):
    src = tmp_path / "src"
    _jpeg(src / "good.jpg")
    os.mkfifo(src / "pipe.jpg")
    coco = tmp_path / "instances.json"
    coco.write_text(json.dumps({  # no width/height: each image's header is read
        "images": [{"id": 1, "file_name": "good.jpg"}, {"id": 2, "file_name": "pipe.jpg"}],
        "annotations": [{"id": 9, "image_id": k, "category_id": 1, "bbox": [1, 1, 4, 4]}
                        for k in (1, 2)],
        "categories": [{"id": 1, "name": "person"}]}))
    done = _dlpack(src, tmp_path / "ds", "--coco", coco, "--max-rejects", "1")
    assert done.returncode == 0, done.stderr
    assert "FIFO" in _rejects(tmp_path / "ds")["pipe.jpg"]


@pytest.mark.parametrize("option", ["--list", "--coco"])
def test_a_list_or_coco_file_that_is_a_fifo_is_refused(tmp_path, option):
    _jpeg(tmp_path / "src" / "a" / "x.jpg")
    os.mkfifo(tmp_path / "list.jsonl")
    done = _dlpack(tmp_path / "src", tmp_path / "ds", option, tmp_path / "list.jsonl")
    assert done.returncode == 1
    assert f"{option} {tmp_path / 'list.jsonl'}: a FIFO (named pipe), not a regular file" \
        in done.stderr


def test_append_never_blocks_on_a_fifo_in_src_or_in_dst(tmp_path):
    src, dst, listed = tmp_path / "src", tmp_path / "ds", tmp_path / "list.csv"
    for k in range(3):
        _jpeg(src / "a" / f"{k}.jpg", 30 * k)
    listed.write_text("".join(f"a/{k}.jpg,a\n" for k in range(3)))
    convert(src, dst, list_file=str(listed), workers=1, progress=False)
    os.unlink(src / "a" / "0.jpg")
    os.mkfifo(src / "a" / "0.jpg")                     # a packed path, now a FIFO: hashed
    _jpeg(src / "a" / "new.jpg", 200)
    listed.write_text(listed.read_text() + "a/new.jpg,a\n")
    done = _dlpack(src, dst, "--list", listed, "--append", "--max-rejects", "1")
    assert done.returncode == 0, done.stderr
    assert "not a regular file" in _rejects(dst)["a/0.jpg"]
    shard = json.loads((dst / fmt.MANIFEST_NAME).read_text())["shards"][0]["name"]
    os.unlink(dst / shard)
    os.mkfifo(dst / shard)                             # the data set's own shard
    _jpeg(src / "a" / "newer.jpg", 220)
    listed.write_text(listed.read_text() + "a/newer.jpg,a\n")
    done = _dlpack(src, dst, "--list", listed, "--append")
    assert done.returncode == 1 and "run 'dlpack verify'" in done.stderr, done.stderr


def test_writer_refuses_a_fifo_path(tmp_path, hang_deadline):
    os.mkfifo(tmp_path / "pipe.jpg")
    with Writer(tmp_path / "ds") as w:
        with pytest.raises(OSError, match="FIFO"):
            w.write(image=str(tmp_path / "pipe.jpg"), label=0)
        w.write(image=np.zeros((4, 4, 3), np.uint8), label=0)
