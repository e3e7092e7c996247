"""`dlpack doctor`'s advice: measured with every field the data set has (boxes and masks
cost time too), never more workers than cores, and never a setting already in use named as
a change (another setting is advised only when clearly faster; else "keep")."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dlpack_io.packer import convert
from dlpack_io.reader import Dataset, RandomResizedCrop
from dlpack_io.tools.cli import main
from dlpack_io.tools.doctor import CLEAR_WIN, Trial, advise, advice_lines, diagnose


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor-det")
    (root / "src").mkdir()
    images, anns = [], []
    for k in range(12):
        Image.fromarray(np.full((48, 64, 3), 10 * k, np.uint8)).save(root / "src" / f"{k}.jpg")
        Image.fromarray(np.full((48, 64), k % 3, np.uint8)).save(root / "src" / f"{k}.mask.png")
        images.append({"id": k, "file_name": f"{k}.jpg", "width": 64, "height": 48})
        anns.append({"id": 100 + k, "image_id": k, "category_id": 1, "bbox": [2, 3, 20, 10]})
    (root / "coco.json").write_text(json.dumps({"images": images, "annotations": anns,
                                                "categories": [{"id": 1, "name": "p"}]}))
    convert(root / "src", root / "ds", coco=str(root / "coco.json"), workers=0,
            progress=False)
    return str(root / "ds")


def test_doctor_reads_every_field_unless_told_fewer(detection):
    ds = Dataset(detection)
    assert {"boxes", "mask"} <= set(ds.fields)
    report = diagnose(ds, [RandomResizedCrop(32)], batch_size=4, seconds=0.1,
                      settings=[(1, "thread")])
    assert report["fields"] == ["image", "label", *ds.fields]
    assert report["trials"][0]["images_per_s"] > 0
    done = CliRunner().invoke(main, ["doctor", detection, "--json", "--seconds", "0.1",
                                     "--batch-size", "4", "--crop", "32", "--workers", "1",
                                     "--fields", "image,label"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["fields"] == ["image", "label"]


def _trial(n, kind, rate):
    return Trial(n, kind, rate, 1.0, 0.5, 10)


def test_advice_never_exceeds_the_cores():
    trials = [_trial(1, "thread", 100), _trial(2, "thread", 150), _trial(4, "thread", 400)]
    best, advice = advise(trials, cores=2, in_use=(1, "thread"))
    assert (best.num_workers, advice.num_workers) == (2, 2)
    assert advise([_trial(8, "thread", 100)], cores=2, in_use=(2, "thread"))[1] is None


def test_advice_never_names_the_setting_in_use_as_a_change():
    slightly = [_trial(2, "thread", 100), _trial(1, "thread", 100 * CLEAR_WIN - 1)]
    _, advice = advise(slightly, cores=2, in_use=(2, "thread"))
    assert (advice.num_workers, advice.worker_kind) == (2, "thread")
    report = {"advice": dict(vars(advice), change=False), "in_use": [2, "thread"],
              "cores": 2, "fastest_step_ms": 40.0, "batch_size": 4}
    text = "\n".join(advice_lines(report))
    assert text.startswith("keep Loader(..., num_workers=2, workers=Workers(kind='thread'))")
    assert "recommended" not in text
    clearly = [_trial(2, "thread", 100), _trial(1, "thread", 100 * CLEAR_WIN + 1)]
    assert advise(clearly, cores=2, in_use=(2, "thread"))[1].num_workers == 1


def test_the_cli_keeps_a_setting_in_use_that_is_the_fastest(detection):
    cores = len(os.sched_getaffinity(0))
    done = CliRunner().invoke(main, ["doctor", detection, "--json", "--seconds", "0.1",
                                     "--batch-size", "4", "--crop", "32", "--workers",
                                     f"1,{cores + 3}", "--in-use", "1"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["advice"]["num_workers"] <= cores
    assert report["in_use"] == [1, "thread"]
    if (report["advice"]["num_workers"], report["advice"]["worker_kind"]) == (1, "thread"):
        assert report["advice"]["change"] is False
