"""Appends of a ``--list`` that names one path on two lines (packer/appendbase.py,
appendbase.split_inputs): a changed path replaces each of its records once, never one
twice (two pairs retiring one record made a manifest every reader refuses) and none left
stale (a path packed from two lines had only its last record replaced), and a plain
append whose list repeats a path with one line rejected packs as a fresh conversion does
(it failed at the end: 'cannot tell which record replaces which')."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from dlpack_io.packer import convert
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.tools.synth import make_image_folder
from dlpack_io.tools.verification import verify

OPTS = dict(shard_size="40KB", workers=1, progress=False)


def _src(tmp_path):
    src = tmp_path / "src"
    make_image_folder(src, 4, 1, seed=2, size=(40, 48))
    return src, [f"class_00/{n}" for n in sorted(os.listdir(src / "class_00"))]


def _list(path, lines) -> str:
    path.write_text("".join(f"{p},{label}\n" for p, label in lines))
    return str(path)


def test_a_changed_path_listed_twice_replaces_its_record_once(tmp_path):
    src, names = _src(tmp_path)
    dst = tmp_path / "ds"
    convert(src, dst, list_file=_list(tmp_path / "a.csv", [(names[0], 0), (names[1], 0)]), **OPTS)
    shutil.copy(src / names[3], src / names[1])  # changed: now holds the bytes of names[3]
    twice = _list(tmp_path / "b.csv", [(names[0], 0), (names[1], 0), (names[1], 0)])
    a = convert(src, dst, list_file=twice, append=True, replace_changed=True, **OPTS)["append"]
    assert (a["replaced"], a["new_samples"], a["changed"], a["duplicates"]) == (1, 1, 2, 1)
    m = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert m[fmt.RETIRED_KEY] == [[1, 2]] and m["num_samples"] == 3
    ds = Dataset(dst)
    assert len(ds) == 2 and ds.record_of(1) == 2
    fresh = tmp_path / "fresh"
    convert(src, fresh, list_file=_list(tmp_path / "c.csv", [(names[3], 0)]), **OPTS)
    assert np.array_equal(ds[1][0], Dataset(fresh)[0][0])
    assert verify(dst, progress=False).ok


def test_a_plain_append_of_a_list_repeating_a_path_with_one_line_rejected(tmp_path):
    src, names = _src(tmp_path)
    dst = tmp_path / "ds"
    convert(src, dst, list_file=_list(tmp_path / "a.csv", [(names[0], 0)]), **OPTS)
    lines = [(names[0], 0), (names[1], 0), (names[2], 0), (names[2], 99999999999)]
    r = convert(src, dst, list_file=_list(tmp_path / "b.csv", lines), append=True, **OPTS)
    assert (r["num_samples"], r["append"]["new_samples"], r["append"]["replaced"]) == (3, 2, 0)
    ds = Dataset(dst)
    assert [ds.source(i, relative=True) for i in range(3)] == names[:3]
    assert verify(dst, progress=False).ok


def test_a_replacing_append_that_cannot_pair_its_records_writes_no_manifest(tmp_path):
    src, names = _src(tmp_path)
    dst = tmp_path / "ds"
    convert(src, dst, list_file=_list(tmp_path / "a.csv", [(names[0], 0), (names[1], 0)]), **OPTS)
    before, files = (dst / fmt.MANIFEST_NAME).read_bytes(), os.listdir(dst)
    shutil.copy(src / names[3], src / names[0])  # changed, and a new path named twice:
    lines = [(names[0], 0), (names[2], 0), (names[2], 99999999999)]  # one line rejected
    with pytest.raises(ConversionError, match="cannot tell which record replaces which, so "
                       "no manifest was written and the new shards were removed: a path the "
                       "list names on several lines was rejected on some of them only"):
        convert(src, dst, list_file=_list(tmp_path / "b.csv", lines), append=True,
                replace_changed=True, **OPTS)
    assert (dst / fmt.MANIFEST_NAME).read_bytes() == before and len(Dataset(dst)) == 2
    assert sorted(os.listdir(dst)) == sorted(files)  # no shard, no journal left behind
    fixed = _list(tmp_path / "c.csv", lines[:2])  # a plain append again, no --resume needed
    a = convert(src, dst, list_file=fixed, append=True, replace_changed=True, **OPTS)["append"]
    assert (a["replaced"], a["new_samples"], len(Dataset(dst))) == (1, 2, 3)


def test_a_union_retiring_a_record_twice_is_never_written():
    from dlpack_io.packer.appendbase import with_retired

    union = {"version": 3, "num_samples": 4, "fields": {}}
    assert with_retired(union, {"retired": [[1, 2]]}, [[0, 3]])["retired"] == [[0, 3], [1, 2]]
    with pytest.raises(ConversionError, match=r"the union manifest: retired is not sorted by "
                       r"old record, or retires a record twice.*no manifest was written"):
        with_retired(union, {"retired": [[1, 2]]}, [[1, 3]])


def test_a_path_packed_on_two_lines_has_both_records_replaced(tmp_path):
    src, names = _src(tmp_path)
    dst = tmp_path / "ds"
    lines = [(names[0], 0), (names[0], 0), (names[1], 0)]  # records 0 and 1: one file
    convert(src, dst, list_file=_list(tmp_path / "a.csv", lines), **OPTS)
    before = Dataset(dst)
    mine = [i for i in range(3) if before.source(i, relative=True) == names[0]]
    assert len(mine) == 2
    shutil.copy(src / names[3], src / names[0])
    a = convert(src, dst, list_file=_list(tmp_path / "b.csv", lines), append=True,
                replace_changed=True, **OPTS)["append"]
    assert (a["replaced"], a["new_samples"], a["changed"], a["duplicates"]) == (2, 2, 2, 1)
    ds = Dataset(dst)
    assert ds.manifest[fmt.RETIRED_KEY] == [[mine[0], 3], [mine[1], 4]] and len(ds) == 3
    fresh = tmp_path / "fresh"
    convert(src, fresh, list_file=_list(tmp_path / "c.csv", [(names[3], 0)]), **OPTS)
    new = Dataset(fresh)[0][0]
    assert all(np.array_equal(ds[i][0], new) for i in mine)  # none stale
    (other,) = set(range(3)) - set(mine)
    assert np.array_equal(ds[other][0], before[other][0])
    assert verify(dst, progress=False).ok


def test_on_s3_an_append_that_cannot_pair_its_records_leaves_the_bucket_as_it_was(
        s3_env, tmp_path):
    from dlpack_io.reader.remote.storage import Store

    src, names = _src(tmp_path)
    url = "s3://dlpack-test/replace-lists/pairing"
    convert(src, url, list_file=_list(tmp_path / "a.csv", [(names[0], 0), (names[1], 0)]), **OPTS)
    store = Store(url)
    before = {n: store.get(n) for n in store.list()}
    shutil.copy(src / names[3], src / names[0])
    lines = [(names[0], 0), (names[2], 0), (names[2], 99999999999)]
    with pytest.raises(ConversionError, match="the new shards were removed"):
        convert(src, url, list_file=_list(tmp_path / "b.csv", lines), append=True,
                replace_changed=True, **OPTS)
    after = {n: store.get(n) for n in store.list()}
    assert after == before
    a = convert(src, url, list_file=_list(tmp_path / "c.csv", lines[:2]), append=True,
                replace_changed=True, **OPTS)["append"]
    assert (a["replaced"], a["new_samples"]) == (1, 2)
