"""num_workers="auto" / prefetch="auto": the Loader settles its own setting on the first
batches, says what it chose and why, and never changes a batch (same indices and pixels as
a fixed setting, threads or processes, across epochs and across a resume)."""
from __future__ import annotations

import logging
import math
import os

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Loader, LoaderOptions, RandomHorizontalFlip, RandomResizedCrop
from dlpack_io.reader.batch import autotune
from dlpack_io.reader.batch import loader as loader_mod
from dlpack_io.reader.batch.autotune import (Shifted, Trial, Tuner, candidates, choose,
                                             converged, drop_losers)
from dlpack_io.reader.batch.engine import prime
from dlpack_io.reader.batch.enginepool import EnginePool
from dlpack_io.reader.batch.processes import ProcessRunner
from dlpack_io.reader.batch.runners import ThreadRunner

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
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # CI's 2 cores
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
    # the trials (on 2 cores 2, 4 threads, then 1 thread and 2 processes unless skipped,
    # in turns of 3 batches) run in the first epoch of 18 batches, which settles the
    # setting: logged once, and visible in the stats (a skipped candidate with its reason);
    # the check against the runner-up (epoch 1: its 18 batches hold it) logs once more
    chosen = [r.getMessage() for r in caplog.records if "auto setting" in r.getMessage()]
    assert chosen[0].startswith("Loader auto setting: num_workers=")
    assert len(chosen) == 1 + ("checked later" in stats.tuned)
    assert stats.tuned in chosen[-1]
    assert f"num_workers={stats.num_workers} worker_kind={stats.worker_kind!r}" in stats.tuned
    for setting in ("threads", "processes", "ms/batch", "CPU-ms/image"):
        assert setting in stats.tuned


@pytest.mark.parametrize("stop", [11, 17], ids=["in-round-one", "in-round-two"])
def test_a_resume_in_the_middle_of_the_trials_reads_the_same_batches(packed, monkeypatch,
                                                                     stop):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    made = []
    monkeypatch.setattr(loader_mod, "make_engine",
                        lambda o, *args: _counted(made, o, *args))
    options = dict(batch_size=2, seed=5, transforms=list(RECIPE), return_index=True,
                   sample_transform=darken)
    fixed = _read(Loader(Dataset(packed["jpeg"]), num_workers=2, worker_kind="process",
                         **options))
    made.clear()
    loader = Loader(Dataset(packed["jpeg"]), num_workers="auto", **options)
    it = iter(loader)  # turns of 3 batches: 2 threads, 4, then 1 and 2 processes unless skipped
    head = [(np.array(i), x.numpy().copy(), y.numpy().copy())
            for x, y, i in (next(it) for _ in range(stop))]
    state = loader.state_dict()
    del it
    loader.close()
    # every candidate's engine started once: parked between turns, never restarted per turn
    # (1 thread and 2 processes only if the first look did not skip them: trials.skip)
    assert made[:2] == [("thread", 2), ("thread", 4)] and len(set(made)) == len(made)
    assert set(made) <= {("thread", 1), ("thread", 2), ("thread", 4), ("process", 2)}
    again = Loader(Dataset(packed["jpeg"]), num_workers="auto", **options)
    again.load_state_dict(state)  # 36 - stop batches left: trials again, then settled
    rest = _read(again)
    assert again.stats().tuned.startswith("num_workers=")
    _same(head + rest, fixed)
    assert len(fixed) == 36


def _counted(made, o, *args):
    from dlpack_io.reader.batch.engine import make_engine

    made.append((o.worker_kind, o.num_workers))
    return make_engine(o, *args)


def _read(loader) -> list:
    out = [(np.array(i), x.numpy().copy(), y.numpy().copy()) for x, y, i in loader]
    loader.close()
    return out


def test_an_epoch_too_short_for_the_trials_keeps_cores_threads_unmeasured(packed, caplog,
                                                                          monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with caplog.at_level(logging.INFO, logger=autotune.__name__):
        loader = Loader(Dataset(packed["raw"]), batch_size=8, seed=5, num_workers="auto",
                        prefetch="auto", transforms=list(RECIPE), return_index=True)
        got = _read(loader)  # 9 batches: one round of trials is 4 turns of 3 batches
    assert len(got) == 9
    assert loader.stats().tuned == ("num_workers=2 worker_kind='thread' prefetch=4 (not "
                                    "measured: an epoch of 9 batches is too short for the "
                                    "trials)")
    assert sum("auto setting" in r.getMessage() for r in caplog.records) == 1
    one_core = Tuner(LoaderOptions(num_workers="auto"), cores=1)
    assert (one_core.fallback.kind, one_core.fallback.workers) == ("thread", 1)


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


def test_prefetch_auto_settles_on_twice_the_workers_scaled_by_a_large_jitter(packed):
    tuner = Tuner(LoaderOptions(num_workers=3, prefetch="auto"))
    assert [(t.kind, t.workers) for t in tuner.trials] == [("thread", 3)]
    tuner.trials[0].intervals = [0.1, 0.1, 0.1, 0.1, 0.1, 1.0]  # windows 0.3 and 1.2
    swapped = []
    engine = tuner.settle("engine", swapped.append)
    assert tuner.options.in_flight == math.ceil(2 * 3 * 1.2 / 0.75) == 10
    assert swapped == [tuner.options] and engine is None
    assert tuner.settled and "prefetch=10" in tuner.reason


def test_prefetch_auto_keeps_twice_the_workers_under_a_small_jitter(packed):
    tuner = Tuner(LoaderOptions(num_workers=3, prefetch="auto"))
    tuner.trials[0].intervals = [0.1, 0.1, 0.1, 0.1, 0.1, 0.4]  # jitter 0.6 / 0.45 < 1.5
    swapped = []
    assert tuner.settle("engine", swapped.append) == "engine"  # no restart for nothing
    assert tuner.options.in_flight == 6 and swapped == []


def test_a_round_drops_the_candidates_clearly_slower_than_the_best():
    a, b, c = Trial("thread", 1, pieces=[0.20]), Trial("thread", 2, pieces=[0.12]), \
        Trial("thread", 4, pieces=[0.10])
    late = Trial("process", 2)
    drop_losers([a, b, c, late])  # the round is not over: late has no piece yet
    assert not any(t.dropped for t in (a, b, c))
    late.pieces = [0.151]
    drop_losers([a, b, c, late])  # 0.20 and 0.151 > 1.5 x 0.10; 0.12 is within it
    assert [t.dropped for t in (a, b, c, late)] == [True, False, False, True]
    assert a.done() and not b.done()


def test_two_rounds_of_equals_end_the_trials_early():
    a, b = Trial("thread", 2, pieces=[0.100]), Trial("thread", 4, pieces=[0.104])
    slow = Trial("thread", 1, pieces=[0.3], dropped=True)
    assert not converged([slow, a, b])  # one round: not yet
    a.pieces.append(0.100)
    assert not converged([slow, a, b])  # b is in the middle of its second round
    b.pieces.append(0.104)
    assert converged([slow, a, b])  # within 5% of each other; the dropped one is not asked
    b.pieces = [0.11, 0.11]
    assert not converged([slow, a, b])  # 10% apart: a third round decides


class FakeEngine:
    def __init__(self, name):
        self.name, self.closed = name, False

    def close(self):
        self.closed = True


def test_the_pool_parks_engines_during_the_trials_and_closes_them_after():
    made = []

    def make(o):
        made.append(FakeEngine(o.num_workers))
        return made[-1]

    pool = EnginePool(make)
    one, two = LoaderOptions(num_workers=1), LoaderOptions(num_workers=2)
    pool.parking = True
    e1 = pool.swap(None, one)
    e2 = pool.swap(e1, two)
    assert pool.swap(e2, one) is e1 and not e1.closed  # parked, not restarted
    assert pool.swap(e1, two) is e2 and len(made) == 2
    pool.parking = False  # settled: the running one is swapped out and closed, with the rest
    e4 = pool.swap(e2, LoaderOptions(num_workers=4))
    assert (e1.closed, e2.closed, e4.closed) == (True, True, False) and pool.idle == {}


def test_candidates_are_cheapest_first_and_share_the_node(monkeypatch):
    assert candidates(2, 1024) == [("thread", 1), ("thread", 2), ("thread", 4), ("process", 2)]
    assert candidates(2, 1024, processes=False) == [("thread", 1), ("thread", 2), ("thread", 4)]
    assert [t.kind for t in Tuner(LoaderOptions(num_workers="auto"), cores=2).trials] == \
        ["thread"] * 3 + ["process"]  # raw records: the per-sample glue holds the GIL too
    assert candidates(1, 1024) == [("thread", 1), ("thread", 2), ("process", 1)]
    assert candidates(32, 40) == [("thread", 16), ("thread", 32), ("thread", 40),
                                  ("process", 32)]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)))
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


def test_the_next_turn_is_primed_and_reads_the_same_batches(packed, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    primed = []

    def counted(engine, batches, start, ticket0, epoch, count):
        primed.append((start, count))
        return prime(engine, batches, start, ticket0, epoch, count)

    monkeypatch.setattr(autotune, "prime", counted)
    for rule in ("skip", "drop_losers"):  # every candidate takes every turn: a fixed schedule
        monkeypatch.setattr(autotune, rule, lambda *args: None)
    monkeypatch.setattr(autotune, "converged", lambda trials: False)
    tickets = []  # every batch is submitted once: deliver goes on after the primed ones
    for runner in (ThreadRunner, ProcessRunner):
        monkeypatch.setattr(runner, "submit", _recorded(tickets, runner.submit))
    options = dict(batch_size=4, seed=5, transforms=list(RECIPE), return_index=True)
    auto = _read(Loader(Dataset(packed["raw"]), num_workers="auto", **options))
    assert sorted(t for _, t in tickets) == list(range(18))
    fixed = _read(Loader(Dataset(packed["raw"]), num_workers=1, **options))
    _same(auto, fixed)
    # 18 batches: round one is 2, 4, 1 threads, 2 processes, 3 batches each (engines started
    # at their turn, never for priming); round two's turns (2 threads at 12, 4 at 15) get
    # their first batch while the turn before builds its last; the epoch ends at 18
    assert primed == [(12, 1), (15, 1)]


def _recorded(tickets, submit):
    def recording(self, ticket, indices, epoch):
        tickets.append((id(self), ticket))
        return submit(self, ticket, indices, epoch)
    return recording


def test_the_pool_shows_a_parked_engine_and_never_starts_one_for_priming():
    made = []
    pool = EnginePool(make=lambda o: made.append(FakeEngine(o.num_workers)) or made[-1])
    pool.parking = True
    one, two = LoaderOptions(num_workers=1), LoaderOptions(num_workers=2)
    assert pool.parked(two) is None and made == []  # not started: its turn starts it
    first = pool.swap(None, one)
    second = pool.swap(first, two)
    assert pool.parked(one) is first and pool.parked(two) is None  # two is running
    assert pool.swap(second, one) is first and len(made) == 2 and not second.closed
