"""dlpack inspect on a data set with fields: the schema, per-field summaries, and one
sample's fields with --index."""
from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from dlpack_io.packer import Writer
from dlpack_io.tools.cli import main


def _ds(tmp_path):
    with Writer(tmp_path / "ds") as w:
        for i in range(4):
            w.write(image=np.zeros((4, 4, 3), np.uint8), label=i % 2, caption="c" * (i + 1),
                    n=i * 10, emb=np.full(3, i, np.float32), mask=np.ones((i, 2), np.uint8))
    return str(tmp_path / "ds")


def test_inspect_shows_schema_and_field_summaries(tmp_path):
    out = CliRunner().invoke(main, ["inspect", _ds(tmp_path)]).output
    assert "fields        4, over 4 samples:" in out
    assert "  caption        str: length 1..4 (mean 2.5)" in out
    assert "  n              int: values 0..30 (mean 15.0)" in out
    assert "  emb            array float32 ndim 1 shape [3]: 1 shapes, e.g. [[3]]; values 0.0..3.0" in out
    assert "  mask           array uint8 ndim 2 shape varies: 4 shapes" in out
    data = json.loads(CliRunner().invoke(main, ["inspect", str(tmp_path / "ds"), "--json"]).output)
    assert data["fields"]["schema"]["emb"] == {"type": "array", "dtype": "float32", "ndim": 1,
                                               "shape": [3]}


def test_inspect_index_shows_the_samples_fields(tmp_path):
    out = CliRunner().invoke(main, ["inspect", _ds(tmp_path), "--index", "2"]).output
    assert "field     caption = 'ccc'" in out and "field     n = 20" in out
    assert "field     emb = {'dtype': 'float32', 'shape': [3], 'values': [2.0, 2.0, 2.0]" in out


def test_inspect_of_a_field_less_data_set_says_so(tmp_path):
    with Writer(tmp_path / "plain") as w:
        w.write(image=np.zeros((4, 4, 3), np.uint8))
    out = CliRunner().invoke(main, ["inspect", str(tmp_path / "plain")]).output
    assert "\nfields " not in out  # format 2: the summary is as before
