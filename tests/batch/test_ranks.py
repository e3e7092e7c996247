"""Many ranks: equal batch counts, rank/world size from torch.distributed or torchrun,
resume at epoch boundaries, and elastic resume on another number of ranks."""
import itertools
import logging

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Loader, Output, RandomCrop
from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch import resume

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("ranks"), 50, 5, seed=8,
                             shard_size="40KB")["raw"]


def _parts(n, world, bs, drop_last, sequence=None):
    seq = np.arange(n) if sequence is None else sequence
    return [order_mod.rank_part(seq, r, world, bs, drop_last) for r in range(world)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_rank_yields_the_same_number_of_batches(drop_last):
    for n, world, bs in itertools.product([0, 1, 7, 10, 97, 100, 1000], [1, 2, 3, 4, 7],
                                          [1, 2, 3, 8, 111]):
        parts = _parts(n, world, bs, drop_last)
        counts = {len(bounds) - 1 for _, bounds in parts}
        assert len(counts) == 1, (n, world, bs, counts)
        batches = [part[b[k]:b[k + 1]] for part, b in parts for k in range(len(b) - 1)]
        seen = np.concatenate(batches) if batches else np.array([], int)
        assert len(np.unique(seen)) == len(seen)  # disjoint
        assert all(len(b) <= bs for b in batches)
        if drop_last:
            assert all(len(b) == bs for b in batches)
            assert len(seen) == world * (n // world // bs * bs)
        else:
            assert sorted(seen) == list(range(n))  # exactly the epoch


def test_the_case_that_hung_ddp_has_equal_counts():
    """1,000 samples, batch 111, 3 ranks: was 3, 3 and 4 batches."""
    parts = _parts(1000, 3, 111, False)
    sizes = [np.diff(bounds).tolist() for _, bounds in parts]
    assert sizes == [[111, 111, 56, 55], [111, 111, 56, 55], [111, 111, 111, 1]]


def test_rank_and_world_size_come_from_torchrun_env(raw, monkeypatch, caplog):
    ds = Dataset(raw)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = Loader(ds, batch_size=4, transforms=[RandomCrop(20)], output=Output(return_index=True))
    assert (loader.rank, loader.world_size) == (1, 2)
    mine = np.concatenate([i for _, _, i in loader])
    assert np.array_equal(mine, loader.indices(0))
    monkeypatch.setenv("RANK", "0")  # e.g. the process group came up with another layout
    loader.set_epoch(0)  # the same epoch again (iterating on would read epoch 1)
    with caplog.at_level(logging.WARNING, logger="dlpack_io.reader.batch.loader"):
        other = np.concatenate([i for _, _, i in loader])
    assert "rank/world_size changed from 1/2" in caplog.text
    assert not set(other) & set(mine) and len(other) + len(mine) == 50


def test_state_after_the_last_batch_starts_the_next_epoch(raw):
    ds = Dataset(raw)
    loader = Loader(ds, batch_size=8, transforms=[RandomCrop(20)])
    loader.set_epoch(4)
    assert len(list(loader)) == 7
    state = loader.state_dict()
    assert state["epoch"] == 5 and state["segments"] == []
    again = Loader(ds, batch_size=8, transforms=[RandomCrop(20)])
    again.load_state_dict(state)
    assert again.epoch == 5 and len(again) == 7


def test_len_after_restore_is_what_is_left(raw):
    ds = Dataset(raw)
    a = Loader(ds, batch_size=8, transforms=[RandomCrop(20)])
    for k, _ in enumerate(a):
        if k == 2:
            break
    b = Loader(ds, batch_size=8, transforms=[RandomCrop(20)])
    b.load_state_dict(a.state_dict())
    assert len(b) == 4 and len(list(b)) == 4
    assert len(b) == 7  # the next iteration is a whole epoch again


def _consume(loaders, batches):
    """Step every rank's loader ``batches`` times in lockstep; the indices seen."""
    its = [iter(loader) for loader in loaders]
    seen = []
    for _ in range(batches):
        for it in its:
            seen.append(next(it)[2].copy())
    for it in its:
        it.close()
    return seen


@pytest.mark.parametrize("before,after,consumed", [(2, 3, 2), (4, 2, 1), (3, 3, 1), (2, 5, 2)])
def test_elastic_resume_reads_each_remaining_sample_once(raw, before, after, consumed):
    ds = Dataset(raw)
    kw = dict(batch_size=4, transforms=[RandomCrop(20)], return_index=True, seed=6)
    old = [Loader(ds, rank=r, world_size=before, **kw) for r in range(before)]
    for loader in old:
        loader.set_epoch(1)
    seen = _consume(old, consumed)
    states = [loader.state_dict() for loader in old]
    assert all(s == states[0] for s in states)  # one state for the whole job
    new = [Loader(ds, rank=r, world_size=after, **kw) for r in range(after)]
    for loader in new:
        loader.load_state_dict(states[0])
    rest = [i for loader in new for _, _, i in loader]
    done = np.concatenate(seen)
    left = np.concatenate(rest) if rest else np.array([], int)
    assert not set(done) & set(left)  # nothing consumed is read again
    assert sorted(np.concatenate([done, left])) == list(range(50))  # all, exactly once
    counts = {len(loader) for loader in new}
    assert len(counts) == 1  # the new ranks also yield equal batch counts
    for loader in new:  # the next epoch is the normal after-rank order
        loader.set_epoch(2)
        assert np.array_equal(np.concatenate([i for _, _, i in loader]), loader.indices(2))


def test_elastic_resume_chains_and_same_world_resume_is_exact(raw):
    ds = Dataset(raw)
    kw = dict(batch_size=3, transforms=[RandomCrop(20)], return_index=True, seed=2)
    first = [Loader(ds, rank=r, world_size=2, **kw) for r in range(2)]
    seen = _consume(first, 2)
    mid = [Loader(ds, rank=r, world_size=3, **kw) for r in range(3)]
    for loader in mid:
        loader.load_state_dict(first[0].state_dict())
    seen += _consume(mid, 1)
    state = mid[0].state_dict()
    assert [s["world_size"] for s in state["segments"]] == [2, 3]
    same = [Loader(ds, rank=r, world_size=3, **kw) for r in range(3)]
    for loader in same:
        loader.load_state_dict(state)
    uninterrupted = [Loader(ds, rank=r, world_size=3, **kw) for r in range(3)]
    for loader in uninterrupted:
        loader.load_state_dict(first[0].state_dict())
    full = [[i for _, _, i in loader] for loader in uninterrupted]
    tail = [[i for _, _, i in loader] for loader in same]
    for r in range(3):  # resuming with the same settings continues each rank exactly
        assert all(np.array_equal(a, b) for a, b in zip(full[r][1:], tail[r]))
    everything = np.concatenate(seen + [i for t in tail for i in t])
    assert sorted(everything) == list(range(50))


def test_remaining_is_a_pure_function_of_segments():
    seq = np.arange(20)[::-1].copy()
    seg = resume.Segment(world_size=2, batch_size=3, drop_last=False, batches=2)
    left = resume.remaining(seq, [seg])
    # rank 0 read seq[0:6], rank 1 seq[10:16]
    assert left.tolist() == seq[6:10].tolist() + seq[16:20].tolist()
