"""A training script written for torch's DataLoader: epochs that advance by themselves (and
set_epoch that still decides), DataLoader's attributes and keywords, refusals that point to
our equivalents."""
import logging

import numpy as np
import pytest
import torch

from dlpack_io.reader import (Dataset, Loader, RandomCrop, RandomHorizontalFlip,
                              Workers)

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("habits"), 30, 3, seed=4,
                             shard_size="40KB")["raw"]


def _loader(path, **kw):
    base = dict(batch_size=7, seed=2, num_workers=1, return_index=True,
                transforms=[RandomCrop(24), RandomHorizontalFlip()])
    return Loader(Dataset(path), **{**base, **kw})


def _epoch(loader):
    return [(x.clone(), y.clone(), i.copy()) for x, y, i in loader]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(i1, i2) and torch.equal(x1, x2)
                                    and torch.equal(y1, y2)
                                    for (x1, y1, i1), (x2, y2, i2) in zip(a, b))


def _reference(path, epoch):
    loader = _loader(path)
    loader.set_epoch(epoch)
    return _epoch(loader)


# ---- epochs ----------------------------------------------------------------------------
def test_iterating_again_without_set_epoch_reads_the_next_epoch(raw):
    loader = _loader(raw)
    assert loader.epoch == 0
    passes = []
    for expected in (1, 2, 3):
        passes.append(_epoch(loader))
        assert loader.epoch == expected  # a finished pass: loader.epoch names the next one
    assert not np.array_equal(np.concatenate([i for _, _, i in passes[0]]),
                              np.concatenate([i for _, _, i in passes[1]]))
    for epoch, got in enumerate(passes):  # exactly what set_epoch(epoch) reads
        assert _same(got, _reference(raw, epoch)), epoch


def test_set_epoch_habit_reads_the_same_epochs_and_can_repeat_one(raw):
    loader = _loader(raw)
    habit = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        habit.append(_epoch(loader))
    assert _same(habit[0], _reference(raw, 0)) and _same(habit[1], _reference(raw, 1))
    loader.set_epoch(0)  # an explicit epoch is read exactly, even one already read
    assert _same(_epoch(loader), habit[0]) and loader.epoch == 1


def test_an_abandoned_epoch_counts_as_read(raw):
    """DataLoader reshuffles on every iter(): a pass left by `break` is not read again."""
    loader = _loader(raw)
    for k, _ in enumerate(loader):
        if k == 1:
            break
    assert loader.epoch == 0 and loader.state_dict()["epoch"] == 0  # where the break left it
    assert len(loader) == len(_reference(raw, 1))  # the next iteration: all of epoch 1
    assert _same(_epoch(loader), _reference(raw, 1))
    assert loader.epoch == 2


def test_state_saved_after_a_break_resumes_exactly_and_then_advances(raw):
    run = _loader(raw)
    _epoch(run)  # epoch 0 without set_epoch
    got = []
    for k, (x, y, i) in enumerate(run):  # epoch 1, left after two batches
        got.append((x.clone(), y.clone(), i.copy()))
        if k == 1:
            state = run.state_dict()
            break
    assert state["epoch"] == 1 and [s["batches"] for s in state["segments"]] == [2]
    resumed = _loader(raw, num_workers=0)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    assert _same(got + _epoch(resumed), _reference(raw, 1))  # no set_epoch needed
    assert resumed.epoch == 2 and resumed.state_dict()["epoch"] == 2
    assert _same(_epoch(resumed), _reference(raw, 2))


def test_an_iterator_never_started_does_not_advance(raw):
    loader = _loader(raw)
    iter(loader)  # created, never advanced: nothing was read
    assert _same(_epoch(loader), _reference(raw, 0))


# ---- DataLoader's attributes and keywords --------------------------------------------------
def test_dataloader_attributes(raw):
    ds = Dataset(raw)
    loader = Loader(ds, batch_size=7, num_workers=1, drop_last=True)
    assert (loader.batch_size, loader.num_workers, loader.drop_last) == (7, 1, True)
    assert loader.dataset is ds and len(loader) == 30 // 7
    assert (loader.pin_memory, loader.prefetch_factor, loader.persistent_workers) == \
        (False, None, True)


def test_prefetch_factor_counts_per_worker_and_excludes_prefetch(raw):
    ds = Dataset(raw)
    assert Loader(ds, num_workers=3, prefetch_factor=4).options.in_flight == 12
    assert Loader(ds, num_workers=0, prefetch_factor=2).options.in_flight == 2
    assert Loader(ds, num_workers=3, prefetch_factor=4).prefetch_factor == 4  # as asked
    with pytest.raises(ValueError, match="pass one"):
        Loader(ds, workers=Workers(prefetch=3), prefetch_factor=2)
    with pytest.raises(ValueError, match="prefetch_factor 0"):
        Loader(ds, prefetch_factor=0)
    with pytest.raises(ValueError, match="num_workers='auto': the worker count is not known"):
        Loader(ds, num_workers="auto", prefetch_factor=2)
    # the same limit as prefetch= (buffers and slots are sized by the batches in flight)
    with pytest.raises(ValueError, match=r"prefetch_factor 1000000000 x 2 workers = "
                                         r"2000000000 batches in flight: expected at most 4096"):
        Loader(ds, num_workers=2, prefetch_factor=10**9)
    a = _epoch(_loader(raw, num_workers=2, prefetch_factor=1))
    assert _same(a, _reference(raw, 0))


def test_dataloader_names_mean_what_they_mean_there_without_a_warning(raw, recwarn):
    loader = Loader(Dataset(raw), timeout=0, pin_memory=False, persistent_workers=False)
    assert loader.options.workers == Workers(timeout=None, persistent=False)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_timeout_zero_means_wait_as_in_dataloader(raw):
    assert Workers(timeout=0).timeout is None
    assert Loader(Dataset(raw), timeout=0).options.workers.timeout is None
    with pytest.raises(ValueError, match="timeout -1"):
        Workers(timeout=-1)


def test_persistent_workers_false_stops_the_workers_after_each_epoch(raw):
    keep = _loader(raw, num_workers=2, worker_kind="process")
    drop = _loader(raw, num_workers=2, worker_kind="process", persistent_workers=False)
    try:
        a, b = _epoch(keep), _epoch(drop)
        assert _same(a, b)
        assert len(keep.worker_pids()) == 2 and drop.worker_pids() == []
        assert _same(_epoch(drop), _reference(raw, 1))  # fresh workers for the next epoch
    finally:
        keep.close()
        drop.close()


def test_pin_memory_without_cuda_warns_and_delivers(raw, caplog):
    if torch.cuda.is_available():
        loader = _loader(raw, pin_memory=True)
        assert all(x.is_pinned() and y.is_pinned() for x, y, _ in loader)
        return
    with caplog.at_level(logging.WARNING, logger="dlpack_io.reader.batch.finish"):
        loader = _loader(raw, pin_memory=True)
    assert "pin_memory=True but CUDA is not available" in caplog.text
    assert _same(_epoch(loader), _reference(raw, 0))


@pytest.mark.parametrize("name,points_to", [
    ("sampler", "order=Order(indices=[...])"),
    ("batch_sampler", "batch_size= with order=Order(indices=...)"),
    ("collate_fn", "sample_transform="), ("worker_init_fn", "sample_transform="),
    ("generator", "seed="), ("multiprocessing_context", "workers=Workers(kind='process')"),
    ("pin_memory_device", "device='cuda:N'"),
])
def test_dataloader_only_keywords_point_to_the_equivalent(raw, name, points_to):
    with pytest.raises(TypeError, match=f"DataLoader's {name}=: use ") as info:
        Loader(Dataset(raw), **{name: object()})
    assert points_to in str(info.value)


def test_a_misspelt_keyword_is_a_type_error_with_the_closest_names(raw):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'batchsize'; did you "
                                        r"mean batch_size"):
        Loader(Dataset(raw), batchsize=4)
