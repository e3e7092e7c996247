"""Pinned values of the random streams, the epoch orders and the rank split.

The docs promise the same floats and the same order on every machine and numpy version for
the same (seed, epoch, ...): these tests hold a handful of numbers each, computed once with
reader/batch/plan.py and reader/batch/order.py and written here as literals. A change to the
hash, the stream ids, the generator seeding, the block cutting or the rank split fails here first.
If such a change is ever intended, it breaks every saved resume state and every recorded
experiment: bump the docs, then recompute these numbers on purpose.
"""
import numpy as np
import pytest

from dlpack_io.reader.batch import order
from dlpack_io.reader.batch.plan import uniforms
from dlpack_io.reader.transforms.geometry import RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip
from dlpack_io.reader.transforms.colour import ColorJitter

# the ops' own random streams (fixed forever: a sample keeps its draws)
STREAM_CROP = RandomResizedCrop.stream
STREAM_FLIP_H = RandomHorizontalFlip.stream
STREAM_FLIP_V = RandomVerticalFlip.stream
STREAM_JITTER = ColorJitter.stream

# uniforms(seed=7, epoch=3, stream, indices=[0, 5, 2**40], count=3), row per sample,
# exact float64 values (repr round-trips), one block per stream.
PINNED_UNIFORMS = {
    STREAM_CROP: [[0.9367331135650868, 0.423620940528869, 0.598968481450896],
                      [0.7286166751258301, 0.6618310396021045, 0.3641060810681266],
                      [0.8025159114164543, 0.9691948571633293, 0.06362927789968198]],
    STREAM_FLIP_H: [[0.5227508825890425, 0.11446109921778858, 0.030784934577137713],
                        [0.9302074179813528, 0.6375932828342964, 0.11131567745057558],
                        [0.03783145118197451, 0.17235208061463214, 0.11847609110784918]],
    STREAM_FLIP_V: [[0.45765785938846704, 0.5675850218834135, 0.3674465294606548],
                        [0.9447521506776829, 0.11670908173449102, 0.35424762323366765],
                        [0.1525218241531574, 0.5820728618712805, 0.43426769007920374]],
    STREAM_JITTER: [[0.1301244500119313, 0.8092522753953448, 0.15084186916521358],
                        [0.31957120356159974, 0.6024347609958559, 0.99769887356161],
                        [0.10850393802247871, 0.8959433466071448, 0.5421868675704894]],
}


def test_stream_ids_are_the_documented_ones():
    """The ids are hashed into every draw: renumbering them changes every augmentation."""
    assert (STREAM_CROP, STREAM_FLIP_H, STREAM_FLIP_V, STREAM_JITTER) == \
        (1, 2, 3, 4)


@pytest.mark.parametrize("stream", sorted(PINNED_UNIFORMS))
def test_uniforms_are_pinned(stream):
    got = uniforms(7, 3, stream, [0, 5, 2**40], 3)
    assert got.dtype == np.float64 and got.shape == (3, 3)
    assert got.tolist() == PINNED_UNIFORMS[stream]


def test_uniforms_of_a_subset_and_of_more_draws_are_the_same_numbers():
    """Draw j of sample i does not depend on the other samples or on how many draws."""
    one = uniforms(7, 3, STREAM_CROP, [5], 2)
    assert one.tolist() == [PINNED_UNIFORMS[STREAM_CROP][1][:2]]
    default = uniforms(7, 3, STREAM_CROP, [5, 0])  # count defaults to one draw
    assert default.tolist() == [[PINNED_UNIFORMS[STREAM_CROP][1][0]],
                                [PINNED_UNIFORMS[STREAM_CROP][0][0]]]
    many = uniforms(7, 3, STREAM_CROP, [2**40, 0], 40)
    assert many[:, :3].tolist() == [PINNED_UNIFORMS[STREAM_CROP][2],
                                    PINNED_UNIFORMS[STREAM_CROP][0]]


def test_uniforms_have_53_random_bits_in_0_1():
    """Every value is k / 2**53 for an integer k: the top 53 bits of the hash."""
    u = uniforms(0, 0, STREAM_CROP, np.arange(5000), 4)
    k = u * 2.0**53
    assert np.array_equal(k, np.floor(k)) and k.min() >= 0 and k.max() < 2**53
    assert k.max() > 2**52  # the top bit is used (a shift by one more would halve the range)
    assert np.count_nonzero(k % 2) > 0  # and the lowest bit too


def test_draws_of_one_sample_differ():
    """All draws of a sample being one number (a mutant the suite once let through) would
    make RandomResizedCrop's area, aspect and position one value."""
    u = uniforms(1, 0, STREAM_CROP, np.arange(200), 40)
    for row in u:
        assert len(np.unique(row)) == 40
    # and they are not a fixed offset of each other either
    assert len(np.unique(np.round(u[:, 1] - u[:, 0], 12))) > 150


def test_streams_differ_for_every_pair():
    """Flip-h and flip-v being one stream would flip every image both ways at once."""
    idx = np.arange(500)
    draws = {s: uniforms(9, 1, s, idx, 2) for s in PINNED_UNIFORMS}
    streams = sorted(draws)
    for a in streams:
        for b in streams:
            if a < b:
                same = np.mean(draws[a] == draws[b])
                assert same == 0.0, (a, b)
                # independent: P(both < 0.5) is about 1/4, not 1/2
                both = np.mean((draws[a][:, 0] < 0.5) & (draws[b][:, 0] < 0.5))
                assert 0.18 < both < 0.32, (a, b, both)


@pytest.mark.parametrize("change", ["seed", "epoch", "index", "stream"])
def test_every_input_changes_the_draws(change):
    base = dict(seed=7, epoch=3, stream=STREAM_CROP, idx=np.arange(64))
    other = dict(base)
    other[{"seed": "seed", "epoch": "epoch", "index": "idx", "stream": "stream"}[change]] = \
        {"seed": 8, "epoch": 4, "index": np.arange(64) + 64, "stream": STREAM_FLIP_H}[change]
    a = uniforms(base["seed"], base["epoch"], base["stream"], base["idx"], 2)
    b = uniforms(other["seed"], other["epoch"], other["stream"], other["idx"], 2)
    assert not np.any(a == b)


def test_big_seeds_wrap_modulo_2_to_the_64():
    """Seeds are taken modulo 2**64 (documented): 2**64 + 7 is seed 7, -1 is 2**64 - 1."""
    idx = [0, 5, 2**40]
    assert uniforms(2**64 + 7, 3, STREAM_CROP, idx, 3).tolist() == \
        PINNED_UNIFORMS[STREAM_CROP]
    assert np.array_equal(uniforms(-1, 0, 1, idx), uniforms(2**64 - 1, 0, 1, idx))


# ---- epoch order ------------------------------------------------------------------------
# epoch_order(20, "global", seed=11, epoch=2): numpy PCG64 seeded with [11, 2, 0]
PINNED_GLOBAL = [15, 2, 11, 18, 19, 1, 3, 14, 10, 13, 8, 4, 12, 7, 0, 16, 17, 6, 5, 9]
# epoch_order(20, "block", seed=11, epoch=2, shard_sizes=[7, 6, 7], block_size=3, window=2):
# blocks (0-2)(3-5)(6)(7-9)(10-12)(13-15)(16-18)(19), permuted, 2 per window, shuffled
PINNED_BLOCK = [3, 6, 5, 4, 11, 17, 10, 12, 16, 18, 1, 2, 13, 14, 0, 15, 7, 19, 9, 8]
# block_order([10, 10, 5], seed=2, epoch=0, block_size=4, window=2)
PINNED_BLOCK_2 = [12, 0, 1, 2, 13, 10, 3, 11, 9, 19, 8, 18, 22, 20, 23, 5, 21, 7, 6, 4, 15,
                  17, 14, 16, 24]


def test_global_order_is_pinned():
    got = order.epoch_order(20, "global", seed=11, epoch=2)
    assert got.dtype == np.int64 and got.tolist() == PINNED_GLOBAL
    assert order.epoch_order(20, True, seed=11, epoch=2).tolist() == PINNED_GLOBAL


def test_block_order_is_pinned():
    got = order.epoch_order(20, "block", seed=11, epoch=2, shard_sizes=[7, 6, 7],
                            block_size=3, window=2)
    assert got.dtype == np.int64 and got.tolist() == PINNED_BLOCK
    assert order.block_order([10, 10, 5], seed=2, epoch=0, block_size=4,
                             window=2).tolist() == PINNED_BLOCK_2


def test_block_defaults_are_256_records_and_16_blocks_a_window():
    """The documented defaults (docs/loader.md): pinned through what they produce."""
    assert (order.DEFAULT_BLOCK_SIZE, order.DEFAULT_WINDOW) == (256, 16)
    got = order.epoch_order(8192, "block", seed=1, epoch=0)
    assert np.array_equal(got, order.block_order([8192], seed=1, epoch=0, block_size=256,
                                                 window=16))
    # the first window holds 16 whole blocks of 256: 4096 samples from 16 runs of 256
    assert len(np.unique(got[:4096] // 256)) == 16
    assert np.array_equal(np.sort(got[:4096]) // 256, np.repeat(np.unique(got[:4096] // 256), 256))


def test_rank_order_defaults_are_one_rank_batch_one_keep_last():
    assert order.rank_order(10, shuffle=None, seed=0, epoch=0).tolist() == list(range(10))
    assert order.rank_order(10, shuffle=None, seed=0, epoch=0, world_size=3,
                            rank=2).tolist() == [6, 7, 8, 9]


def test_no_shuffle_is_storage_order():
    for off in (None, False, "none"):
        assert order.epoch_order(6, off, seed=11, epoch=2).tolist() == [0, 1, 2, 3, 4, 5]


def test_block_shuffle_without_shard_sizes_is_one_shard():
    assert np.array_equal(order.epoch_order(20, "block", seed=11, epoch=2, block_size=3,
                                            window=2),
                          order.block_order([20], seed=11, epoch=2, block_size=3, window=2))


def test_shard_blocks_are_pinned():
    starts, lengths = order.shard_blocks([7, 6, 7], 3)
    assert starts.tolist() == [0, 3, 6, 7, 10, 13, 16, 19]
    assert lengths.tolist() == [3, 3, 1, 3, 3, 3, 3, 1]
    starts, lengths = order.shard_blocks([0, 4, 0, 5], 4)  # empty shards make no block
    assert starts.tolist() == [0, 4, 8] and lengths.tolist() == [4, 4, 1]
    starts, lengths = order.shard_blocks([], 4)
    assert starts.tolist() == [] and lengths.tolist() == []


def _windows(got: np.ndarray, starts: np.ndarray, lengths: np.ndarray, window: int) -> list:
    """Cut a block order into its windows: runs that hold exactly ``window`` whole blocks
    (the last run: the blocks left), found from the samples alone."""
    block_of = np.searchsorted(starts, got, side="right") - 1
    out, begin, seen = [], 0, {}
    for pos, b in enumerate(block_of):
        seen[b] = seen.get(b, 0) + 1
        complete = all(seen[k] == lengths[k] for k in seen)
        if complete and (len(seen) == window or pos == len(got) - 1):
            out.append((got[begin:pos + 1], block_of[begin:pos + 1]))
            begin, seen = pos + 1, {}
    assert begin == len(got), "the order is not made of whole-block windows"
    return out


def _storage_ordered(samples: np.ndarray, blocks: np.ndarray) -> bool:
    """True when every block of the window appears as one ascending run (unshuffled)."""
    runs = np.flatnonzero(np.diff(blocks)) + 1
    for run in np.split(np.arange(len(samples)), runs):
        if np.any(np.diff(samples[run]) != 1):
            return False
    return len(np.unique(blocks)) == len(runs) + 1


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sizes,block,window", [([40, 33, 27], 8, 3), ([64], 16, 2),
                                                 ([30, 30], 6, 4)])
def test_every_window_is_shuffled_the_last_one_included(seed, sizes, block, window):
    """Each window is ``window`` whole blocks (the last may hold fewer) whose samples are
    shuffled together: never left in storage order, the last window included."""
    got = order.block_order(sizes, seed=seed, epoch=1, block_size=block, window=window)
    assert np.array_equal(np.sort(got), np.arange(sum(sizes)))
    starts, lengths = order.shard_blocks(sizes, block)
    windows = _windows(got, starts, lengths, window)
    full, last = len(starts) // window, len(starts) % window
    assert len(windows) == full + (last > 0)
    for k, (samples, blocks) in enumerate(windows):
        expected = window if k < full else last
        assert len(np.unique(blocks)) == expected, (k, len(windows))
        assert not _storage_ordered(samples, blocks), f"window {k} of {len(windows)} unshuffled"
        # shuffled together: the blocks interleave instead of following each other
        assert np.count_nonzero(np.diff(blocks)) > len(np.unique(blocks)) - 1, k


def test_blocks_are_permuted_not_taken_in_storage_order():
    got = order.block_order([16] * 8, seed=3, epoch=0, block_size=16, window=1)
    firsts = got[::16] // 16
    assert sorted(firsts.tolist()) == list(range(8)) and firsts.tolist() != list(range(8))


# ---- the split across ranks -------------------------------------------------------------
# rank_part(np.arange(103) * 10, rank, world_size=4, batch_size=8, drop_last):
# (first sample, last sample, number of samples, batch boundaries)
PINNED_PARTS = {
    False: [(0, 240, 25, [0, 8, 16, 24, 25]), (250, 500, 26, [0, 8, 16, 24, 26]),
            (510, 760, 26, [0, 8, 16, 24, 26]), (770, 1020, 26, [0, 8, 16, 24, 26])],
    True: [(0, 230, 24, [0, 8, 16, 24]), (250, 480, 24, [0, 8, 16, 24]),
           (500, 730, 24, [0, 8, 16, 24]), (750, 980, 24, [0, 8, 16, 24])],
}


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_parts_are_pinned(drop_last):
    seq = np.arange(103) * 10
    for rank, (first, last, count, bounds) in enumerate(PINNED_PARTS[drop_last]):
        part, got_bounds = order.rank_part(seq, rank, 4, 8, drop_last)
        assert (int(part[0]), int(part[-1]), len(part)) == (first, last, count), rank
        assert np.array_equal(part, np.arange(first, last + 1, 10))  # contiguous
        assert got_bounds.tolist() == bounds, rank


def test_short_rank_splits_its_last_full_batch():
    """16 samples on 3 ranks, batch 5: parts 5, 5, 6; the 5-sample parts would make one
    batch, the 6-sample part two, so the short parts split theirs in halves 3 + 2."""
    bounds = [order.rank_part(np.arange(16), r, 3, 5, False)[1].tolist() for r in range(3)]
    assert bounds == [[0, 3, 5], [0, 3, 5], [0, 5, 6]]
    one = [order.rank_part(np.arange(3), r, 2, 1, False)[1].tolist() for r in range(2)]
    assert one == [[0, 1, 1], [0, 1, 2]]  # batch size 1: the short rank's last batch is empty
    two = [order.rank_part(np.arange(5), r, 2, 2, False)[1].tolist() for r in range(2)]
    assert two == [[0, 1, 2], [0, 2, 3]]  # a 2-sample last batch splits into 1 + 1


def test_batches_per_rank_and_rank_bounds_are_pinned():
    assert [order.batches_per_rank(103, 4, 8, d) for d in (False, True)] == [4, 3]
    assert [order.batches_per_rank(1000, 3, 111, d) for d in (False, True)] == [4, 3]
    assert order.batches_per_rank(0, 2, 4, False) == 0
    assert [order.rank_bounds(103, r, 4, 8, False) for r in range(4)] == \
        [(0, 25), (25, 51), (51, 77), (77, 103)]
    assert [order.rank_bounds(103, r, 4, 8, True) for r in range(4)] == \
        [(0, 24), (25, 49), (50, 74), (75, 99)]
    with pytest.raises(ValueError, match=r"rank 4 not in \[0, world_size=4\)"):
        order.rank_bounds(103, 4, 4, 8, False)
    with pytest.raises(ValueError, match=r"rank -1 not in \[0, world_size=4\)"):
        order.rank_bounds(103, -1, 4, 8, False)


def test_batch_bounds_refuses_more_batches_than_allowed():
    assert order.batch_bounds(10, 3, 4).tolist() == [0, 4, 8, 10]
    assert order.batch_bounds(8, 3, 4).tolist() == [0, 4, 6, 8]
    assert order.batch_bounds(0, 2, 4).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="10 samples make more than 2 batches of 4"):
        order.batch_bounds(10, 2, 4)


def test_rank_order_of_a_pinned_epoch():
    """The samples rank 2 of 4 reads, global shuffle, drop_last (pinned)."""
    got = order.rank_order(103, shuffle="global", seed=5, epoch=1, rank=2, world_size=4,
                           batch_size=8, drop_last=True)
    assert got.tolist() == [45, 8, 37, 70, 95, 89, 60, 86, 25, 28, 68, 35, 98, 77, 43, 5, 10,
                            74, 94, 21, 55, 78, 82, 50]
    full = order.epoch_order(103, "global", seed=5, epoch=1)
    assert np.array_equal(got, full[50:74])
    block = order.rank_order(103, shuffle="block", seed=5, epoch=1, rank=1, world_size=3,
                             batch_size=8, shard_sizes=[50, 53], block_size=10, window=3)
    assert block[:12].tolist() == [75, 6, 15, 12, 74, 79, 5, 7, 0, 8, 18, 72]


def test_worker_batches_round_robin():
    assert list(order.worker_batches(10, 1, 3)) == [1, 4, 7]
    assert list(order.worker_batches(10, 0, 3, start=4)) == [4, 7]
    assert list(order.worker_batches(3, 0, 0)) == [0, 1, 2]  # no workers: the caller does all
    with pytest.raises(ValueError, match=r"worker 3 not in \[0, 3\)"):
        order.worker_batches(10, 3, 3)


def test_num_batches_and_batch_slice():
    assert [order.num_batches(17, 4, d) for d in (False, True)] == [5, 4]
    assert order.batch_slice(4, 17, 4) == slice(16, 17)
    assert order.batch_slice(1, 17, 4) == slice(4, 8)


@pytest.mark.parametrize("bad,match", [
    (dict(seed=-1), "seed -1 and epoch 0 must be >= 0"),
    (dict(epoch=-2), "seed 0 and epoch -2 must be >= 0"),
])
def test_negative_seed_or_epoch_is_refused(bad, match):
    kw = dict(dict(seed=0, epoch=0), **bad)
    with pytest.raises(ValueError, match=match):
        order.epoch_order(10, "global", **kw)


def test_block_parameters_are_checked():
    with pytest.raises(ValueError, match="block_size 0: expected >= 1"):
        order.shard_blocks([4], 0)
    with pytest.raises(ValueError, match="window 0: expected >= 1 blocks"):
        order.block_order([4], seed=0, epoch=0, block_size=2, window=0)
    with pytest.raises(ValueError, match="shard sizes add up to 8, not 10 samples"):
        order.epoch_order(10, "block", 0, 0, shard_sizes=[4, 4])


def test_resolve_world_sources(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert order.resolve_world(None, None) == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert order.resolve_world(None, None) == (2, 3)
    assert order.resolve_world(0, None) == (0, 3)  # explicit values win
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="environment variable RANK='x' is not an integer"):
        order.resolve_world(None, None)
    with pytest.raises(ValueError, match="rank 3, world_size 3: expected 0 <= rank < world_size"):
        order.resolve_world(3, 3)
    with pytest.raises(ValueError, match="rank 0, world_size 0"):
        order.resolve_world(0, 0)
