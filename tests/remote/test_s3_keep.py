"""What epoch 0 fetched stays in cache_dir: later epochs and later runs fetch ~nothing,
a changed data set is never served stale, tampered files are refetched, a cache_limit
smaller than the data set keeps what fits, and processes share one cache_dir safely
(real SeaweedFS, real processes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dlpack_io.reader import Loader, Output, RandomHorizontalFlip, RandomResizedCrop, Workers
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.remote import fetchplan, keep

from helpers import batches_equal, pack_and_upload

URL = "s3://dlpack-test/keep/base"


def _pack(root, url, env, seed):
    return pack_and_upload(root, url, env, count=40, classes=3, seed=seed, size=(48, 64))


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    return _pack(tmp_path_factory.mktemp("keep"), URL, s3_server.env(), seed=21)


def _epoch(ds, epoch, batch_size=8, **kw):
    loader = Loader(ds, batch_size=batch_size, seed=3, transforms=[RandomResizedCrop(24),
                                                          RandomHorizontalFlip()],
                    output=Output(return_index=True), **kw)
    loader.set_epoch(epoch)
    out = [(idx.copy(), images.clone(), labels.clone()) for images, labels, idx in loader]
    loader.close()
    return out


def _shard_bytes(ds) -> int:
    """Bytes of the data set's shards: what kept records take once assembled."""
    return sum(int(e["bytes"]) for e in ds._remote.manifest["shards"])


def _kept_bytes(ds) -> tuple[int, int]:
    """(bytes on disk, bytes the ledger counts) of the kept records."""
    keeper = ds._remote.keeper
    with open(keeper.ledger, "rb") as f:
        return keep.usage(keeper.dir)[0], int(f.read())


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_later_epochs_fetch_nothing_and_equal_local(s3_env, packed, kind):
    local, remote = Dataset(packed), Dataset(URL)
    total = int(remote._remote.lengths.sum())
    kw = dict(num_workers=2, workers=Workers(kind=kind))
    batches_equal(_epoch(local, 0, **kw), _epoch(remote, 0, **kw))
    first = remote._remote.bytes_fetched
    assert total <= first < 1.15 * total  # coalesced ranges may span small gaps
    whole = _shard_bytes(remote)  # every shard kept whole: assembled into one file each
    assert _kept_bytes(remote) == (whole, whole)
    assert _layout(remote) == sorted(f"{k}.shard" for k in range(len(remote.shards)))
    for epoch in (1, 2):
        batches_equal(_epoch(local, epoch, **kw), _epoch(remote, epoch, **kw))
    assert remote._remote.bytes_fetched == first  # epochs 1 and 2: not one byte
    for k, shard in enumerate(remote.shards):  # read through the mapped file, as local
        assert bytes(shard.file_view()) == open(local.shards[k].path, "rb").read()


def _layout(ds) -> list[str]:
    """What the kept-records folder holds, less the ledger and the stamps."""
    names = os.listdir(ds._remote.keeper.dir)
    return sorted(n for n in names if n != ".ledger" and not n.endswith(".ok"))


def _child(cache_dir, *args) -> dict:
    """Run tests/remote/keep_child.py in a new process; its JSON report."""
    script = os.path.join(os.path.dirname(__file__), "keep_child.py")
    out = subprocess.run([sys.executable, script, URL, str(cache_dir), *map(str, args)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_a_second_process_reads_what_the_first_kept(s3_env, packed, tmp_path):
    cache = tmp_path / "shared"
    first = _child(cache, 0, 1)
    second = _child(cache, 0, 1)
    assert first["fetched"] > 0 and second["fetched"] == 0
    assert second["digest"] == first["digest"]  # the same batches, from the cache
    assert second["assembled"] == 0 and first["assembled"] == len(Dataset(URL).shards)


def test_ranks_of_one_node_fill_one_cache_together(s3_env, packed, tmp_path):
    """Two ranks run at the same time (each waits for the other's start file): each
    fetches its half into the same growing shard files (growing.py), which end assembled,
    the ledger counts every byte once, and a later single-rank run fetches nothing."""
    cache, script = tmp_path / "shared", os.path.join(os.path.dirname(__file__), "keep_child.py")
    procs = [subprocess.Popen([sys.executable, script, URL, str(cache), str(rank), "2",
                               str(tmp_path / f"start{rank}"), str(tmp_path / f"start{1 - rank}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        reports.append(json.loads(out.splitlines()[-1]))
    remote = Dataset(URL, cache_dir=cache)
    whole = _shard_bytes(remote)
    assert all(r["fetched"] > 0 for r in reports)
    assert _kept_bytes(remote) == (whole, whole)  # counted once, though written by two
    assert _layout(remote) == sorted(f"{k}.shard" for k in range(len(remote.shards)))
    assert _child(cache, 0, 1)["fetched"] == 0


def test_a_changed_data_set_is_never_served_stale(s3_env, tmp_path):
    url = "s3://dlpack-test/keep/changing"
    old = _pack(tmp_path / "old", url, s3_env.env(), seed=1)
    ds = Dataset(url)
    batches_equal(_epoch(Dataset(old), 0), _epoch(ds, 0))
    new = _pack(tmp_path / "new", url, s3_env.env(), seed=2)  # same URL, other photos
    again = Dataset(url)
    assert again._remote.key != ds._remote.key
    batches_equal(_epoch(Dataset(new), 0), _epoch(again, 0))
    assert again._remote.bytes_fetched >= int(again._remote.lengths.sum())


@pytest.mark.parametrize("reopen, how", [(False, "bytes"), (True, "bytes"), (False, "short"),
                                         (True, "mtime set back"), (False, "mtime set back")])
def test_a_tampered_assembled_shard_is_detected_and_rebuilt(s3_env, packed, caplog, reopen,
                                                           how):
    local, remote = Dataset(packed), Dataset(URL)
    _epoch(remote, 0)
    path = remote._remote.whole.path(1)
    entry = remote.shards[1].index[2]
    st = os.stat(path)
    with open(path, "r+b") as f:  # same size, other bytes: only the checksum can tell
        f.seek(int(entry["offset"]))
        f.write(bytes(int(entry["length"])))
        if how == "short":  # or cut short by one byte (of its metadata, not of a record)
            f.truncate(os.path.getsize(path) - 1)
    if how == "mtime set back":  # inode, size and mtime as stamped: only the ctime tells
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    if reopen:
        remote = Dataset(URL)
    before = remote._remote.bytes_fetched
    with caplog.at_level("WARNING"):
        batches_equal(_epoch(local, 1), _epoch(remote, 1))
    why = " bytes, the shard has " if how == "short" else "record 2 fails its checksum"
    assert why in caplog.text and path in caplog.text
    records = int(remote.shards[1].index["length"].sum())  # that shard's, and only them
    assert records <= remote._remote.bytes_fetched - before < 1.15 * records
    whole = _shard_bytes(remote)
    assert _kept_bytes(remote) == (whole, whole)  # assembled again, counted once
    assert open(path, "rb").read() == open(local.shards[1].path, "rb").read()


def test_a_later_run_checks_the_assembled_shards_once_and_fetches_nothing(s3_env, packed,
                                                                           monkeypatch):
    """The process that assembled the shards maps them unread (it wrote them); a later run
    did not, and nothing on disk can vouch for them, so it checks each one's CRCs once (no
    byte fetched), then maps it unread for the rest of the run."""
    from dlpack_io.reader.remote import assembled

    local = Dataset(packed)
    first = Dataset(URL)
    _epoch(first, 0)
    checked = []
    real = assembled._first_bad
    monkeypatch.setattr(assembled, "_first_bad", lambda fd, shard: checked.append(1) or
                        real(fd, shard))
    batches_equal(_epoch(local, 1), _epoch(first, 1))
    assert checked == []
    remote = Dataset(URL)
    batches_equal(_epoch(local, 1), _epoch(remote, 1))
    assert len(checked) == len(remote.shards) and remote._remote.bytes_fetched == 0
    batches_equal(_epoch(local, 2), _epoch(remote, 2))
    assert len(checked) == len(remote.shards)


def test_a_limit_below_the_data_set_keeps_what_fits(s3_env, packed):
    """Batches of one record, so the room for ROOM_BATCHES batches is small next to the
    data set: the limit leaves room for about a third of the records to stay."""
    lengths = Dataset(URL)._remote.lengths
    total, room = int(lengths.sum()), keep.ROOM_BATCHES * int(lengths.max())
    limit = room + total // 3
    remote = Dataset(URL, cache_limit=limit, fetch_mode="records")  # one shard per batch
    _epoch(remote, 0, batch_size=1)
    on_disk, counted = _kept_bytes(remote)
    budget = keep.keep_budget(total, limit, int(lengths.max()))
    assert budget == (total // 3 if room <= limit // 2 else limit - limit // 2)
    assert on_disk == counted and budget - int(lengths.max()) < counted <= budget
    before = remote._remote.bytes_fetched
    _epoch(remote, 1, batch_size=1)
    again = remote._remote.bytes_fetched - before
    assert again == total - counted  # one record per batch: exactly what was not kept
    assert _kept_bytes(remote) == (on_disk, counted)  # kept files stay, none churned
    session = remote._remote.session.dir  # the rest was evicted after use
    assert [f for _, _, fs in os.walk(session) for f in fs if f != ".lock"] == []


def test_a_limit_of_half_the_data_set_keeps_half_of_it(s3_env, packed):
    """Batches of 2: room for ROOM_BATCHES of them is more than the whole data set, so the
    rule "limit less 16 batches" kept nothing; half the limit stays instead, and epoch 1
    fetches the records that did not stay (and the padding between neighbours)."""
    lengths = Dataset(URL)._remote.lengths
    total, batch = int(lengths.sum()), int(np.sort(lengths)[-2:].sum())
    limit = total // 2
    assert keep.ROOM_BATCHES * batch > limit and limit // 2 > 2 * batch  # old rule: 0 kept
    remote = Dataset(URL, cache_limit=limit, fetch_mode="records")
    _epoch(remote, 0, batch_size=2)
    on_disk, counted = _kept_bytes(remote)
    budget = limit - limit // 2
    assert on_disk == counted and budget - int(lengths.max()) < counted <= budget
    before = remote._remote.bytes_fetched
    _epoch(remote, 1, batch_size=2)
    again = remote._remote.bytes_fetched - before  # the rest; neighbours of a batch come
    assert total - counted <= again < 1.02 * (total - counted)  # in one range (+ padding)


def test_read_ahead_takes_the_following_eligible_records_within_the_bytes():
    lengths = np.array([10, 10, 10, 10, 10, 10, 10, 10])
    eligible = np.array([0, 1, 1, 0, 1, 1, 1, 1], dtype=bool)
    todo, pos = fetchplan.read_ahead(np.array([0, 4]), np.array([3, 1]), eligible, lengths,
                                np.array([4, 8]), max_bytes=30)
    # 0 takes 1, 2 (3 not eligible); 4 takes 5, 6 (30 bytes in all), never past its shard
    assert todo.tolist() == [0, 4, 1, 2, 5, 6] and pos.tolist() == [3, 1, 3, 3, 1, 1]
    todo, pos = fetchplan.read_ahead(np.array([2]), np.array([0]), eligible, lengths,
                                np.array([4]), max_bytes=100)
    assert todo.tolist() == [2] and pos.tolist() == [0]  # shard ends at 4; 3 not eligible


def test_the_same_damaged_kept_file_found_twice_leaves_the_ledger_once(s3_env, packed, tmp_path):
    """A reader thread and the planner may both find one tampered record: its bytes come
    off the ledger once, by whichever call removed the file."""
    keeper = Dataset(URL, cache_dir=str(tmp_path / "cache"))._remote.keeper
    data = b"x" * 1000
    assert keeper.admit([len(data)] * 2, 10**9) == [True, True]
    assert keeper.publish(0, 0, 0, data) and keeper.publish(1, 0, 1, data)
    path = keeper.path(0, 0)
    before = keeper.recount()
    keeper.discard(path, len(data), "test: damaged")
    keeper.discard(path, len(data), "test: damaged")  # the second finder: already gone
    assert not os.path.exists(path)
    ledger = int(open(keeper.ledger, "rb").read())
    assert ledger == before - len(data) == keeper.recount() == len(data)


def test_replacing_a_kept_file_takes_its_real_size_off_the_ledger(s3_env, packed, tmp_path):
    """A file already at the place (edited locally, or another process's copy) is replaced
    by the verified record: the ledger loses what that file counted, not the new length."""
    keeper = Dataset(URL, cache_dir=str(tmp_path / "cache"))._remote.keeper
    data = b"x" * 1000
    assert keeper.admit([len(data)], 10**9) == [True] and keeper.publish(0, 0, 0, data)
    path = keeper.path(0, 0)
    os.truncate(path, 300)  # edited locally; the ledger, lost too, is counted again
    os.unlink(keeper.ledger)
    assert keeper.admit([len(data)], 10**9) == [True]
    assert int(open(keeper.ledger, "rb").read()) == 300 + len(data)
    assert keeper.publish(0, 0, 0, data)
    assert os.path.getsize(path) == len(data)
    assert int(open(keeper.ledger, "rb").read()) == keeper.recount() == len(data)


def test_read_ahead_passes_over_records_already_fetched_when_all_are_ours():
    lengths = np.full(8, 10)
    absent = np.array([1, 1, 0, 1, 1, 1, 0, 1], dtype=bool)  # 2 and 6 fetched already
    last_use = np.array([1, 1, 0, 2, 3, 1, 0, 2])
    eligible, passable = fetchplan.ahead_masks(absent, last_use, 1, bridge=True)
    assert eligible.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    assert passable.tolist() == [1, 1, 1, 0, 0, 1, 1, 0]  # fetched, or for batch <= 1
    todo, pos = fetchplan.read_ahead(np.array([1]), np.array([0]), eligible, lengths,
                                np.array([8]), max_bytes=70, passable=passable)
    assert todo.tolist() == [1, 3, 4, 7] and pos.tolist() == [0, 0, 0, 0]  # over 2, 5, 6
    assert fetchplan.ahead_masks(absent, last_use, 1, bridge=False)[1] is None
    todo, _ = fetchplan.read_ahead(np.array([1]), np.array([0]), eligible, lengths,
                              np.array([8]), max_bytes=70)
    assert todo.tolist() == [1]  # without passing: 2 ends the run
