"""Epoch order invariants: permutations, disjoint and complete across ranks x workers."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlpack_io.reader.batch import order
from dlpack_io.reader.batch.plan import uniforms
from dlpack_io.reader.transforms.geometry import RandomHorizontalFlip, RandomResizedCrop

# the ops' own random streams (fixed forever: a sample keeps its draws)
STREAM_CROP = RandomResizedCrop.stream
STREAM_FLIP_H = RandomHorizontalFlip.stream


def _all_batches(n, world, batch, drop_last, workers, shuffle="global", sizes=None, epoch=0):
    """Every (rank, worker) share of the epoch, as a list of index arrays."""
    parts = []
    for rank in range(world):
        mine = order.rank_order(n, shuffle=shuffle, seed=3, epoch=epoch, rank=rank,
                                world_size=world, batch_size=batch, drop_last=drop_last,
                                shard_sizes=sizes, block_size=7, window=3)
        total = order.num_batches(len(mine), batch, drop_last)
        for w in range(workers):
            for k in order.worker_batches(total, w, workers):
                parts.append(mine[order.batch_slice(k, len(mine), batch)])
    return parts


@pytest.mark.parametrize("shuffle", ["global", "block", None])
def test_epoch_order_is_a_permutation(shuffle):
    sizes = [10, 33, 1, 56]
    got = order.epoch_order(100, shuffle, seed=1, epoch=2, shard_sizes=sizes, block_size=8)
    assert got.dtype == np.int64
    assert np.array_equal(np.sort(got), np.arange(100))
    if shuffle is None:
        assert np.array_equal(got, np.arange(100))


@pytest.mark.parametrize("shuffle", ["global", "block"])
def test_same_seed_same_order_and_epochs_differ(shuffle):
    kw = dict(shard_sizes=[500, 500], block_size=16, window=4)
    a = order.epoch_order(1000, shuffle, 5, 0, **kw)
    assert np.array_equal(a, order.epoch_order(1000, shuffle, 5, 0, **kw))
    assert not np.array_equal(a, order.epoch_order(1000, shuffle, 5, 1, **kw))
    assert not np.array_equal(a, order.epoch_order(1000, shuffle, 6, 0, **kw))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(0, 300), world=st.integers(1, 5), batch=st.integers(1, 40),
       workers=st.integers(1, 4), shuffle=st.sampled_from(["global", "block", None]))
def test_ranks_x_workers_disjoint_and_complete(n, world, batch, workers, shuffle):
    sizes = [n // 2, n - n // 2]
    parts = _all_batches(n, world, batch, False, workers, shuffle, sizes)
    seen = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    assert np.array_equal(np.sort(seen), np.arange(n))  # exactly once
    dropped = _all_batches(n, world, batch, True, workers, shuffle, sizes)
    seen = np.concatenate(dropped) if dropped else np.zeros(0, np.int64)
    assert len(np.unique(seen)) == len(seen)  # at most once
    assert all(len(p) == batch for p in dropped)  # only full batches
    per_rank = {order.rank_bounds(n, r, world, batch, True)[1] -
                order.rank_bounds(n, r, world, batch, True)[0] for r in range(world)}
    assert len(per_rank) == 1  # every rank the same number of batches


def test_uneven_split_differs_by_at_most_one_sample():
    sizes = [order.rank_bounds(103, r, 4, 8, False) for r in range(4)]
    lengths = [b - a for a, b in sizes]
    assert sum(lengths) == 103 and max(lengths) - min(lengths) <= 1


def test_block_order_reads_few_blocks_per_window():
    sizes = [300, 200, 500]
    got = order.block_order(sizes, seed=0, epoch=0, block_size=50, window=4)
    starts, lengths = order.shard_blocks(sizes, 50)
    block_of = np.searchsorted(starts, got, side="right") - 1
    ends = np.cumsum(lengths)
    for w in range(0, len(got), 200):  # every window is 4 full blocks of 50 here
        assert len(np.unique(block_of[w:w + 200])) <= 4
    assert np.all(ends[-1] == 1000)
    # blocks never cross a shard boundary
    shard_starts = np.array([0, 300, 500])
    assert set(starts) >= set(shard_starts)


def test_check_shuffle_and_errors():
    assert order.check_shuffle(True) == "global"
    assert order.check_shuffle(False) is None
    with pytest.raises(ValueError, match="shuffle"):
        order.check_shuffle("random")
    with pytest.raises(ValueError, match="rank"):
        order.rank_bounds(10, 2, 2, 1, False)
    with pytest.raises(ValueError, match="shard sizes"):
        order.epoch_order(10, "block", 0, 0, shard_sizes=[4, 4])


def test_resolve_world_defaults_without_distributed():
    assert order.resolve_world(None, None) == (0, 1)
    assert order.resolve_world(1, 3) == (1, 3)
    with pytest.raises(ValueError, match="rank 3, world_size 3: expected 0 <= rank < world_size"):
        order.resolve_world(3, 3)


def test_uniforms_are_pure_per_sample():
    idx = np.array([5, 1_000_000, 7, 5])
    a = uniforms(1, 2, STREAM_CROP, idx, 3)
    assert a.shape == (4, 3) and np.all((a >= 0) & (a < 1))
    assert np.array_equal(a[0], a[3])  # same sample, same draws, whatever the batch
    assert np.array_equal(a[1:3], uniforms(1, 2, STREAM_CROP, idx[1:3], 3))
    assert not np.array_equal(a, uniforms(1, 3, STREAM_CROP, idx, 3))
    assert not np.array_equal(a, uniforms(1, 2, STREAM_FLIP_H, idx, 3))
    big = uniforms(0, 0, 1, np.arange(20000))[:, 0]
    assert abs(big.mean() - 0.5) < 0.01 and abs((big < 0.1).mean() - 0.1) < 0.01


def test_expected_distinct_matches_simulation():
    from dlpack_io.tools.order_report import expected_distinct

    sizes = [100, 50, 10, 1]
    population = np.repeat(np.arange(4), sizes)
    gen = np.random.default_rng(0)
    sim = np.mean([len(np.unique(gen.choice(population, 20, replace=False)))
                   for _ in range(4000)])
    assert abs(expected_distinct(sizes, 20) - sim) < 0.03
    assert expected_distinct([5, 5], 10) == 2.0


def test_order_report(tmp_path):
    from dlpack_io.packer import convert
    from dlpack_io.tools.order_report import format_order_report, order_report
    from dlpack_io.tools.synth import make_image_folder

    make_image_folder(tmp_path / "src", 40, 4, seed=0, size=(16, 16))
    convert(tmp_path / "src", tmp_path / "ds", mode="raw", size=16, shard_size="4KB",
            workers=1, progress=False, overwrite=True, shuffle=False)
    report = order_report(tmp_path / "ds", seed=1, world_size=2, rank=1, batch_size=8,
                          shuffle="block", block_size=4, window=2, drop_last=True)
    assert report["rank_samples"] == 16 and report["num_batches"] == 2
    assert sum(report["shards_read"].values()) == 16
    q = report["quality"]
    assert set(q) == {"global", "block", "none"}
    assert q["none"]["shard_mix"] < q["global"]["shard_mix"]
    text = format_order_report(report)
    assert "rank 1 of 2" in text and "<- this run" in text
