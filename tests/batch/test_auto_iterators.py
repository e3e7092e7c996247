"""Two live iterators of one Loader while num_workers="auto" is measuring: the newer one's
trials swap the workers under the older one, which failed (a ZeroDivisionError from a
closed process runner, or a LoaderTimeout). Now the newer one works and the older one,
when it resumes, is refused naming the limitation; an older iterator never resumed (a
batch peeked at) is no obstacle."""
from __future__ import annotations

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Loader, LoaderError, Output, Workers

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("autoiters"), 72, 3, seed=5,
                             shard_size="60KB")


def _fixed(packed, epoch: int) -> list:
    loader = Loader(Dataset(packed["raw"]), batch_size=2, num_workers=0,
                    output=Output(return_index=True))
    loader.set_epoch(epoch)
    return [np.asarray(b[2]).tolist() for b in loader]


def _auto(packed) -> Loader:
    return Loader(Dataset(packed["raw"]), batch_size=2, num_workers="auto",
                  output=Output(return_index=True), workers=Workers(timeout=30))


def test_zip_of_two_iterators_while_auto_measures_names_the_limitation(packed):
    loader = _auto(packed)
    older, newer = iter(loader), iter(loader)
    next(older)  # epoch 0 (iter() reads the epoch at its first next()): the trials start
    got = [np.asarray(next(newer)[2]).tolist()]  # epoch 0 too: it takes over the trials
    with pytest.raises(LoaderError, match=r"a newer iterator of this Loader started while "
                                          r"num_workers='auto' measures, swapping the "
                                          r"workers: not supported before"):
        next(older)
    got += [np.asarray(b[2]).tolist() for b in newer]
    stats = loader.stats()
    loader.close()
    assert got == _fixed(packed, 0)  # the newer iterator: every batch of its epoch
    assert (stats.epoch, stats.batches, stats.run.epochs, stats.run.batches) == (0, 36, 2, 37)
    assert "measured" in stats.tuned


def test_a_batch_peeked_at_before_a_for_loop_is_no_obstacle(packed):
    loader = _auto(packed)
    peek = iter(loader)
    next(peek)
    got = [np.asarray(b[2]).tolist() for b in loader]
    loader.close()
    assert got == _fixed(packed, 1)
