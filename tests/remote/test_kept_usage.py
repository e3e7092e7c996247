"""Counting the kept records on disk while another process removes some of them
(``dlpack cache clear``): what vanished between the listing and the look counts nothing."""
from __future__ import annotations

import os
import shutil

from dlpack_io.reader.remote.keep import usage, usage_of


def _kept(root, files: dict) -> None:
    for rel, size in files.items():
        os.makedirs(os.path.dirname(root / rel), exist_ok=True)
        (root / rel).write_bytes(b"r" * size)


def test_entries_removed_after_the_listing_are_skipped(tmp_path):
    _kept(tmp_path, {"0/0": 10, "0/1": 20, "3/0": 5, "3/2": 7, "12.shard": 40})
    (tmp_path / "0" / ".tmp-1-ab").write_bytes(b"t" * 99)  # a temporary file: not counted
    os.symlink(tmp_path / "0" / "1", tmp_path / "0" / "5")  # a link: not counted
    assert usage(str(tmp_path)) == (10 + 20 + 5 + 7 + 40, 4)  # 12.shard: no valid header, 0
    names = os.listdir(tmp_path)
    shutil.rmtree(tmp_path / "3")  # removed by another process after the listing
    os.unlink(tmp_path / "12.shard")
    assert usage_of(str(tmp_path), names) == (30, 2)
    shutil.rmtree(tmp_path / "0")
    assert usage_of(str(tmp_path), names) == (0, 0)
    assert usage(str(tmp_path / "gone")) == (0, 0)


def test_a_growing_shard_counts_its_size_and_no_records(tmp_path):
    _kept(tmp_path, {"0/0": 10, "2.grow": 300, "2.grow.map": 4, "x.grow": 50})
    os.symlink(tmp_path / "2.grow", tmp_path / "3.grow")  # a link: not counted
    assert usage(str(tmp_path)) == (10 + 300, 1)


def test_an_assembled_shard_counts_once(tmp_path):
    """<4>.shard beside its <4>.grow (the same file, a second name for a moment) and its
    record files (being removed): counted once, as the ledger counts it."""
    _kept(tmp_path, {"4.shard": 60, "4/0": 10, "4/1": 20, "5/0": 7})
    os.link(tmp_path / "4.shard", tmp_path / "4.grow")
    assert usage(str(tmp_path))[0] == 60 + 7
