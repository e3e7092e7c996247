"""The dlpack command: every --help, and convert -> inspect -> verify through click."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlpack_io.reader import Output
from dlpack_io.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]

COMMANDS = ["convert", "inspect", "verify", "doctor"]


@pytest.mark.parametrize("command", [[]] + [[c] for c in COMMANDS])
def test_help_describes_every_option(command):
    result = CliRunner().invoke(main, command + ["--help"])
    assert result.exit_code == 0, result.output
    group = main if not command else main.commands[command[0]]
    for param in group.params:
        for opt in getattr(param, "opts", []):
            if opt.startswith("--"):
                assert opt in result.output


def test_console_script_help_runs():
    done = subprocess.run([sys.executable, "-m", "dlpack_io.tools.cli", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "convert" in done.stdout


def test_convert_inspect_verify(image_folder, tmp_path):
    runner = CliRunner()
    dst = str(tmp_path / "ds")
    result = runner.invoke(main, ["convert", str(image_folder), dst, "--quiet", "--workers", "1",
                                  "--shard-size", "40KB", "--format", "lmdb"])
    assert result.exit_code == 0, result.output
    assert "packed 24 images" in result.output
    summary = runner.invoke(main, ["inspect", dst])
    assert summary.exit_code == 0 and "lmdb (version 2)" in summary.output
    assert "class_02" in summary.output
    data = json.loads(runner.invoke(main, ["inspect", dst, "--json"]).output)
    assert data["num_samples"] == 24 and [c["count"] for c in data["classes"]] == [8, 8, 8]
    shard = runner.invoke(main, ["inspect", dst, "--shard", "0"])
    assert shard.exit_code == 0 and "shard-00000.lmdb" in shard.output
    record = json.loads(runner.invoke(main, ["inspect", dst, "--index", "23", "--json"]).output)
    assert record["crc_ok"] and record["source"].endswith(".jpg")
    grid = runner.invoke(main, ["inspect", dst, "--grid", str(tmp_path / "sheet.png")])
    assert grid.exit_code == 0 and (tmp_path / "sheet.png").stat().st_size > 1000
    ok = runner.invoke(main, ["verify", dst, "--quiet", "--decode"])
    assert ok.exit_code == 0 and ok.output.startswith("OK")


def test_errors_are_one_clear_line(image_folder, tmp_path):
    runner = CliRunner()
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "x").write_text("x")
    result = runner.invoke(main, ["convert", str(image_folder), str(tmp_path / "ds"), "--quiet"])
    assert result.exit_code == 1 and "not empty" in result.output and "--resume" in result.output
    missing = runner.invoke(main, ["inspect", str(tmp_path / "ds"), "--index", "999"])
    assert missing.exit_code == 1 and "is not a dlpack data set (no manifest.json)" in missing.output
    bad = runner.invoke(main, ["verify", str(tmp_path / "ds"), "--quiet"])
    assert bad.exit_code == 3 and "NOT A DATA SET" in bad.output and "DAMAGED" not in bad.output


def test_index_out_of_range(image_folder, tmp_path):
    runner = CliRunner()
    dst = str(tmp_path / "ds")
    runner.invoke(main, ["convert", str(image_folder), dst, "--quiet", "--workers", "1"])
    result = runner.invoke(main, ["inspect", dst, "--index", "24"])
    assert result.exit_code == 1 and "out of range" in result.output


def test_inspect_order_report(image_folder, tmp_path):
    runner = CliRunner()
    dst = str(tmp_path / "ds")
    runner.invoke(main, ["convert", str(image_folder), dst, "--quiet", "--workers", "1"])
    text = runner.invoke(main, ["inspect", dst, "--order", "--world-size", "2", "--rank", "1",
                                "--batch-size", "4", "--shuffle", "block"])
    assert text.exit_code == 0, text.output
    assert "rank 1 of 2" in text.output and "shuffle quality" in text.output
    data = json.loads(runner.invoke(main, ["inspect", dst, "--order", "--batch-size", "4",
                                           "--world-size", "2", "--json"]).output)
    other = json.loads(runner.invoke(main, ["inspect", dst, "--order", "--batch-size", "4",
                                            "--world-size", "2", "--rank", "1", "--json"]).output)
    assert data != other


def test_version_names_the_image_stack():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert "PIL: pillow" in result.output and "JPEG decoding in the Loader:" in result.output


@pytest.mark.parametrize("flag,drop_last", [(None, False), ("--drop-last", True),
                                            ("--no-drop-last", False)])
def test_inspect_order_reads_what_the_loader_reads(image_folder, tmp_path, flag, drop_last):
    """The report's batches are the Loader's, and its default drop_last is the Loader's."""
    from dlpack_io.reader import Dataset, Loader, RandomCrop

    dst = str(tmp_path / "ds")
    CliRunner().invoke(main, ["convert", str(image_folder), dst, "--quiet", "--workers", "1"])
    args = ["inspect", dst, "--order", "--batch-size", "3", "--world-size", "3", "--rank",
            "2", "--epoch", "1", "--seed", "4", "--json"] + ([flag] if flag else [])
    report = json.loads(CliRunner().invoke(main, args).output)
    kw = {} if flag is None else {"drop_last": drop_last}
    loader = Loader(Dataset(dst), batch_size=3, rank=2, world_size=3, seed=4, num_workers=0,
                    output=Output(return_index=True), transforms=[RandomCrop(8)], **kw)
    loader.set_epoch(1)
    batches = [i for _, _, i in loader]
    assert report["drop_last"] is drop_last and loader.drop_last is drop_last
    assert report["num_batches"] == len(batches) and report["rank_samples"] == \
        sum(len(b) for b in batches)
    for shown, real in zip(report["first_batches"], batches):
        assert shown["size"] == len(real)
        assert [s["sample"] for s in shown["samples"]] == real[:4].tolist()


def test_inspect_order_with_buckets_reads_what_a_bucketed_loader_reads(tmp_path):
    """--aspect-buckets / --token-budget: the report's batches are the bucketed Loader's, with
    the bucket histogram or the budget's fill; --grid --augmented draws a bucketed batch."""
    from dlpack_io.reader import AspectBuckets, Dataset, Loader, TokenBudget

    golden = str(ROOT / "tests" / "data" / "golden" / "photos")
    for flag, spec, buckets in (("--aspect-buckets", "1600/8/2.5",
                                 AspectBuckets(area=1600, multiple=8, max_ratio=2.5)),
                                ("--token-budget", "100/8/56",
                                 TokenBudget(tokens=100, patch=8, max_side=56))):
        args = ["inspect", golden, "--order", "--batch-size", "4", "--world-size", "2",
                "--rank", "1", "--seed", "3", "--json", flag, spec]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        loader = Loader(Dataset(golden), batch_size=4, rank=1, world_size=2, seed=3,
                        num_workers=0, buckets=buckets, output=Output(return_index=True))
        batches = [b[-1] for b in loader]
        assert report["num_batches"] == len(batches)
        for shown, real in zip(report["first_batches"], batches):
            assert [s["sample"] for s in shown["samples"]] == real[:4].tolist()
        b = report["buckets"]
        if flag == "--aspect-buckets":
            assert sum(x["samples"] for x in b["buckets"]) == 40
            assert sum(x["rank_batches"] for x in b["buckets"]) == len(batches)
        else:
            assert 0 < b["mean_fill"] <= 1 and 0 <= b["padding"] < 1
        text = CliRunner().invoke(main, args[:-3] + [flag, spec])
        assert ("aspect buckets" if flag == "--aspect-buckets" else "token budget 100") \
            in text.output
        sheet = CliRunner().invoke(main, ["inspect", golden, "--grid", str(tmp_path / "b.png"),
                                          "--augmented", "--grid-count", "4", flag, spec])
        assert sheet.exit_code == 0 and "as the Loader yields them" in sheet.output
    bad = CliRunner().invoke(main, ["inspect", golden, "--order", "--token-budget", "x/8"])
    assert bad.exit_code != 0 and "expected numbers, TOKENS/PATCH/MAX_SIDE" in bad.output
