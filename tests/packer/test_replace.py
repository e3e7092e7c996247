"""``dlpack convert SRC DST --append --replace-changed``: a changed input's new content is
packed into new shards and its old record retired (reader/format/schema.py): old shard
bytes unchanged, the sample keeps its index and shows the new content, indices stay dense,
the summary and history say what was replaced, kill -9 then --resume gives the same bytes,
a reader of the old manifest keeps reading what it knew, s3:// too."""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from dlpack_io.packer import convert
from dlpack_io.reader import Dataset, Loader, Output, RandomCrop
from dlpack_io.reader import format as fmt
from dlpack_io.tools.cli import main
from dlpack_io.tools.synth import make_image_folder
from dlpack_io.tools.verification import verify

from helpers import convert_stopped_at, dataset_fingerprint, gone, wait_until

OPTS = dict(shard_size="40KB", workers=1, progress=False)


def _shard_hashes(dst) -> dict:
    return {n: hashlib.sha256((dst / n).read_bytes()).hexdigest()
            for n in os.listdir(dst) if n.startswith("shard-")}


def _packed_with_a_change(tmp_path, data_format="record", new=6):
    """A data set of 30 images (2 classes), then SRC grown by ``new`` images (a new class)
    and one packed file rewritten with the bytes of another image. Returns (src, dst, the
    changed path, the path of the new image whose bytes it now holds)."""
    src, dst = tmp_path / "src", tmp_path / "ds"
    make_image_folder(src, 30, 2, seed=0, size=(48, 64))
    convert(src, dst, format=data_format, **OPTS)
    make_image_folder(tmp_path / "new", new, 3, seed=1, size=(48, 64))
    for cls in sorted(os.listdir(tmp_path / "new")):
        os.makedirs(src / cls, exist_ok=True)
        for name in sorted(os.listdir(tmp_path / "new" / cls)):
            shutil.copy(tmp_path / "new" / cls / name, src / cls / f"n{name}")
    changed = "class_00/" + sorted(os.listdir(src / "class_00"))[2]
    twin = "class_02/" + sorted(os.listdir(src / "class_02"))[0]
    shutil.copy(src / twin, src / changed)
    return src, dst, changed, twin


def _index_of(ds, path: str) -> int:
    (i,) = [i for i in range(len(ds)) if ds.source(i, relative=True) == path]
    return i


@pytest.mark.parametrize("data_format", ["record", "lmdb"])
def test_replace_changed_retires_the_old_record_and_keeps_the_index(tmp_path, data_format):
    src, dst, changed, twin = _packed_with_a_change(tmp_path, data_format)
    old = Dataset(dst)
    slot = _index_of(old, changed)
    old_pixels, before = old[slot][0].copy(), _shard_hashes(dst)
    result = convert(src, dst, append=True, replace_changed=True, **OPTS)
    a = result["append"]
    assert (a["changed"], a["replaced"], a["replaced_paths"]) == (1, 1, [changed])
    assert (a["duplicates"], a["new_samples"], a["base_samples"]) == (29, 7, 30)
    assert result["num_samples"] == 36 and result["retired"] == 1
    after = _shard_hashes(dst)
    assert {n: after[n] for n in before} == before  # old shards byte for byte
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert m["version"] == fmt.RETIRING_VERSION and m["num_samples"] == 37
    ((retired, new),) = m[fmt.RETIRED_KEY]
    assert retired == old.record_of(slot) and 30 <= new < 37
    assert m["history"][0]["replaced"] == 1 and m["history"][0]["inputs"] == 7
    ds = Dataset(dst)
    assert len(ds) == 36 and _index_of(ds, changed) == slot  # same index, new content
    assert [ds.source(i, relative=True) for i in range(30)] == \
        [old.source(i, relative=True) for i in range(30)]  # every old index stable
    assert np.array_equal(ds[slot][0], ds[_index_of(ds, twin)][0])
    assert not np.array_equal(ds[slot][0], old_pixels)
    assert np.array_equal(old[slot][0], old_pixels)  # the old manifest's reader: as before
    assert ds.labels[slot] == 0 and ds.sample(slot)["label"] == 0
    assert sorted(p for p, _ in ds.samples) == sorted(
        os.path.join(str(src), p) for p in a_paths(src))
    assert sum(ds.shard_sizes) == 36
    assert verify(dst, progress=False).ok
    again = convert(src, dst, append=True, replace_changed=True, **OPTS)
    assert again["nothing_new"] and again["append"]["duplicates"] == 36
    assert again["num_samples"] == 36 and again["append"]["quick"] == 36  # replaced: recorded


def a_paths(src) -> list:
    """Every image of SRC, relative."""
    return sorted(f"{c}/{n}" for c in os.listdir(src) for n in os.listdir(src / c))


def test_a_sample_replaced_twice_shows_the_last_content(tmp_path):
    src, dst, changed, twin = _packed_with_a_change(tmp_path)
    convert(src, dst, append=True, replace_changed=True, **OPTS)
    slot = _index_of(Dataset(dst), changed)
    other = "class_01/" + sorted(os.listdir(src / "class_01"))[0]
    shutil.copy(src / other, src / changed)
    a = convert(src, dst, append=True, replace_changed=True, **OPTS)["append"]
    assert (a["replaced"], a["new_samples"], a["duplicates"]) == (1, 1, 35)
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    first = m[fmt.RETIRED_KEY][0]
    assert m[fmt.RETIRED_KEY] == [first, [first[1], 37]]  # a chain: 12 -> 3x -> 37
    ds = Dataset(dst)
    assert len(ds) == 36 and ds.record_of(slot) == 37
    assert np.array_equal(ds[slot][0], ds[_index_of(ds, other)][0])
    loader = Loader(ds, batch_size=5, num_workers=1, seed=3, shuffle="block",
                    output=Output(return_index=True), transforms=[RandomCrop(24)])
    seen = [int(i) for _, _, index in loader for i in index]
    assert sorted(seen) == list(range(36))  # each sample once, none retired
    out = CliRunner().invoke(main, ["inspect", str(dst)])
    assert out.exit_code == 0, out.output
    assert "36 samples in" in out.output and "2 records retired" in out.output
    assert "1 changed, 1 of them replaced" in out.output
    ((old, _), _) = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())[fmt.RETIRED_KEY]
    shard = [k for k, e in enumerate(ds.manifest["shards"]) if e["first_sample"] <= old][-1]
    out = CliRunner().invoke(main, ["inspect", str(dst), "--shard", str(shard), "--json"])
    rows = {r["record"] + ds.manifest["shards"][shard]["first_sample"]: r["sample"]
            for r in json.loads(out.output)["records"]}
    assert rows[old] is None and all(s == r for r, s in rows.items() if r != old)


def test_without_the_flag_nothing_is_replaced_and_the_cli_says_so(tmp_path):
    src, dst, changed, _ = _packed_with_a_change(tmp_path)
    out = CliRunner().invoke(main, ["convert", str(src), str(dst), "--append", "--quiet"])
    assert out.exit_code == 0 and "--replace-changed packs the new content" in out.output
    assert changed in out.output
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert fmt.RETIRED_KEY not in m and m["version"] == fmt.PLAIN_VERSION
    assert len(Dataset(dst)) == 36
    shutil.rmtree(dst)
    src, dst, changed, _ = _packed_with_a_change(tmp_path / "b")
    out = CliRunner().invoke(main, ["convert", str(src), str(dst), "--append",
                                    "--replace-changed", "--quiet"])
    assert out.exit_code == 0, out.output
    assert "replaced 1 changed input" in out.output and changed in out.output
    assert "now 36 in" in out.output


def test_a_changed_input_the_encoder_rejects_retires_nothing(tmp_path):
    src, dst, changed, _ = _packed_with_a_change(tmp_path)
    (src / changed).write_bytes(b"not a jpeg any more")
    result = convert(src, dst, append=True, replace_changed=True, **OPTS)
    assert result["append"]["replaced"] == 0 and result["append"]["changed"] == 1
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert fmt.RETIRED_KEY not in m and m["rejects"][-1]["path"] == changed
    assert len(Dataset(dst)) == 36 and verify(dst, progress=False).ok
    again = convert(src, dst, append=True, **OPTS)["append"]  # still changed, not "quick"
    assert (again["changed"], again["duplicates"], again["replaced"]) == (1, 35, 0)


def test_kill_9_during_a_replacing_append_then_resume_gives_the_same_bytes(tmp_path):
    src, dst, _, _ = _packed_with_a_change(tmp_path, new=24)  # 3 new shards
    other = tmp_path / "other"
    shutil.copytree(dst, other)
    convert(src, dst, append=True, replace_changed=True, **OPTS)
    cli = [src, other, "--append", "--replace-changed", "--workers", "1", "--quiet"]
    children = convert_stopped_at("journal:1", cli)  # killed -9 after its first new shard
    wait_until(lambda: all(gone(pid) for pid in children), what="the killed run's workers")
    assert 0 < len(_shard_hashes(dst)) - len(_shard_hashes(other)) < 3
    assert fmt.RETIRED_KEY not in json.loads((other / fmt.MANIFEST_NAME).read_bytes())
    out = CliRunner().invoke(main, ["convert", *map(str, cli), "--resume"])
    assert out.exit_code == 0, out.output
    mine, theirs = dataset_fingerprint(other), dataset_fingerprint(dst)
    for fp in (mine, theirs):  # the time of the append is the one difference
        m = json.loads(fp[fmt.MANIFEST_NAME])
        m["history"][0].pop("at")
        fp[fmt.MANIFEST_NAME] = m
    assert mine[fmt.MANIFEST_NAME][fmt.RETIRED_KEY] == theirs[fmt.MANIFEST_NAME][fmt.RETIRED_KEY]
    assert mine == theirs


def test_replace_changed_on_s3(s3_env, tmp_path):
    from dlpack_io.reader.remote.storage import Store

    src, local, changed, twin = _packed_with_a_change(tmp_path)
    url = "s3://dlpack-test/replace/small"
    first = tmp_path / "first"
    make_image_folder(first, 30, 2, seed=0, size=(48, 64))
    convert(first, url, **OPTS)
    store = Store(url)
    before = {n: store.get(n) for n in store.list() if n.startswith("shard-")}
    convert(first, local, overwrite=True, **OPTS)
    mine = convert(src, url, append=True, replace_changed=True, **OPTS)
    theirs = convert(src, local, append=True, replace_changed=True, **OPTS)
    assert mine["append"]["replaced"] == theirs["append"]["replaced"] == 1
    assert {n: store.get(n) for n in before} == before  # old objects untouched
    m = json.loads(store.get(fmt.MANIFEST_NAME))
    assert m[fmt.RETIRED_KEY] == json.loads((local / fmt.MANIFEST_NAME).read_bytes())[
        fmt.RETIRED_KEY]
    ds, here = Dataset(url, cache_dir=tmp_path / "cache"), Dataset(local)
    try:
        slot = _index_of(here, changed)
        assert len(ds) == 36 and np.array_equal(ds[slot][0], here[_index_of(here, twin)][0])
        loader = Loader(ds, batch_size=6, num_workers=1, seed=0, output=Output(return_index=True),
                        transforms=[RandomCrop(24)])
        assert sorted(int(i) for _, _, index in loader for i in index) == list(range(36))
    finally:
        ds.close()
    assert verify(url, progress=False).ok


def test_later_appends_keep_the_retired_records(tmp_path):
    from dlpack_io.packer import Writer

    src, dst, changed, twin = _packed_with_a_change(tmp_path)
    convert(src, dst, append=True, replace_changed=True, **OPTS)
    retired = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())[fmt.RETIRED_KEY]
    make_image_folder(tmp_path / "more", 2, 1, seed=5, size=(48, 64))
    for name in os.listdir(tmp_path / "more" / "class_00"):
        shutil.copy(tmp_path / "more" / "class_00" / name, src / "class_01" / f"m{name}")
    a = convert(src, dst, append=True, **OPTS)["append"]  # no flag: nothing to replace
    assert (a["new_samples"], a["replaced"], a["duplicates"]) == (2, 0, 36)
    with Writer(dst, append=True) as w:  # the Writer knows files by the path given
        assert w.write(image=str(src / twin), label=2) == 38  # sample index, not record 39
        assert w.write(image=str(src / twin), label=2) == 38  # a duplicate: its index
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert m[fmt.RETIRED_KEY] == retired and m["version"] == fmt.RETIRING_VERSION
    ds = Dataset(dst)
    assert len(ds) == 39 and m["num_samples"] == 40 and ds.record_of(38) == 39
    assert np.array_equal(ds[38][0], ds[_index_of(ds, twin)][0])
    from dlpack_io.packer.writer import AppendBase

    base = AppendBase(str(dst), {}, None)  # what a Writer returns for a duplicate's record
    assert [base.sample_of(ds.record_of(i)) for i in range(len(ds))] == list(range(39))
    assert verify(dst, progress=False).ok


def test_a_replaced_sample_carries_its_new_fields(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "ds"
    make_image_folder(src, 8, 1, seed=2, size=(40, 48))
    names = sorted(os.listdir(src / "class_00"))
    for k, name in enumerate(names):  # a sidecar caption beside each image: field "txt"
        (src / "class_00" / f"{os.path.splitext(name)[0]}.txt").write_text(f"caption {k}")
    convert(src, dst, **OPTS)
    slot = _index_of(Dataset(dst), f"class_00/{names[3]}")
    shutil.copy(src / "class_00" / names[5], src / "class_00" / names[3])
    (src / "class_00" / f"{os.path.splitext(names[3])[0]}.txt").write_text("replaced")
    a = convert(src, dst, append=True, replace_changed=True, **OPTS)["append"]
    assert (a["replaced"], a["new_samples"]) == (1, 1)
    ds = Dataset(dst)
    assert len(ds) == 8 and ds.fields == {"txt": {"type": "str"}}
    assert ds.sample(slot)["txt"] == "replaced"
    assert np.array_equal(ds.sample(slot)["image"], ds[_index_of(ds, f"class_00/{names[5]}")][0])
    assert sorted(ds.sample(i)["txt"] for i in range(8)) == sorted(
        ["replaced"] + [f"caption {k}" for k in range(8) if k != 3])
