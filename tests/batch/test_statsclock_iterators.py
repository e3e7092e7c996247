"""Several live iterators of one Loader (DataLoader allows them): one loop, one clock. An
epoch still open when a newer iterator starts is closed in the figures (it joins .run), what
either iterator delivers afterwards counts in the newest epoch, nothing is lost or counted
twice; and an older iterator left behind neither stops the workers under the newer one nor
ends the newer epoch's figures."""
from __future__ import annotations

import time

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Loader, Output, Workers

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("iters"), 48, 3, seed=5,
                             shard_size="60KB")


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_two_iterators_in_one_loop_count_every_batch_once(packed, kind):
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=2, workers=Workers(kind=kind))
    start = time.perf_counter()
    pairs = sum(1 for _ in zip(loader, loader))  # both read epoch 0 (neither had started)
    wall = time.perf_counter() - start
    stats = loader.stats()
    loader.close()
    assert pairs == 6
    # a's first batch was epoch 0's figures when b started; the 11 others are b's epoch's
    assert (stats.epoch, stats.batches, stats.images) == (0, 11, 88)
    assert (stats.run.epochs, stats.run.batches, stats.run.images) == (2, 12, 96)
    assert stats.run.wait_s + stats.run.step_s <= wall


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_an_older_iterator_left_behind_stops_neither_the_workers_nor_the_figures(packed, kind):
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=2,
                    workers=Workers(kind=kind), output=Output(return_index=True))
    old = iter(loader)
    next(old)  # epoch 0, one batch
    new = iter(loader)
    first = next(new)  # epoch 1
    del old  # closed: before, it stopped the workers the new iterator reads from
    read = [first[2]] + [b[2] for b in new]
    stats = loader.stats()
    loader.close()
    fresh = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=0,
                   output=Output(return_index=True))
    fresh.set_epoch(1)
    want = [b[2] for b in fresh]
    assert len(read) == len(want) == 6
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(read, want))
    assert (stats.epoch, stats.batches) == (1, 6)
    assert (stats.run.epochs, stats.run.batches, stats.run.first_epoch) == (2, 7, 0)
