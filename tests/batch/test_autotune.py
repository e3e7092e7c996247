"""num_workers="auto" / prefetch="auto": the Loader settles its own setting on the first
batches, says what it chose and why, and never changes a batch (same indices and pixels as
a fixed setting, threads or processes, across epochs and across a resume)."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Loader, LoaderOptions, RandomHorizontalFlip, RandomResizedCrop
from dlpack_io.reader.batch import autotune
from dlpack_io.reader.batch.autotune import Shifted, Trial, Tuner, candidates, choose

from helpers import pack_jpeg_and_raw

RECIPE = (RandomResizedCrop(24), RandomHorizontalFlip())


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("auto"), 72, 3, seed=11, shard_size="60KB")


def darken(image):
    """A sample_transform (module level: worker processes run it too)."""
    return image // 2


def _epochs(path, epochs: int, **options):
    """[(indices, images, labels)] of ``epochs`` epochs, and the Loader's last stats."""
    loader = Loader(Dataset(path), batch_size=4, seed=5, transforms=list(RECIPE),
                    return_index=True, **options)
    out = [(np.array(i), x.numpy().copy(), y.numpy().copy())
           for _ in range(epochs) for x, y, i in loader]
    stats = loader.stats()
    loader.close()
    return out, stats


def _same(a, b) -> None:
    assert len(a) == len(b)
    for (i1, x1, y1), (i2, x2, y2) in zip(a, b):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "restarted"])
def test_auto_yields_the_batches_of_every_fixed_setting(packed, fmt, persistent, caplog,
                                                      monkeypatch):
    monkeypatch.setattr(autotune.os, "sched_getaffinity", lambda pid: {0, 1})  # CI's 2 cores
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with caplog.at_level(logging.INFO, logger=autotune.__name__):
        auto, stats = _epochs(packed[fmt], 3, num_workers="auto", prefetch="auto",
                              sample_transform=darken, persistent_workers=persistent)
    threads, _ = _epochs(packed[fmt], 3, num_workers=2, sample_transform=darken)
    processes, _ = _epochs(packed[fmt], 3, num_workers=2, worker_kind="process",
                           sample_transform=darken)
    _same(auto, threads)
    _same(auto, processes)
    assert len(auto) == 3 * 18  # 72 images, batches of 4, three epochs
    # the trials (on 2 cores 1, 2, 4 threads, 2 processes, in three turns of 3, 3, 5 and 3
    # batches: 42 batches) fit in the 54 batches, so the setting is settled, logged once, and visible in the stats
    chosen = [r.getMessage() for r in caplog.records if "auto setting" in r.getMessage()]
    assert len(chosen) == 1
    assert stats.tuned in chosen[0]
    assert f"num_workers={stats.num_workers} worker_kind={stats.worker_kind!r}" in stats.tuned
    for setting in ("threads", "processes", "ms/batch", "CPU-ms/image"):
        assert setting in stats.tuned


def test_a_resume_in_the_middle_of_the_trials_reads_the_same_batches(packed, monkeypatch):
    monkeypatch.setattr(autotune.os, "sched_getaffinity", lambda pid: {0, 1})
    fixed, _ = _epochs(packed["jpeg"], 1, num_workers=1)
    loader = Loader(Dataset(packed["jpeg"]), batch_size=4, seed=5, transforms=list(RECIPE),
                    return_index=True, num_workers="auto")
    it = iter(loader)
    head = [(np.array(i), x.numpy().copy(), y.numpy().copy())
            for x, y, i in (next(it) for _ in range(9))]  # inside the third turn (4 threads)
    state = loader.state_dict()
    del it
    loader.close()
    again = Loader(Dataset(packed["jpeg"]), batch_size=4, seed=5, transforms=list(RECIPE),
                   return_index=True, num_workers="auto")
    again.load_state_dict(state)
    rest = [(np.array(i), x.numpy().copy(), y.numpy().copy()) for x, y, i in again]
    again.close()
    _same(head + rest, fixed)


def test_the_shortest_interval_wins_and_the_cheaper_setting_wins_a_tie():
    a, b = Trial("thread", 2, pieces=[0.10, 0.11, 0.10]), Trial("thread", 4, pieces=[0.08] * 3)
    c = Trial("process", 2, pieces=[0.05, 0.50, 0.06])  # one piece met a burst: the median
    assert (a.interval, c.interval) == (0.10, 0.06)
    assert choose([a, b, c]) is c
    c.pieces = [0.079] * 3  # within 5% of b's 0.08: b is listed first, so b wins
    assert choose([a, b, c]) is b
    assert choose([Trial("thread", 2), Trial("process", 2)]).kind == "thread"  # nothing measured


def test_the_jitter_measures_windows_of_the_workers_deliveries():
    steady = Trial("process", 2, [0.0, 0.2] * 4)  # two workers finishing together: steady
    assert steady.jitter() == pytest.approx(1.0)
    spike = Trial("thread", 2, [0.1, 0.1, 0.1, 0.1, 0.4, 0.4])
    assert spike.jitter() == pytest.approx(0.8 / (1.2 / 3))


def test_prefetch_auto_settles_on_twice_the_workers_scaled_by_the_jitter(packed):
    tuner = Tuner(LoaderOptions(num_workers=3, prefetch="auto"))
    assert [(t.kind, t.workers) for t in tuner.trials] == [("thread", 3)]
    tuner.trials[0].intervals = [0.1, 0.1, 0.1, 0.1, 0.1, 0.4]  # windows 0.3 and 0.6
    swapped = []
    engine = tuner.settle("engine", swapped.append)
    assert tuner.options.in_flight == math.ceil(2 * 3 * 0.6 / 0.45) == 8
    assert swapped == [tuner.options] and engine is None
    assert tuner.settled and "prefetch=8" in tuner.reason


def test_candidates_are_cheapest_first_and_share_the_node(monkeypatch):
    assert candidates(2, 1024) == [("thread", 1), ("thread", 2), ("thread", 4), ("process", 2)]
    assert candidates(2, 1024, processes=False) == [("thread", 1), ("thread", 2), ("thread", 4)]
    assert [t.kind for t in Tuner(LoaderOptions(num_workers="auto"), cores=2).trials] == \
        ["thread"] * 3  # no sample_transform: every heavy step releases the GIL
    assert Tuner(LoaderOptions(num_workers="auto", sample_transform=darken),
                 cores=2).trials[-1].kind == "process"
    assert candidates(1, 1024) == [("thread", 1), ("thread", 2), ("process", 1)]
    assert candidates(32, 40) == [("thread", 16), ("thread", 32), ("thread", 40),
                                  ("process", 32)]
    monkeypatch.setattr(autotune.os, "sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert autotune.usable_cores() == 4  # 8 ranks on a 32-core node: 4 cores each
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert autotune.usable_cores() == 1


def test_fixed_settings_are_not_tuned():
    tuner = Tuner(LoaderOptions(num_workers=3, worker_kind="process", prefetch=5))
    assert tuner.settled and tuner.reason == ""
    assert (tuner.options.num_workers, tuner.options.worker_kind, tuner.options.in_flight) == \
        (3, "process", 5)
    assert Tuner(LoaderOptions(num_workers=0, prefetch="auto")).settled


@pytest.mark.parametrize("options, message", [
    (dict(num_workers="many"), "num_workers='many': expected a count or 'auto'"),
    (dict(prefetch="deep"), "prefetch='deep': expected a count or 'auto'"),
    (dict(prefetch="auto", prefetch_factor=2), "pass one"),
])
def test_other_words_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        LoaderOptions(**options)


def test_a_shifted_prefetch_handle_sees_the_epochs_batch_numbers():
    calls = []

    class Handle:
        def wait(self, k, timeout=None):
            calls.append(("wait", k))

        def ready(self, k):
            calls.append(("ready", k))
            return True

        def release(self, k):
            calls.append(("release", k))

    handle = Handle()
    assert Shifted(handle, 0) is handle and Shifted(None, 4) is None
    shifted = Shifted(handle, 4)
    shifted.wait(0), shifted.ready(1), shifted.release(2)
    assert calls == [("wait", 4), ("ready", 5), ("release", 6)]
