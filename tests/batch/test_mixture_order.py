"""A Mixture's epoch order (reader/batch/sources.py) and its shares (reader/mixture.py):
exact per-epoch shares, no repeats within an epoch unless a set is smaller than its share,
different samples from epoch to epoch, and the stratified interleave."""
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from dlpack_io.reader.batch import sources
from dlpack_io.reader.mixture import epoch_length, largest_remainder


def _order(sizes, counts, epoch, shuffle="global", seed=0, shard_sizes=None):
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    total = int(sum(sizes))
    v = sources.mixture_order(sizes, counts, offsets, total, shuffle=shuffle, seed=seed,
                               epoch=epoch, shard_sizes=shard_sizes, block_size=4, window=2)
    concat = v % total
    sets = np.searchsorted(offsets, concat, side="right") - 1
    return v, sets, concat - offsets[sets]


def _fractions(weights):
    w = [Fraction(x) for x in weights]
    return [x / sum(w) for x in w]


def test_largest_remainder_pins_exact_shares():
    assert largest_remainder(_fractions([0.7, 0.3]), 10) == [7, 3]
    assert largest_remainder(_fractions([1, 1, 1]), 10) == [4, 3, 3]       # tie: lower set
    assert largest_remainder(_fractions([0.5, 0.25, 0.25]), 3) == [1, 1, 1]
    assert largest_remainder(_fractions([2, 0, 1]), 7) == [5, 0, 2]        # 4.67, 0, 2.33
    for n in range(0, 60):
        assert sum(largest_remainder(_fractions([0.13, 0.29, 0.58]), n)) == n


def test_epoch_rules_are_the_documented_bounds():
    w, sizes = _fractions([0.7, 0.3]), [100, 20]
    assert epoch_length("sum", w, sizes) == 120
    big = epoch_length("largest", w, sizes)        # set 0 needs 100 / 0.7 = 142.9 -> 143
    assert big == 143 and min(c - n for c, n in zip(largest_remainder(w, big), sizes)) >= 0
    assert w[0] * (big - 1) < 100                  # the exact share, before rounding
    small = epoch_length("smallest", w, sizes)     # set 1 allows 20 / 0.3 -> 66
    assert small == 66 and all(c <= n for c, n in zip(largest_remainder(w, small), sizes))
    assert w[1] * (small + 1) > 20
    # a zero weight does not decide the length; "largest" of equal weights: the big set
    assert epoch_length("largest", _fractions([1, 0]), [10, 1000]) == 10
    assert epoch_length("largest", _fractions([1, 1]), [10, 30]) == 60


@pytest.mark.parametrize("shuffle", ["global", "block", None])
def test_shares_exact_and_no_repeats_over_many_epochs(shuffle):
    sizes, counts = [50, 7, 23], [31, 16, 23]   # subsampled, repeated (2x + 2), whole
    shard_sizes = [[20, 20, 10], [7], [5, 9, 9]]
    seen_by_epoch = []
    for epoch in range(40):
        v, sets, local = _order(sizes, counts, epoch, shuffle, seed=5, shard_sizes=shard_sizes)
        assert len(np.unique(v)) == len(v) == sum(counts)          # every position distinct
        assert np.bincount(sets, minlength=3).tolist() == counts   # exact shares
        a = local[sets == 0]
        assert len(np.unique(a)) == 31                             # subsampled: no repeat
        times = Counter(local[sets == 1].tolist())
        assert sorted(times) == list(range(7))                     # repeated evenly
        assert sorted(times.values()) == [2] * 5 + [3] * 2
        assert sorted(local[sets == 2].tolist()) == list(range(23))  # exactly once
        seen_by_epoch.append(set(a.tolist()))
    # r = 31 of n = 50: one epoch per tour, so consecutive epochs draw different subsets
    assert all(seen_by_epoch[e] != seen_by_epoch[e + 1] for e in range(39))
    assert set().union(*seen_by_epoch) == set(range(50))


def test_a_tour_reads_disjoint_windows_and_covers_the_set():
    sizes, counts = [40, 10], [10, 10]   # set 0: r = 10 of 40 -> tours of 4 epochs
    for tour in range(3):
        draws = [_order(sizes, counts, 4 * tour + j, seed=1) for j in range(4)]
        got = [local[sets == 0] for _, sets, local in draws]
        assert sorted(np.concatenate(got).tolist()) == list(range(40))
    first = [_order(sizes, counts, j, seed=1) for j in (0, 4)]
    assert not np.array_equal(*(local[sets == 0] for _, sets, local in first))


def test_order_is_a_pure_function_of_seed_and_epoch():
    sizes, counts = [30, 12], [35, 15]
    a, b = _order(sizes, counts, 3, seed=9)[0], _order(sizes, counts, 3, seed=9)[0]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, _order(sizes, counts, 4, seed=9)[0])
    assert not np.array_equal(a, _order(sizes, counts, 3, seed=10)[0])


def test_every_stretch_holds_each_set_near_its_share():
    sizes, counts = [1000, 300], [700, 300]
    for shuffle in ("global", None):
        _, sets, _ = _order(sizes, counts, 2, shuffle)
        per_batch = sets[:1000].reshape(-1, 50).sum(axis=1)   # set-1 samples per 50
        assert per_batch.min() >= 15 - 2 and per_batch.max() <= 15 + 2, per_batch


def test_no_shuffle_is_storage_order_within_each_set():
    _, sets, local = _order([10, 4], [10, 4], 0, None)
    assert local[sets == 0].tolist() == list(range(10))
    # keys (i + 0.5) / count: set 0 at .05, .15, ...; set 1 at .125, .375, .625, .875
    assert sets.tolist() == [0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 1, 0]


def test_an_empty_set_with_a_share_is_refused():
    with pytest.raises(ValueError, match="set 1 is empty"):
        sources.set_draw(0, 3, 1, shuffle="global", seed=0, epoch=0)
