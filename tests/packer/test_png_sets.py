"""A folder of PNGs keeps its size: by default (--non-jpeg keep) a PNG (or WebP) smaller than
its pixels is stored as its own file (a record of kind 2) and decoded with PIL on read to
exactly the pixels a raw record of it holds; the Loader delivers the same batches as from
raw records; `inspect` says what the records are (png, their colour) and where a set's
labels came from (never "--no-labels" for a COCO set)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from dlpack_io.packer import convert
from dlpack_io.reader import Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop, Workers
from dlpack_io.reader import format as fmt
from dlpack_io.tools.cli import main
from dlpack_io.tools.inspection import record_detail, summary
from dlpack_io.tools.synth import photo_like

OPTS = dict(workers=1, progress=False, shuffle=False)


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    """Photo-like PNGs of several modes (RGB, RGBA, grey, palette, 16-bit grey, one with
    an EXIF rotation) and one of noise, which no compression makes smaller than its pixels."""
    src = tmp_path_factory.mktemp("pngs") / "src"
    rng = np.random.default_rng(0)
    for k in range(12):
        (src / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        img = Image.fromarray(photo_like(rng, 160, 200, noise=4.0))
        mode = ("RGB", "RGBA", "L", "P", "I;16", "RGB")[k % 6]
        img = img.convert("P", palette=Image.ADAPTIVE) if mode == "P" else \
            Image.fromarray(np.asarray(img.convert("L"), np.uint16) * 257) \
            if mode == "I;16" else img.convert(mode)
        exif = Image.Exif()
        exif[0x0112] = 6 if k == 5 else 1
        img.save(src / f"c{k % 2}" / f"{k}.png", exif=exif.tobytes())
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), np.uint8)).save(src / "c0" / "noise.png")
    return src


def test_a_png_set_keeps_its_size(pngs, tmp_path):
    source = sum(p.stat().st_size for p in pngs.rglob("*.png"))
    result = convert(pngs, tmp_path / "ds", **OPTS)
    assert result["num_bytes"] <= 1.15 * source, (result["num_bytes"], source)
    ds = Dataset(tmp_path / "ds")
    kinds = [int(ds.record(i)[1]["kind"]) for i in range(len(ds))]
    assert kinds.count(fmt.KIND_FILE) == 12 and kinds.count(fmt.KIND_RAW) == 1  # the noise


def test_the_pixels_are_those_of_raw_records(pngs, tmp_path):
    convert(pngs, tmp_path / "keep", **OPTS)
    convert(pngs, tmp_path / "raw", non_jpeg="raw", **OPTS)
    keep, raw = Dataset(tmp_path / "keep"), Dataset(tmp_path / "raw")
    assert {int(raw.record(i)[1]["kind"]) for i in range(len(raw))} == {fmt.KIND_RAW}
    for i in range(len(keep)):
        np.testing.assert_array_equal(keep[i][0], raw[i][0])
    for kind in ("thread", "process"):
        opts = dict(batch_size=5, seed=3, workers=Workers(kind=kind), num_workers=2,
                    transforms=[RandomResizedCrop(64), RandomHorizontalFlip()])
        a = [x.clone() for x, _ in Loader(keep, **opts)]
        b = [x.clone() for x, _ in Loader(raw, **opts)]
        assert len(a) == len(b) == 3 and all(torch.equal(x, y) for x, y in zip(a, b))


def test_inspect_says_what_the_records_are(pngs, tmp_path):
    convert(pngs, tmp_path / "ds", **OPTS)
    out = CliRunner().invoke(main, ["inspect", str(tmp_path / "ds")]).output
    assert "mode jpeg (records: 1 raw, 12 PNG/WebP files)" in out
    assert "12 PNG/WebP decoded with PIL" in out
    first = record_detail(tmp_path / "ds", 0)
    assert (first["kind"], first["colour"]) == ("png", "converted to rgb when decoded")
    noise = next(record_detail(tmp_path / "ds", i) for i in range(13)
                 if record_detail(tmp_path / "ds", i)["source"] == "c0/noise.png")
    assert (noise["kind"], noise["colour"]) == ("raw", "rgb")
    assert summary(tmp_path / "ds")["storage"]["file_records"] == 12


def test_inspect_of_a_coco_set_does_not_claim_no_labels(tmp_path):
    (tmp_path / "src").mkdir()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "src" / "a.jpg")
    (tmp_path / "coco.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg", "width": 16, "height": 16}],
        "annotations": [{"id": 2, "image_id": 1, "category_id": 1, "bbox": [1, 1, 4, 4]}],
        "categories": [{"id": 1, "name": "p"}]}))
    convert(tmp_path / "src", tmp_path / "ds", coco=str(tmp_path / "coco.json"), **OPTS)
    out = CliRunner().invoke(main, ["inspect", str(tmp_path / "ds")]).output
    assert "--no-labels" not in out and "a COCO set" in out


def test_old_data_sets_keep_loading():
    from pathlib import Path

    for name in ("v2_record", "v2_lmdb"):
        ds = Dataset(Path(__file__).resolve().parents[1] / "data" / name)
        assert len(ds) > 0 and ds[0][0].ndim == 3
