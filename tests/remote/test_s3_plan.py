"""Pure planning rules of the prefetcher (no I/O): coalescing, eviction points, limits."""
from __future__ import annotations

import numpy as np
import pytest

from dlpack_io.reader.remote.fetchplan import (auto_mode, check_limit, coalesce, fill_first,
                                               fill_inflight, fill_range_bytes, first_use,
                                               make_plan)


def test_coalesce_merges_close_neighbours_and_respects_the_size_cap():
    offsets = np.array([0, 100, 1000, 1100, 5000])
    lengths = np.array([100, 50, 100, 100, 10])
    groups = coalesce(offsets, lengths, gap=0, max_bytes=10**6)
    assert [(a, b, p.tolist()) for a, b, p in groups] == [
        (0, 150, [0, 1]), (1000, 1200, [2, 3]), (5000, 5010, [4])]
    groups = coalesce(offsets, lengths, gap=900, max_bytes=10**6)
    assert [(a, b) for a, b, _ in groups] == [(0, 1200), (5000, 5010)]
    groups = coalesce(offsets, lengths, gap=10**6, max_bytes=1100)
    assert [(a, b) for a, b, _ in groups] == [(0, 1100), (1100, 1200), (5000, 5010)]
    assert coalesce(np.zeros(0), np.zeros(0), gap=0, max_bytes=1) == []


def test_coalesce_keeps_a_single_record_larger_than_the_cap():
    groups = coalesce(np.array([0, 500]), np.array([400, 10]), gap=0, max_bytes=100)
    assert [(a, b) for a, b, _ in groups] == [(0, 400), (500, 510)]


def _shard_of(starts):
    return lambda s: np.searchsorted(starts, s, side="right") - 1


def test_records_plan_last_use_and_batch_bytes():
    lengths = np.arange(1, 11) * 10   # sample i is (i + 1) * 10 bytes
    batches = [np.array([3, 1, 1]), np.array([2, 3]), np.array([9])]
    plan = make_plan("records", batches, _shard_of(np.array([0, 5])), lengths, [100, 100])
    assert [n.tolist() for n in plan.needs] == [[1, 3], [2, 3], [9]]
    assert plan.last_use.tolist() == [-1, 0, 1, 1, -1, -1, -1, -1, -1, 2]
    assert [plan.batch_bytes(k) for k in range(3)] == [20 + 40, 30 + 40, 100]
    # where each needed record first appears in its batch: requests go out in that order
    assert [p.tolist() for p in plan.first_pos] == [[1, 0], [0, 1], [0]]
    assert plan.max_batch_bytes() == (100, 2)


def test_first_use_and_when_the_fill_comes_before_batch_0():
    lengths = np.arange(1, 11) * 10
    batches = [np.array([3, 1, 1]), np.array([2, 3]), np.array([9])]
    plan = make_plan("records", batches, _shard_of(np.array([0, 5])), lengths, [100, 100])
    assert first_use(plan).tolist() == [-1, 0, 1, 0, -1, -1, -1, -1, -1, 2]
    todo = np.array([1, 2, 3, 9])  # 20 + 30 + 40 + 100 = 190 bytes; batch 0: 60
    assert fill_first(plan, todo, 190 / 60) and not fill_first(plan, todo, 3)


def test_the_fill_keeps_few_large_ranges_in_flight_but_many_small_ones():
    def ranges(*sizes):
        return [("range", 0, 0, size, None, None, None) for size in sizes]
    assert fill_inflight(ranges(400, 100), 400, 8, 64) == 8  # mean 250 >= 400 / 4
    assert fill_inflight(ranges(99, 99), 400, 8, 64) == 64
    assert fill_inflight([], 400, 8, 64) == 8


def test_the_fills_ranges_are_large_but_keep_its_requests_in_flight_busy():
    mib = 2**20
    assert fill_range_bytes(1000 * mib, 16 * mib, 8, 4 * mib) == 16 * mib  # a large set
    assert fill_range_bytes(80 * mib, 16 * mib, 8, 4 * mib) == 10 * mib  # 8 ranges of 10
    assert fill_range_bytes(80 * mib + 1, 16 * mib, 8, 4 * mib) == 10 * mib + 1  # rounded up
    assert fill_range_bytes(20 * mib, 16 * mib, 8, 4 * mib) == 4 * mib  # never below least
    assert fill_range_bytes(0, 16 * mib, 8, 4 * mib) == 4 * mib
    assert fill_range_bytes(100 * mib, 2 * mib, 8, 4 * mib) == 2 * mib  # nor above the most
    assert fill_range_bytes(100, 1000, 0, 10) == 100  # no inflight given: one range


def test_shards_plan_needs_whole_shards():
    batches = [np.array([0, 6]), np.array([7, 8])]
    plan = make_plan("shards", batches, _shard_of(np.array([0, 5])), np.ones(10), [300, 200])
    assert [n.tolist() for n in plan.needs] == [[0, 1], [1]]
    assert plan.last_use.tolist() == [0, 1]
    assert plan.max_batch_bytes() == (500, 0)


def test_check_limit_refuses_with_the_amount_needed():
    plan = make_plan("records", [np.array([0, 1])], _shard_of(np.array([0])), [700, 300], [1000])
    check_limit(plan, 1000, "s3://b/p")
    with pytest.raises(ValueError, match=r"cache_limit 999 bytes cannot hold batch 0.*"
                                         r"need 1,000 bytes; give cache_limit >= 1,000"):
        check_limit(plan, 999, "s3://b/p")
    plan = make_plan("shards", [np.array([0, 1])], _shard_of(np.array([0, 1])), [1, 1], [600, 600])
    with pytest.raises(ValueError, match="whole shards need 1,200 bytes.*'records'"):
        check_limit(plan, 1000, "s3://b/p")


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="fetch mode 'all'"):
        make_plan("all", [], _shard_of(np.array([0])), [], [])


def test_auto_mode_picks_shards_only_for_shard_local_batches_that_fit():
    starts = np.arange(0, 100, 10)   # 10 shards of 10 samples
    shard_of, sizes = _shard_of(starts), [1000] * 10
    local = [np.arange(k * 10, k * 10 + 8) for k in range(5)]
    spread = [np.arange(k, 100, 10) for k in range(5)]
    assert auto_mode(local, shard_of, sizes, cache_limit=10**6) == "shards"
    assert auto_mode(local, shard_of, sizes, cache_limit=1500) == "records"
    assert auto_mode(spread, shard_of, sizes, cache_limit=10**6) == "records"
    assert auto_mode([], shard_of, sizes, cache_limit=10**6) == "records"
    # a data set that fits the cache is all kept, grown in place: records, whatever the order
    assert auto_mode(local, shard_of, sizes, 10**6, record_bytes=10**6) == "records"
    assert auto_mode(local, shard_of, sizes, 10**6, record_bytes=10**6 + 1) == "shards"
    assert auto_mode(spread, shard_of, sizes, 10**6, record_bytes=10**6 + 1) == "records"
