"""An append tries again the inputs the data set lists as rejects: a reject fixed in SRC
(its sidecar added) is packed and stops being listed in rejects.tsv, the manifest and
``inspect``, and a later append exits 0 when nothing is left rejected."""
from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner
from PIL import Image

from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.tools.cli import main
from dlpack_io.tools.verification import verify


def _src(root, count: int, captioned: int):
    (root / "a").mkdir(parents=True)
    for k in range(count):
        Image.fromarray(np.full((8, 8, 3), 20 * k, np.uint8)).save(root / "a" / f"{k}.jpg")
        if k < captioned:
            (root / "a" / f"{k}.txt").write_text(f"caption {k}")
    return root


def _run(*args):
    return CliRunner().invoke(main, ["convert", *map(str, args), "--workers", "1", "--quiet"],
                              catch_exceptions=False)


def test_fixed_rejects_are_packed_and_forgotten(tmp_path):
    src, dst = _src(tmp_path / "src", 8, 6), tmp_path / "ds"
    assert _run(src, dst, "--max-rejects", "2").exit_code == 0
    (src / "a" / "6.txt").write_text("caption 6")          # one reject fixed
    first = _run(src, dst, "--append")
    assert first.exit_code == 3, first.output               # 7.jpg still has no caption
    assert "1 of 8 inputs" in first.output
    (src / "a" / "7.txt").write_text("caption 7")          # the other fixed
    second = _run(src, dst, "--append")
    assert second.exit_code == 0, second.output
    manifest = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert manifest["rejects"] == [] and manifest["num_samples"] == 8
    assert manifest["source"]["num_inputs"] == 8           # each input counted once
    assert fmt.accounting_problem(manifest) is None
    assert [h["retried"] for h in manifest["history"]] == [2, 1]
    assert (dst / fmt.REJECTS_NAME).read_text().splitlines() == ["path\treason"]
    assert sorted(Dataset(dst).sample(i)["txt"] for i in range(8)) == \
        [f"caption {k}" for k in range(8)]
    assert verify(str(dst)).ok
    inspect = CliRunner().invoke(main, ["inspect", str(dst)])
    assert "missing sidecar" not in inspect.output
    assert _run(src, dst, "--append").exit_code == 0        # nothing new: still 0


def test_an_input_still_broken_is_listed_once(tmp_path):
    src, dst = _src(tmp_path / "src", 5, 4), tmp_path / "ds"
    assert _run(src, dst, "--max-rejects", "1").exit_code == 0
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(src / "a" / "new.jpg")
    (src / "a" / "new.txt").write_text("new")
    result = _run(src, dst, "--append", "--max-rejects", "1")
    assert result.exit_code == 0, result.output
    manifest = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert [r["path"] for r in manifest["rejects"]] == ["a/4.jpg"]
    assert manifest["source"]["num_inputs"] == 6 and manifest["num_samples"] == 5
    assert fmt.accounting_problem(manifest) is None
