"""``dlpack inspect A --order --mix B``: a Mixture's epoch as the Loader reads it, each set's
share per batch and the mixing quality against independent random draws."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from dlpack_io.reader import Dataset, Loader, Mixture, Output
from dlpack_io.packer import Writer
from dlpack_io.tools.cli import main
from dlpack_io.tools.mix_report import mixture_report, random_deviation


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixreport")
    for name, n in (("a", 40), ("b", 10)):
        with Writer(root / name, mode="raw", shard_size="1KB") as w:
            for i in range(n):
                w.write(image=np.full((4, 4, 3), i, np.uint8), label=i % 2)
    return str(root / "a"), str(root / "b")


def test_random_deviation_is_the_binomial_mean_miss():
    assert random_deviation(2, 0.5) == pytest.approx(0.5)       # |0-1|/4 + |2-1|/4
    assert random_deviation(1, 0.3) == pytest.approx(0.7 * 0.3 + 0.3 * 0.7)
    assert random_deviation(10, 1.0) == 0.0


def test_the_report_is_the_loaders_epoch(two):
    report = mixture_report(two, weights=[0.75, 0.25], samples_per_epoch=100, batch_size=8,
                            world_size=2, rank=1, epoch=2, seed=3, show=13)
    a, b = report["sets"]
    assert (a["per_epoch"], b["per_epoch"]) == (75, 25) and b["passes"] == 2.5
    assert a["read_by_rank"] + b["read_by_rank"] == report["rank_samples"] == 50
    loader = Loader(Mixture([Dataset(p) for p in two], [0.75, 0.25], samples_per_epoch=100),
                    batch_size=8, world_size=2, rank=1, seed=3, output=Output(return_index=True))
    loader.set_epoch(2)
    got = [i.tolist() for _, _, i in loader]
    assert len(got) == report["num_batches"] == 7
    for k, batch in enumerate(report["first_batches"]):
        assert batch["samples"] == got[k][:4]
        assert batch["per_set"] == np.bincount([s for s, _ in got[k]], minlength=2).tolist()
    for s in (a, b):   # stratified: each full batch of 8 within 2 of its share
        q = s["per_batch"]
        assert q["max"] - q["target"] <= 2 and q["target"] - q["min"] <= 2
        assert q["vs_random"] < 1


def test_the_cli_prints_and_refuses(two):
    runner = CliRunner()
    args = ["inspect", two[0], "--order", "--mix", two[1], "--batch-size", "10"]
    text = runner.invoke(main, args + ["--weights", "1,1", "--mix-epoch", "largest"]).output
    assert "set 1:" in text and "40 per epoch (4.00 passes)" in text
    data = json.loads(runner.invoke(main, args + ["--json"]).output)
    assert [s["per_epoch"] for s in data["sets"]] == [40, 10]    # default: sizes, sum
    bad = runner.invoke(main, args + ["--weights", "1,x"])
    assert bad.exit_code != 0 and "--weights '1,x'" in bad.output
    bad = runner.invoke(main, args + ["--weights", "1"])
    assert bad.exit_code != 0 and "1 weights for 2" in bad.output
