"""An array field whose records all share a shape says so in the manifest (so the Loader
stacks it): .npy / .cls sidecars found while packing (kept across --resume by the
journal), numeric lists of a JSON Lines file decided before packing."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from dlpack_io.packer import convert, journal
from dlpack_io.packer import fields as fields_mod
from dlpack_io.reader import Dataset, Loader, Output, Resize

from helpers import convert_stopped_at, gone, wait_until

N = 12


def _src(root, odd=None):
    """N images with .npy (3, 2) float32 and .cls of two ints; ``odd``: {k: npy array}."""
    for k in range(N):
        stem = root / f"c{k % 2}" / f"{k:02d}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), 20 * k, np.uint8)).save(f"{stem}.jpg", quality=90)
        np.save(f"{stem}.npy", (odd or {}).get(k, np.full((3, 2), k, np.float32)))
        (root / f"{stem}.cls").write_text(f"{k} {k + 100}\n")
    return root


def test_sidecar_arrays_of_one_shape_are_stated_and_stacked(tmp_path):
    src = _src(tmp_path / "src")
    out = convert(src, tmp_path / "ds", workers=1, progress=False, shard_size="2KB")
    ds = Dataset(tmp_path / "ds")
    assert out["fields"] == ds.fields == {
        "cls": {"type": "array", "dtype": "int64", "ndim": 1, "shape": [2]},
        "npy": {"type": "array", "dtype": "float32", "ndim": 2, "shape": [3, 2]}}
    assert len(ds.shards) >= 3  # the shapes of every shard were merged
    loader = Loader(ds, batch_size=5, fields=("npy", "cls"), transforms=[Resize((4, 4))],
                    num_workers=0, output=Output(return_index=True))
    for npy, cls, idx in loader:
        assert npy.shape == (len(idx), 3, 2) and npy.dtype == torch.float32
        assert cls.shape == (len(idx), 2) and cls.dtype == torch.int64
        assert torch.equal(cls[:, 1] - cls[:, 0], torch.full((len(idx),), 100))
        assert torch.equal(npy[:, 0, 0].long(), cls[:, 0])  # each row its own sample's


def test_one_record_of_another_shape_leaves_the_shape_null(tmp_path):
    src = _src(tmp_path / "src", odd={7: np.zeros((4, 2), np.float32)})
    convert(src, tmp_path / "ds", workers=1, progress=False, shard_size="2KB")
    fields = Dataset(tmp_path / "ds").fields
    assert fields["npy"]["shape"] is None and fields["cls"]["shape"] == [2]
    batch = next(iter(Loader(Dataset(tmp_path / "ds"), batch_size=N, shuffle=False,
                             fields=("npy",), transforms=[Resize((4, 4))], num_workers=0)))
    shapes = [tuple(t.shape) for t in batch[0]]  # a list of tensors, each its own shape
    assert sorted(shapes) == [(3, 2)] * 11 + [(4, 2)]
    # a rejected record's sidecars are not packed: its shape does not count
    (src / "c1" / "07.cls").write_text("7 x")
    convert(src, tmp_path / "ds2", workers=1, progress=False, shard_size="2KB")
    again = Dataset(tmp_path / "ds2")
    assert len(again) == N - 1 and again.fields["npy"]["shape"] == [3, 2]


OPTIONS = ["--shard-size", "2KB", "--workers", "1", "--quiet", "--no-shuffle"]


def test_resume_merges_the_journaled_shapes_and_an_old_journal_claims_none(tmp_path):
    src = _src(tmp_path / "src", odd={0: np.zeros((1, 2), np.float32)})
    dst = tmp_path / "ds"
    children = convert_stopped_at("journal:2", [src, dst, *OPTIONS])
    wait_until(lambda: all(gone(pid) for pid in children), what="the killed run's workers")
    _, done = journal.read_journal(dst)
    assert done[0]["shapes"] == {"cls": [2], "npy": None}  # sample 0 is in the first shard
    out = convert(src, dst, resume=True, workers=1, progress=False, shard_size="2KB",
                  shuffle=False)
    assert out["resumed_from"] > 0 and Dataset(dst).fields["npy"]["shape"] is None
    assert Dataset(dst).fields["cls"]["shape"] == [2]
    # the same shapes with sample 0 fine, but the journal written by an older dlpack
    src2 = _src(tmp_path / "src2")
    dst2 = tmp_path / "ds2"
    children = convert_stopped_at("journal:2", [src2, dst2, *OPTIONS])
    wait_until(lambda: all(gone(pid) for pid in children), what="the killed run's workers")
    lines = [json.loads(x) for x in (dst2 / journal.JOURNAL_NAME).read_text().splitlines()]
    for line in lines:
        line.pop("shapes", None)
    (dst2 / journal.JOURNAL_NAME).write_text(
        "".join(json.dumps(journal.seal(journal.unseal(e)) if "shard" in e else e,
                           sort_keys=True) + "\n" for e in lines))
    out = convert(src2, dst2, resume=True, workers=1, progress=False, shard_size="2KB",
                  shuffle=False)
    assert out["resumed_from"] > 0
    assert Dataset(dst2).fields["npy"]["shape"] is None  # unknown: nothing claimed


@pytest.mark.parametrize("value", [None, [1, 2], {"a": [True]}, {"a": [-1]}, {"a": [2**32]},
                                   {"a": "3"}, {1: [2]}])
def test_malformed_journaled_shapes_claim_nothing(value):
    assert fields_mod.journaled_shapes(value) is None
    assert fields_mod.journaled_shapes({"a": [0, 3], "b": None}) == {"a": [0, 3], "b": None}
    assert fields_mod.settle_shapes({"a": {"type": "array", "dtype": "uint8", "ndim": 1}}, None) == \
        {"a": {"type": "array", "dtype": "uint8", "ndim": 1, "shape": None}}


def test_jsonl_numeric_lists_of_one_shape_become_arrays(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rows = []
    for k in range(4):
        Image.fromarray(np.full((8, 8, 3), 30 * k, np.uint8)).save(src / f"{k}.jpg")
        rows.append({"path": f"{k}.jpg", "ids": [k, -k, 2**40], "box": [[k, 0.5, 1, 2]],
                     "ragged": [1] * (k + 1), "flags": [True, k], "huge": [2**63, k],
                     "mixed": [0.5, 2**60], "empty": [], "deep": [[k], [k, 1]],
                     "boxes": [[0, 0, 4, 4]]})  # one box on every line: still a target
    listing = tmp_path / "list.jsonl"
    listing.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convert(src, tmp_path / "ds", list_file=listing, workers=1, progress=False, shuffle=False)
    ds = Dataset(tmp_path / "ds")
    assert ds.fields["ids"] == {"type": "array", "dtype": "int64", "ndim": 1, "shape": [3]}
    assert ds.fields["box"] == {"type": "array", "dtype": "float64", "ndim": 2, "shape": [1, 4]}
    assert ds.fields["boxes"]["shape"] is None and ds.fields["boxes"]["dtype"] == "float32"
    assert {n for n, s in ds.fields.items() if s["type"] == "json"} == {
        "ragged", "flags", "huge", "mixed", "empty", "deep"}  # each kept exactly as written
    s = ds.sample(3)
    assert s["ids"].tolist() == [3, -3, 2**40] and s["box"].tolist() == [[3.0, 0.5, 1.0, 2.0]]
    assert s["huge"] == [2**63, 3] and s["mixed"] == [0.5, 2**60] and s["deep"] == [[3], [3, 1]]
    ids, box = next(iter(Loader(ds, batch_size=4, shuffle=False, fields=("ids", "box"),
                                transforms=[Resize((4, 4))], num_workers=0)))
    assert ids.shape == (4, 3) and ids.dtype == torch.int64 and ids[:, 0].tolist() == [0, 1, 2, 3]
    assert box.shape == (4, 1, 4) and box.dtype == torch.float64


def test_append_keeps_a_shape_only_where_old_and_new_records_agree(tmp_path):
    src = _src(tmp_path / "src")
    convert(src, tmp_path / "ds", workers=1, progress=False, shard_size="2KB")
    assert Dataset(tmp_path / "ds").fields["npy"]["shape"] == [3, 2]
    for k, npy in ((20, np.full((3, 2), 20, np.float32)), (21, np.zeros((5, 2), np.float32))):
        stem = src / "c0" / f"{k:02d}"
        Image.fromarray(np.full((8, 8, 3), k, np.uint8)).save(f"{stem}.jpg", quality=90)
        np.save(f"{stem}.npy", npy)
        (src / f"{stem}.cls").write_text(f"{k} {k + 100}\n")
    out = convert(src, tmp_path / "ds", append=True, workers=1, progress=False)  # not refused
    fields = Dataset(tmp_path / "ds").fields
    assert out["append"]["inputs"] >= 2 and len(Dataset(tmp_path / "ds")) == N + 2
    assert fields["npy"]["shape"] is None and fields["cls"]["shape"] == [2]
