"""``dlpack doctor``: a short measured run per setting, the best one recommended, and the
fastest training step it can feed (figures consistent with each other, not timings)."""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from dlpack_io.packer import convert
from dlpack_io.tools.cli import main
from dlpack_io.reader import CenterCrop, Dataset
from dlpack_io.tools.doctor import candidates, diagnose

from helpers import pack_and_upload


@pytest.fixture(scope="module")
def packed(image_folder, tmp_path_factory):
    dst = tmp_path_factory.mktemp("doctor") / "ds"
    convert(image_folder, dst, shard_size="40KB", workers=0, progress=False)
    return str(dst)


def test_doctor_measures_each_setting_and_recommends_the_fastest(packed):
    done = CliRunner().invoke(main, ["doctor", packed, "--json", "--seconds", "0.2",
                                     "--batch-size", "4", "--crop", "32", "--workers", "1,2p"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    trials = report["trials"]
    assert [(t["num_workers"], t["worker_kind"]) for t in trials] == [(1, "thread"), (2, "process")]
    assert all(t["images_per_s"] > 0 and t["batches"] >= 1 for t in trials)
    assert report["best"] == max(trials, key=lambda t: t["images_per_s"])
    assert report["fastest_step_ms"] == pytest.approx(1000 * 4 / report["best"]["images_per_s"])
    assert report["images"] == 24 and report["decode_only_images_per_s"] > 0


def test_doctor_text_names_the_recommended_setting(packed):
    done = CliRunner().invoke(main, ["doctor", packed, "--seconds", "0.2", "--batch-size", "4",
                                     "--crop", "32", "--workers", "1", "--center-crop"])
    assert done.exit_code == 0, done.output
    assert "recommended: Loader(..., num_workers=1, workers=Workers(kind='thread'))" in done.output
    assert "| 1 | thread |" in done.output and "without waiting" in done.output
    assert "warm-up (not counted): " in done.output and "with 1 thread workers, 0 bytes" \
        in done.output


@pytest.mark.parametrize("bad", ["0", "x", "2q", "1000"])
def test_doctor_refuses_a_worker_setting_it_cannot_read(packed, bad):
    done = CliRunner().invoke(main, ["doctor", packed, "--workers", bad])
    assert done.exit_code == 2 and "worker count" in done.output


def test_candidates_cover_threads_and_processes_up_to_the_cores():
    assert candidates(2) == [(1, "thread"), (2, "thread"), (2, "process")]
    assert candidates(8) == [(1, "thread"), (2, "thread"), (4, "thread"), (8, "thread"),
                             (2, "process"), (4, "process"), (8, "process")]
    assert candidates(1) == [(1, "thread")]


def _damaged_copy(packed, tmp_path, how: str) -> str:
    """A copy of ``packed`` with its first shard truncated, or a record's bytes zeroed."""
    dst = tmp_path / "damaged"
    shutil.copytree(packed, dst)
    shard = sorted(dst.glob("shard-*"))[0]
    data = bytearray(shard.read_bytes())
    if how == "truncated":
        data = data[:1000]
    else:  # the data section's bytes: records that decode to nothing
        data[4096:len(data) // 2] = bytes(len(data) // 2 - 4096)
    shard.write_bytes(bytes(data))
    return str(dst)


@pytest.mark.parametrize("how, names", [("truncated", "truncated"), ("zeroed", "record")])
def test_doctor_on_a_damaged_data_set_says_where_and_exits_1(packed, tmp_path, how, names):
    dst = _damaged_copy(packed, tmp_path, how)
    done = CliRunner().invoke(main, ["doctor", dst, "--seconds", "0.2", "--batch-size", "4",
                                     "--crop", "32", "--workers", "1,2p"])
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit), done.output
    assert "dlpack: error:" in done.output and "shard-00000" in done.output
    assert names in done.output and "dlpack verify" in done.output


def test_doctor_warms_up_so_no_setting_reads_cold_data(s3_env, tmp_path):
    """On s3:// with an empty cache the first setting measured fetched the data set alone
    (and looked slow); an untimed warm-up fetches it, and every setting reads warm data."""
    pack_and_upload(tmp_path, "s3://dlpack-test/doctor", s3_env.env(), count=24, classes=3,
                    seed=2, size=(48, 64))
    report = diagnose(Dataset("s3://dlpack-test/doctor"), [CenterCrop(32)], batch_size=4,
                      seconds=0.2, settings=[(1, "thread"), (2, "thread")])
    assert report["warmup"]["fetched_bytes"] > 0
    assert [t["fetched_bytes"] for t in report["trials"]] == [0, 0]


def test_doctor_runs_the_users_sample_transform(packed, tmp_path, monkeypatch):
    (tmp_path / "my_aug.py").write_text("def darker(image):\n    return image // 2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    done = CliRunner().invoke(main, ["doctor", packed, "--json", "--seconds", "0.2",
                                     "--batch-size", "4", "--crop", "32", "--workers", "1",
                                     "--sample-transform", "my_aug:darker"])
    assert done.exit_code == 0, done.output
    trial = json.loads(done.output)["trials"][0]
    assert trial["stage_shares"]["user"] > 0


@pytest.mark.parametrize("spec", ["my_aug", "no_such_module:f", "json:nothing", "json:__doc__"])
def test_doctor_refuses_a_sample_transform_it_cannot_import(packed, spec):
    done = CliRunner().invoke(main, ["doctor", packed, "--sample-transform", spec])
    assert done.exit_code == 2, done.output
    assert "MODULE:FUNCTION" in done.output or "not a function" in done.output


def test_every_doctor_option_says_what_it_does():
    import click

    from dlpack_io.tools.cli_doctor import doctor

    bare = [p.name for p in doctor.params if isinstance(p, click.Option) and not p.help]
    assert bare == []


@pytest.mark.parametrize("source, spec, words", [
    ("def darker(image)\n    return image\n", "broken_aug:darker", "SyntaxError"),
    ("raise RuntimeError('no GPU here')\n", "broken_aug:darker", "RuntimeError: no GPU here"),
    (None, ".relative:darker", "relative import")])
def test_doctor_refuses_a_sample_transform_whose_module_fails_to_import(packed, tmp_path,
                                                                        monkeypatch, source,
                                                                        spec, words):
    """A module with a syntax error, one that raises as it is imported, or a relative name
    gave a traceback (exit 1); each is a refusal naming MODULE:FUNCTION and why (exit 2)."""
    if source is not None:
        (tmp_path / "broken_aug.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    done = CliRunner().invoke(main, ["doctor", packed, "--sample-transform", spec])
    assert done.exit_code == 2, done.output
    assert spec in done.output and words in done.output and "MODULE:FUNCTION" in done.output
