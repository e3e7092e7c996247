"""A cold epoch 0 whose data set fits cache_limit: records land in place in a growing shard
file (reader/remote/growing.py), readers map it like a local shard, and the finished file is
the assembled shard of later epochs. Real SeaweedFS, real processes."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from dlpack_io.reader import Loader, Output, RandomHorizontalFlip, RandomResizedCrop
from dlpack_io.reader.dataset import Dataset

from helpers import batches_equal, pack_and_upload

URL = "s3://dlpack-test/growing/base"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    return pack_and_upload(tmp_path_factory.mktemp("growing"), URL, s3_server.env(), count=40,
                           classes=3, seed=5, size=(48, 64))


def _epoch(ds, epoch=0, **kw):
    loader = Loader(ds, batch_size=8, seed=3, transforms=[RandomResizedCrop(24),
                                                          RandomHorizontalFlip()],
                    output=Output(return_index=True), num_workers=2, **kw)
    loader.set_epoch(epoch)
    out = [(idx.copy(), images.clone(), labels.clone()) for images, labels, idx in loader]
    loader.close()
    return out


def _layout(ds) -> list[str]:
    names = os.listdir(ds._remote.keeper.dir)
    return sorted(n for n in names if n != ".ledger" and not n.endswith(".ok"))


def _assembled(ds) -> list[str]:
    return sorted(f"{k}.shard" for k in range(len(ds.shards)))


def _ledger(ds) -> int:
    with open(ds._remote.keeper.ledger, "rb") as f:
        return int(f.read())


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_epoch_0_lands_in_place_equals_local_and_writes_no_record_file(s3_env, packed, kind):
    local, remote = Dataset(packed), Dataset(URL)
    batches_equal(_epoch(local, worker_kind=kind), _epoch(remote, worker_kind=kind))
    assert _layout(remote) == _assembled(remote)  # no .grow, no folder of record files left
    assert remote._remote.whole.assembled == len(remote.shards)
    assert _ledger(remote) == sum(int(s["bytes"]) for s in remote._remote.manifest["shards"])
    sessions = os.path.join(remote._remote.cache.root, "sessions")
    assert not any(files for _, _, files in os.walk(sessions) if
                   any(f.isdigit() for f in files))  # nothing published record by record
    fetched = remote._remote.bytes_fetched
    batches_equal(_epoch(local, 1, worker_kind=kind), _epoch(remote, 1, worker_kind=kind))
    assert remote._remote.bytes_fetched == fetched  # epoch 1 from the assembled shards


def test_shard_local_batches_of_a_set_that_fits_grow_in_place_and_whole_shards_otherwise(
        s3_env, packed, tmp_path):
    """Batches that each read one shard (block shuffle) used to fetch whole shards, every
    record waiting for its shard's last byte; a data set that fits cache_limit is all kept
    instead, its shards grown in place (records readable as their ranges land, received
    straight into the file). One that does not fit still fetches whole shards."""
    remote = Dataset(URL, cache_dir=tmp_path / "fits")
    source = remote._remote
    batches = [np.arange(source.first_sample(k), source.first_sample(k) + len(shard.index))
               for k, shard in enumerate(source.shards)]
    assert len(batches) >= 3
    prefetch = remote.start_prefetch(batches)
    assert prefetch._planner.plan.mode == "records" and prefetch._planner.grow is not None
    for k in range(len(batches)):
        prefetch.wait(k, timeout=60)
        prefetch.release(k)
    prefetch.close()
    assert _layout(remote) == _assembled(remote)  # grown in place, assembled
    batches_equal(_epoch(Dataset(packed), 1), _epoch(remote, 1))
    record_bytes = int(source.lengths.sum())
    small = Dataset(URL, cache_dir=tmp_path / "small", cache_limit=record_bytes - 1)
    prefetch = small.start_prefetch(batches)
    assert prefetch._planner.plan.mode == "shards"
    prefetch.close()


def test_a_tampered_byte_in_a_fetched_range_is_caught_and_refetched(s3_env, packed, caplog,
                                                                   monkeypatch):
    monkeypatch.setenv("DLPACK_DIRECT_RECEIVE", "0")  # the client's way (test_s3_receive.py:
    remote = Dataset(URL)  # the same byte received directly)
    store, calls = remote._remote.store, []
    real = store.aget_range

    async def tampered(name, start, end, **kw):
        data = bytearray(await real(name, start, end, **kw))
        calls.append((name, start, end))
        if len(calls) == 1 and end - start > 1000:  # the first range request: one byte flipped
            data[len(data) // 2] ^= 0xFF
        return memoryview(bytes(data))
    store.aget_range = tampered
    with caplog.at_level(logging.WARNING):
        batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    assert "checksum mismatch in the downloaded bytes" in caplog.text
    assert "fetching bytes" in caplog.text
    assert calls.count(calls[0]) == 2  # the same range, fetched once more
    assert _layout(remote) == _assembled(remote)


def test_a_run_killed_mid_epoch_leaves_a_cache_the_next_run_repairs(s3_env, packed, tmp_path,
                                                                    caplog):
    """The first run stops after batch 0 (as if killed: its growing files stay half full);
    one record marked present is then damaged on disk. The next run joins the files, checks
    what it did not write, refetches the damaged record and finishes every shard."""
    cache = tmp_path / "cache"
    first = Dataset(URL, cache_dir=cache)
    prefetch = first.start_prefetch([np.arange(0, 8)], mode="records")  # shard 0 has 10
    prefetch.wait(0)
    grow = first._remote.growing
    k, j = first._remote.locate(3)
    path = grow.path(k)
    prefetch.close()
    assert os.path.exists(path) and os.path.exists(path + ".map")
    with open(path + ".map", "rb") as f:
        assert f.read()[j] == 1
    at = int(first.shards[k].index[j]["offset"]) + 5
    with open(path, "r+b") as f:  # a byte of a record marked present
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    again = Dataset(URL, cache_dir=cache)
    with caplog.at_level(logging.WARNING):
        batches_equal(_epoch(Dataset(packed)), _epoch(again))
    assert f"record {j} of shard {k} fails its checksum" in caplog.text
    assert _layout(again) == _assembled(again)
    assert _ledger(again) == sum(int(s["bytes"]) for s in again._remote.manifest["shards"])


def _digest(ds) -> str:
    """keep_child.py's digest of epoch 0, for the local data set."""
    digest = hashlib.sha256()
    loader = Loader(ds, batch_size=8, seed=3, rank=0, world_size=1, num_workers=2,
                    transforms=[RandomResizedCrop(24)], output=Output(return_index=True))
    for images, labels, idx in loader:
        digest.update(images.numpy().tobytes() + labels.numpy().tobytes() + idx.tobytes())
    loader.close()
    return digest.hexdigest()


def test_two_processes_fill_one_cache_at_once(s3_env, packed, tmp_path):
    """Two whole-epoch runs start together on one cache_dir: both deliver the local data
    set's batches; every shard ends assembled once, counted once on the ledger."""
    cache, script = tmp_path / "shared", os.path.join(os.path.dirname(__file__), "keep_child.py")
    procs = [subprocess.Popen([sys.executable, script, URL, str(cache), "0", "1",
                               str(tmp_path / f"start{i}"), str(tmp_path / f"start{1 - i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in (0, 1)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        reports.append(json.loads(out.splitlines()[-1]))
    assert reports[0]["digest"] == reports[1]["digest"] == _digest(Dataset(packed))
    remote = Dataset(URL, cache_dir=cache)
    assert _layout(remote) == _assembled(remote)
    assert _ledger(remote) == sum(int(s["bytes"]) for s in remote._remote.manifest["shards"])


def test_ranges_pass_over_fetched_records_fewer_requests(s3_env, packed, tmp_path):
    """One rank reading every record, cold: batch 0 record by record (its first batch stays
    fast), later batches in runs that go on over the records fetched before them. The
    planning is a pure function of the order, so the counts are exact."""
    order = np.random.default_rng(0).permutation(40)
    batches = [order[i:i + 8] for i in range(0, 40, 8)]
    counts = {}
    for bridge in (False, True):
        ds = Dataset(URL, cache_dir=tmp_path / f"cache-{bridge}")
        ds._remote.fetch_options["fill_bytes"] = 0  # batch by batch (the fill: next test)
        if not bridge:  # as before: a run ends at the first record fetched already
            ds._remote.fetch_options["bridge_gap"] = 0
        prefetch = ds.start_prefetch(batches, mode="records")
        for k in range(len(batches)):
            prefetch.wait(k)
        counts[bridge] = (prefetch.stats["requests"], prefetch.stats["bytes_fetched"])
        prefetch.close()
    assert counts == {False: (22, 113853), True: (14, 127296)}  # 0.64x the requests


def _fill_counts(ds, batches):
    prefetch = ds.start_prefetch(batches, mode="records")
    for k in range(len(batches)):
        prefetch.wait(k)
    counts = (prefetch.stats["requests"], prefetch.stats["bytes_fetched"])
    prefetch.close()
    return counts


@pytest.mark.parametrize("first", [True, False])
def test_the_fill_fetches_in_few_large_ranges(s3_env, packed, tmp_path, monkeypatch, first):
    """All kept, cold: a small data set (within FILL_FIRST times batch 0's bytes) comes all
    at once in ranges of up to fill_bytes (here 1 MiB: a whole shard), batch 0 with it;
    a larger one (FILL_FIRST 0 here) gets batch 0 record by record, then the rest (passing
    over batch 0's records costs a few bytes). A plan of half the records (one rank of
    two; its records seldom adjoin: one request each) fetches only its own. Exact counts: the planning is a pure function."""
    from dlpack_io.reader.remote import planner

    monkeypatch.setattr(planner, "FILL_FIRST", 8 if first else 0)
    order = np.random.default_rng(0).permutation(40)
    batches = [order[i:i + 8] for i in range(0, 40, 8)]
    half = [b[b % 2 == 0] for b in batches]
    counts = {}
    for name, plan in (("all", batches), ("half", half)):
        ds = Dataset(URL, cache_dir=tmp_path / f"cache-{name}")
        ds._remote.fetch_options["fill_bytes"] = 2**20
        counts[name] = _fill_counts(ds, plan)
        assert counts[name][1] >= int(ds._remote.lengths[np.concatenate(plan)].sum())
    assert counts == ({"all": (5, 114413), "half": (20, 56659)} if first else  # batchwise: 14, 22
                      {"all": (11, 127385), "half": (20, 56659)})
    assert counts["half"][1] < counts["all"][1] / 2  # each rank ~1/world of the bytes


def test_finished_shards_close_their_files(s3_env, packed, monkeypatch):
    from dlpack_io.reader.remote import growing

    monkeypatch.setattr(growing, "_CLOSE_AFTER_S", -1.0)  # at once, not 10 s later
    local, remote = Dataset(packed), Dataset(URL)
    batches_equal(_epoch(local), _epoch(remote))
    assert remote._remote.growing._spent == [] and remote._remote.growing._files == {}
    batches_equal(_epoch(local, 1), _epoch(remote, 1))


def test_a_link_planted_where_a_shard_grows_is_not_followed(s3_env, packed, tmp_path, caplog):
    remote = Dataset(URL, cache_dir=tmp_path / "cache")
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    os.symlink(target, remote._remote.growing.path(0))
    with caplog.at_level(logging.WARNING):
        batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    assert target.read_bytes() == b"keep me"  # never written through
    assert "not a regular file of ours" in caplog.text
    assert os.path.exists(remote._remote.whole.path(0))  # kept record by record, assembled
