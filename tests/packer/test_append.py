"""Appending to a data set: ``dlpack convert SRC DST --append`` and ``Writer(dst,
append=True)``: old shards byte for byte, only new inputs packed, new classes after the old
ones, the history, resume after kill -9, a reader of the old manifest, verify."""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from dlpack_io.packer import Writer, convert, writers
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader import Dataset, Loader, Output, RandomCrop
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.schema import INPUTSTAT_NAME
from dlpack_io.tools.cli import main
from dlpack_io.tools.synth import make_image_folder
from dlpack_io.tools.verification import verify

from helpers import convert_stopped_at, dataset_fingerprint, gone, wait_until

OPTS = dict(shard_size="40KB", workers=1, progress=False)


def _copy_in(folder, src, prefix: str) -> list:
    """Copy the class folders of ``folder`` into ``src`` (file names prefixed); return
    the relative paths added."""
    added = []
    for cls in sorted(os.listdir(folder)):
        os.makedirs(src / cls, exist_ok=True)
        for name in sorted(os.listdir(folder / cls)):
            shutil.copy(folder / cls / name, src / cls / f"{prefix}{name}")
            added.append(f"{cls}/{prefix}{name}")
    return added


def _shard_hashes(dst) -> dict:
    return {n: hashlib.sha256((dst / n).read_bytes()).hexdigest()
            for n in os.listdir(dst) if n.startswith("shard-")}


def _pack_and_grow(tmp_path, data_format="record"):
    src = tmp_path / "src"
    make_image_folder(src, 30, 2, seed=0, size=(48, 64))
    dst = tmp_path / "ds"
    convert(src, dst, format=data_format, **OPTS)
    make_image_folder(tmp_path / "new", 24, 3, seed=1, size=(48, 64))
    return src, dst, _copy_in(tmp_path / "new", src, "n")


@pytest.mark.parametrize("data_format", ["record", "lmdb"])
def test_append_packs_only_new_inputs_and_leaves_old_shards_alone(tmp_path, data_format):
    src, dst = tmp_path / "src", tmp_path / "ds"
    make_image_folder(src, 30, 2, seed=0, size=(48, 64))
    convert(src, dst, format=data_format, **OPTS)
    before, old = _shard_hashes(dst), json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    old_labels = Dataset(dst).labels.copy()
    make_image_folder(tmp_path / "new", 24, 3, seed=1, size=(48, 64))
    added = _copy_in(tmp_path / "new", src, "n")
    result = convert(src, dst, append=True, **OPTS)
    a = result["append"]
    assert (a["duplicates"], a["changed"], a["unverified"], a["new_samples"]) == (30, 0, 0, 24)
    assert a["new_classes"] == ["class_02"] and result["num_samples"] == 54
    after = _shard_hashes(dst)
    assert {n: after[n] for n in before} == before  # old shards byte for byte
    assert sorted(set(after) - set(before)) == a["new_shards"]
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert m["shards"][:len(old["shards"])] == old["shards"]
    assert m["classes"] == ["class_00", "class_01", "class_02"]
    assert m["class_counts"] == [15 + 8, 15 + 8, 8] and m["num_samples"] == 54
    assert m["created"] == old["created"] and m["options"] == old["options"]
    assert m["source"]["num_inputs"] == 54
    (entry,) = m["history"]
    assert (entry["first_sample"], entry["num_samples"], entry["inputs"]) == (30, 24, 24)
    assert entry["shards"] == a["new_shards"] and entry["new_classes"] == ["class_02"]
    ds = Dataset(dst)
    assert len(ds) == 54 and (ds.labels[:30] == old_labels).all()  # never renumbered
    paths = [p for s in ds.shards for p in s.meta()["paths"]]
    assert sorted(paths[30:]) == sorted(added)
    sources = [h for s in ds.shards for h in s.meta()[fmt.SOURCES_KEY]]
    assert sources == [hashlib.sha256((src / p).read_bytes()).hexdigest() for p in paths]
    assert [m["classes"][label] for label in ds.labels[30:]] == [p.split("/")[0]
                                                                 for p in paths[30:]]
    assert verify(dst, progress=False).ok
    again = convert(src, dst, append=True, **OPTS)  # nothing new: the data set is unchanged
    assert again["nothing_new"] and again["append"]["duplicates"] == 54
    assert json.loads((dst / fmt.MANIFEST_NAME).read_bytes()) == m


def test_changed_inputs_are_reported_and_left_without_replace_changed(tmp_path):
    src, dst, _ = _pack_and_grow(tmp_path)
    changed = sorted(os.listdir(src / "class_00"))[0]
    (src / "class_00" / changed).write_bytes((src / "class_01" / sorted(
        os.listdir(src / "class_01"))[0]).read_bytes())
    out = CliRunner().invoke(main, ["convert", str(src), str(dst), "--append", "--quiet"])
    assert out.exit_code == 0, out.output
    assert "1 changed" in out.output and f"class_00/{changed}" in out.output
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert m["num_samples"] == 54 and m["history"][0]["changed"] == 1
    assert m["history"][0]["duplicates"] == 29 and m["history"][0]["replaced"] == 0
    assert fmt.RETIRED_KEY not in m and m["version"] == fmt.PLAIN_VERSION
    out = CliRunner().invoke(main, ["inspect", str(dst)])
    assert "+24 samples from 30 in" in out.output and "29 duplicates, 1 changed" in out.output


def test_a_history_naming_a_shard_the_manifest_lacks_is_refused(tmp_path):
    src, dst, _ = _pack_and_grow(tmp_path)
    convert(src, dst, append=True, **OPTS)
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    m["history"][0]["shards"].append("shard-00099.rec")
    m["checksum"] = fmt.manifest_checksum(m)
    (dst / fmt.MANIFEST_NAME).write_bytes(fmt.encode_meta(m))
    with pytest.raises(fmt.FormatError, match=r"history\[0\] lists shard 'shard-00099.rec'"):
        Dataset(dst)
    assert not verify(dst, progress=False).ok


def test_recorded_input_hashes_must_be_exactly_64_hex_digits():
    sha = "0123456789abcdef" * 4
    assert fmt.sources_of({"sources": [sha, sha]}, 2) == [sha, sha]
    for bad in (sha + "\n", sha.upper(), sha[:-1], " " + sha):  # not a hash we wrote
        assert fmt.sources_of({"sources": [sha, bad]}, 2) is None
    assert fmt.sources_of({"sources": [sha]}, 2) is None  # one per record


def test_an_option_other_than_the_data_sets_is_refused(tmp_path):
    src, dst, _ = _pack_and_grow(tmp_path)
    before = (dst / fmt.MANIFEST_NAME).read_bytes()
    with pytest.raises(ConversionError, match="quality=80, but the data set was packed with "
                                              "quality=95"):
        convert(src, dst, append=True, quality=80, **OPTS)
    with pytest.raises(ConversionError, match="--overwrite replaces it"):
        convert(src, dst, append=True, overwrite=True, **OPTS)
    with pytest.raises(ConversionError, match="no manifest.json, so no data set"):
        convert(src, tmp_path / "none", append=True, **OPTS)
    assert (dst / fmt.MANIFEST_NAME).read_bytes() == before
    assert not [n for n in os.listdir(dst) if n.startswith(".")]  # no journal, lock, temp


def test_shards_packed_without_hashes_are_skipped_by_path(tmp_path, monkeypatch):
    real = writers._ShardWriter._index_and_meta

    def without_sources(self):  # what a shard packed before hashes were recorded holds
        index, meta = real(self)
        meta.pop(fmt.SOURCES_KEY, None)
        return index, meta
    monkeypatch.setattr(writers._ShardWriter, "_index_and_meta", without_sources)
    src, dst, _ = _pack_and_grow(tmp_path)
    monkeypatch.undo()
    a = convert(src, dst, append=True, **OPTS)["append"]
    assert (a["unverified"], a["duplicates"], a["new_samples"]) == (30, 0, 24)


def test_kill_9_during_an_append_then_resume_gives_the_same_bytes(tmp_path):
    src, dst, _ = _pack_and_grow(tmp_path)
    other = tmp_path / "other"
    shutil.copytree(dst, other)
    convert(src, dst, append=True, **OPTS)
    cli = [src, other, "--append", "--workers", "1", "--quiet"]
    children = convert_stopped_at("journal:1", cli)  # killed -9 after its first new shard
    # its workers hold the DST lock until they notice the parent is gone
    wait_until(lambda: all(gone(pid) for pid in children), what="the killed run's workers")
    assert 0 < len(_shard_hashes(dst)) - len(_shard_hashes(other)) < 3
    out = CliRunner().invoke(main, ["convert", *map(str, cli)])
    assert out.exit_code == 1 and "--resume" in out.output  # no silent restart
    out = CliRunner().invoke(main, ["convert", *map(str, cli), "--resume"])
    assert out.exit_code == 0, out.output
    mine, theirs = dataset_fingerprint(other), dataset_fingerprint(dst)
    # the input-stat record is no part of the data set: it names its manifest (whose time
    # differs), and a resumed append records none of the inputs its killed run read
    recorded = [set(json.loads((d / INPUTSTAT_NAME).read_bytes())["paths"])
                for d in (other, dst)]
    assert recorded[0] < recorded[1] and len(recorded[1] - recorded[0]) == 24
    for fp in (mine, theirs):  # the time of the append is the one difference
        m = json.loads(fp[fmt.MANIFEST_NAME])
        m["history"][0].pop("at")
        fp[fmt.MANIFEST_NAME] = m
    assert mine == theirs


def test_a_reader_of_the_old_manifest_finishes_its_epoch(tmp_path):
    src, dst, _ = _pack_and_grow(tmp_path)
    loader = Loader(Dataset(dst), batch_size=4, num_workers=1, seed=1,
                    output=Output(return_index=True), transforms=[RandomCrop(24)])
    batches = iter(loader)
    seen = list(next(batches)[2])
    convert(src, dst, append=True, **OPTS)  # the manifest is replaced mid-epoch
    for _, _, index in batches:
        seen += list(index)
    assert sorted(seen) == list(range(30))
    assert len(Dataset(dst)) == 54  # a reader opening now sees the union


def test_writer_appends_returns_the_index_of_duplicates_and_refuses_changed(tmp_path):
    make_image_folder(tmp_path / "img", 12, 1, seed=2, size=(40, 40))
    files = sorted(str(p) for p in (tmp_path / "img" / "class_00").iterdir())
    dst = tmp_path / "w"
    with Writer(dst, classes=["a", "b"], shard_size="16KB", format="lmdb") as w:
        for i, f in enumerate(files[:6]):
            w.write(image=f, label=i % 2, caption=f"c{i}")
    before = _shard_hashes(dst)
    with Writer(dst, append=True, classes=["a", "b", "c"]) as w:
        assert w.options.format == "lmdb" and w.options.shard_size == 16_000
        got = [w.write(image=f, label=2, caption="new") for f in files[4:10]]
    assert got == [4, 5, 6, 7, 8, 9]
    after = _shard_hashes(dst)
    assert {n: after[n] for n in before} == before
    ds = Dataset(dst)
    assert len(ds) == 10 and ds.sample(9)["caption"] == "new" and ds.sample(4)["caption"] == "c4"
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert m["classes"] == ["a", "b", "c"] and m["class_counts"] == [3, 3, 4]
    assert m["history"][0]["duplicates"] == 2 and m["history"][0]["new_classes"] == ["c"]
    shutil.copy(files[11], files[0])  # same path, other content
    with pytest.raises(ValueError, match="packed before with other content"):
        with Writer(dst, append=True) as w:
            w.write(image=files[0], label=0, caption="x")
    with pytest.raises(ValueError, match="must start with the data set's classes"):
        Writer(dst, append=True, classes=["b", "a"])
    assert json.loads((dst / fmt.MANIFEST_NAME).read_bytes()) == m
    assert np.array_equal(Dataset(dst).labels, [0, 1, 0, 1, 0, 1, 2, 2, 2, 2])


def test_append_to_s3_uploads_new_shards_and_the_manifest_last(s3_env, tmp_path):
    from dlpack_io.reader.remote.storage import Store

    src, local, _ = _pack_and_grow(tmp_path)
    url = "s3://dlpack-test/append/small"
    make_image_folder(tmp_path / "first", 30, 2, seed=0, size=(48, 64))
    convert(tmp_path / "first", url, **OPTS)
    store = Store(url)
    before = {n: store.get(n) for n in store.list() if n.startswith("shard-")}
    convert(tmp_path / "first", local, overwrite=True, **OPTS)
    mine = convert(src, url, append=True, **OPTS)
    theirs = convert(src, local, append=True, **OPTS)
    assert mine["append"] == theirs["append"] and mine["append"]["new_samples"] == 24
    objects = {n: store.get(n) for n in store.list()}
    assert {n: objects[n] for n in before} == before  # old objects untouched
    assert sorted(objects) == sorted(os.listdir(local))  # no journal left
    for name in mine["append"]["new_shards"]:
        assert objects[name] == (local / name).read_bytes()
    m = json.loads(objects[fmt.MANIFEST_NAME])
    assert m["num_samples"] == 54 and m["history"][0]["shards"] == mine["append"]["new_shards"]
    assert verify(url, progress=False).ok
    assert convert(src, url, append=True, **OPTS)["nothing_new"]


def test_writer_append_keeps_the_data_sets_rejects(tmp_path):
    src = tmp_path / "src"
    make_image_folder(src, 6, 1, seed=3, size=(40, 40))
    (src / "class_00" / "broken.jpg").write_bytes(b"not a jpeg")
    dst = tmp_path / "ds"
    convert(src, dst, **OPTS)
    with Writer(dst, append=True) as w:
        assert w.write(image=str(src / "class_00" / "img_000000.jpg"), label=0) == 6
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert [r["path"] for r in m["rejects"]] == ["class_00/broken.jpg"]
    assert m["num_samples"] == 7 and m["source"]["num_inputs"] == 8
    assert (dst / fmt.REJECTS_NAME).read_text().splitlines()[1].startswith("class_00/broken.jpg")
    assert verify(dst, progress=False).ok


def test_kill_9_after_the_manifest_landed_then_resume_only_drops_the_journal(tmp_path):
    src, dst, _ = _pack_and_grow(tmp_path)
    other = tmp_path / "other"
    shutil.copytree(dst, other)
    convert(src, dst, append=True, **OPTS)
    cli = [src, other, "--append", "--workers", "1", "--quiet"]
    children = convert_stopped_at("manifest", cli)
    wait_until(lambda: all(gone(pid) for pid in children), what="the killed run's workers")
    out = CliRunner().invoke(main, ["convert", *map(str, cli), "--resume"])
    assert out.exit_code == 0 and "nothing new" in out.output, out.output
    assert sorted(os.listdir(other)) == sorted(os.listdir(dst))  # journal and lock gone
    assert _shard_hashes(other) == _shard_hashes(dst)
