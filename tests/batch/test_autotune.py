"""num_workers="auto" / prefetch="auto": the Loader settles its own setting on the first
batches, says what it chose and why, and never changes a batch (same indices and pixels as
a fixed setting, threads or processes, across epochs and across a resume)."""
from __future__ import annotations

import logging
import math
import os

import numpy as np
import pytest

from dlpack_io.reader import (Dataset, Loader, LoaderOptions, Output, RandomHorizontalFlip,
                              RandomResizedCrop, Workers)
from dlpack_io.reader.batch import autotune
from dlpack_io.reader.batch import loader as loader_mod
from dlpack_io.reader.batch.autotune import (Shifted, Trial, Tuner, candidates, choose,
                                             converged, drop_losers)
from dlpack_io.reader.batch.autotune import EnginePool
from dlpack_io.reader.batch.workers import ProcessRunner
from dlpack_io.reader.batch.workers import ThreadRunner

from helpers import StepClock, batches_equal, pack_jpeg_and_raw

RECIPE = (RandomResizedCrop(24), RandomHorizontalFlip())


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("auto"), 72, 3, seed=11, shard_size="60KB")


def darken(image):
    """A sample_transform (module level: worker processes run it too)."""
    return image // 2


def _epochs(path, epochs: int, batch_size: int = 4, **options):
    """[(indices, images, labels)] of ``epochs`` epochs, and the Loader's last stats."""
    loader = Loader(Dataset(path), batch_size=batch_size, seed=5, transforms=list(RECIPE),
                    output=Output(return_index=True), **options)
    out = [(np.array(i), x.numpy().copy(), y.numpy().copy())
           for _ in range(epochs) for x, y, i in loader]
    stats = loader.stats()
    loader.close()
    return out, stats



@pytest.mark.parametrize("fmt", ["jpeg", "raw"])
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "restarted"])
def test_auto_yields_the_batches_of_every_fixed_setting(packed, fmt, persistent, caplog,
                                                      monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # CI's 2 cores
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with caplog.at_level(logging.INFO, logger=autotune.__name__):
        auto, stats = _epochs(packed[fmt], 3, 2, num_workers="auto", prefetch="auto",
                              sample_transform=darken, persistent_workers=persistent)
    threads, _ = _epochs(packed[fmt], 3, 2, num_workers=2, sample_transform=darken)
    processes, _ = _epochs(packed[fmt], 3, 2, num_workers=2, worker_kind="process",
                           sample_transform=darken)
    batches_equal(auto, threads)
    batches_equal(auto, processes)
    assert len(auto) == 3 * 36  # 72 images, batches of 2, three epochs
    # the trials (on 2 cores a warm-up turn, then 2, 4 threads, 1 thread and 2 processes
    # unless skipped, in turns of 4 batches) run in the first epoch of 36 batches, which
    # settles the setting: logged once, and visible in the stats (a skipped candidate with
    # its reason); the check against the runner-up (epoch 1 holds it) logs once more
    chosen = [r.getMessage() for r in caplog.records if "auto setting" in r.getMessage()]
    assert chosen[0].startswith("Loader auto setting: num_workers=")
    assert len(chosen) == 1 + ("checked later" in stats.tuned)
    assert stats.tuned in chosen[-1]
    assert f"num_workers={stats.num_workers} worker_kind={stats.worker_kind!r}" in stats.tuned
    for setting in ("threads", "processes", "ms/batch", "CPU-ms/image"):
        assert setting in stats.tuned


@pytest.mark.parametrize("stop", [11, 34], ids=["in-round-one", "in-round-two"])
def test_a_resume_in_the_middle_of_the_trials_reads_the_same_batches(packed, monkeypatch,
                                                                     stop):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    made, real = [], loader_mod.make_engine
    monkeypatch.setattr(loader_mod, "make_engine",
                        lambda o, *args: _counted(made, real, o, *args))
    options = dict(batch_size=2, seed=5, transforms=list(RECIPE), return_index=True,
                   sample_transform=darken)
    fixed = _read(Loader(Dataset(packed["jpeg"]), num_workers=2, workers=Workers(kind="process"),
                         **options))
    made.clear()
    loader = Loader(Dataset(packed["jpeg"]), num_workers="auto", **options)
    it = iter(loader)  # a warm-up of 4 batches, then turns of 4: 2 threads, 4, then 1 and
    # 2 processes unless skipped (an untimed turn first for each); round two from 32
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
    batches_equal(head + rest, fixed)
    assert len(fixed) == 36


def _counted(made, make_engine, o, *args):
    made.append((o.workers.kind, o.num_workers))
    return make_engine(o, *args)


def _read(loader) -> list:
    out = [(np.array(i), x.numpy().copy(), y.numpy().copy()) for x, y, i in loader]
    loader.close()
    return out


def test_an_epoch_too_short_for_the_trials_keeps_the_default_unmeasured(packed, caplog,
                                                                       monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with caplog.at_level(logging.INFO, logger=autotune.__name__):
        loader = Loader(Dataset(packed["raw"]), batch_size=8, seed=5, num_workers="auto",
                        workers=Workers(prefetch="auto"), output=Output(return_index=True),
                        transforms=list(RECIPE))
        got = _read(loader)  # 9 batches: a warm-up turn and one round of 4 turns of 4
    assert len(got) == 9
    assert loader.stats().tuned == ("num_workers=2 worker_kind='thread' prefetch=4 (not "
                                    "measured: an epoch of 9 batches is too short for the "
                                    "trials)")
    assert sum("auto setting" in r.getMessage() for r in caplog.records) == 1
    for cores in (1, 2, 32):  # the incumbent is the Loader's default, whatever the cores
        tuner = Tuner(LoaderOptions(num_workers="auto"), cores=cores)
        assert (tuner.fallback.kind, tuner.fallback.workers) == ("thread", 2)


def test_the_shortest_interval_wins_and_the_cheaper_setting_wins_a_tie():
    a, b = Trial("thread", 2, pieces=[0.10, 0.11, 0.10]), Trial("thread", 4, pieces=[0.08] * 3)
    c = Trial("process", 2, pieces=[0.05, 0.50, 0.06])  # one piece met a burst: the median
    assert (a.interval, c.interval) == (0.10, 0.06)
    assert choose([a, b, c]) is c
    c.pieces = [0.079] * 3  # b's 0.08 within 2% of it: b is listed first, so b wins
    assert choose([a, b, c]) is b
    c.pieces = [0.078] * 3  # b 2.6% slower: no longer equal
    assert choose([a, b, c]) is c
    c.pieces = [0.079] * 3
    assert choose([a, b, c]) is b
    assert choose([Trial("thread", 2), Trial("process", 2)]).kind == "thread"  # nothing measured


def test_the_jitter_measures_windows_of_two_rounds_of_the_workers_batches():
    steady = Trial("process", 2, builds=[0.1, 0.3] * 4)  # every 4 batches cost 0.8
    assert steady.jitter() == pytest.approx(1.0)
    spike = Trial("thread", 2, builds=[0.1] * 8 + [0.4, 0.4, 0.4, 0.4])
    assert spike.jitter() == pytest.approx(1.6 / (2.4 / 3))
    assert Trial("thread", 2, builds=[0.1] * 5).jitter() == 1.0  # one window: no spread
    assert Trial("thread", 2).jitter() == 1.0  # nothing measured: no raise


def test_prefetch_auto_settles_on_twice_the_workers_scaled_by_a_large_jitter(packed):
    tuner = Tuner(LoaderOptions(num_workers=3, workers=Workers(prefetch="auto")))
    assert [(t.kind, t.workers) for t in tuner.trials] == [("thread", 3)]
    tuner.trials[0].builds = [0.1] * 23 + [2.5]  # windows of 6: 0.6, 0.6, 0.6 and 3.0
    swapped = []
    engine = tuner.settle("engine", swapped.append)
    assert tuner.options.in_flight == min(4 * 3, math.ceil(2 * 3 * 3.0 / 1.2)) == 12
    assert swapped == [tuner.options] and engine is None
    assert tuner.settled and "prefetch=12" in tuner.reason


def test_prefetch_auto_keeps_twice_the_workers_under_a_small_jitter(packed):
    tuner = Tuner(LoaderOptions(num_workers=3, workers=Workers(prefetch="auto")))
    tuner.trials[0].builds = [0.1] * 11 + [1.0]  # jitter 1.5 / 1.05 < 2
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


def test_two_rounds_of_equals_or_of_a_clear_lead_end_the_trials_early():
    a, b = Trial("thread", 2, pieces=[0.100]), Trial("thread", 4, pieces=[0.101])
    slow = Trial("thread", 1, pieces=[0.3], dropped=True)
    assert not converged([slow, a, b])  # one round: not yet
    a.pieces.append(0.100)
    assert not converged([slow, a, b])  # b is in the middle of its second round
    b.pieces.append(0.101)
    assert converged([slow, a, b])  # within 2% of each other; the dropped one is not asked
    b.pieces = [0.103, 0.103]
    assert converged([slow, a, b])  # 3% behind in both rounds: a third cannot change that
    b.pieces = [0.099, 0.110]
    assert not converged([slow, a, b])  # b's turns straddle a's: a third round decides
    b.pieces = [0.103, 0.110]
    assert converged([slow, a, b])  # b's fastest turn is more than 2% behind a's slowest
    a.pieces = [0.100, 0.102]
    assert not converged([slow, a, b])  # 0.103 is within 2% of 0.102: not clear yet


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
    assert candidates(32, 40) == [("thread", 2), ("thread", 16), ("thread", 32),
                                  ("thread", 40), ("process", 32)]  # the default among them
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert autotune.usable_cores() == 4  # 8 ranks on a 32-core node: 4 cores each
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert autotune.usable_cores() == 1


def test_fixed_settings_are_not_tuned():
    tuner = Tuner(LoaderOptions(num_workers=3, workers=Workers(kind="process", prefetch=5)))
    assert tuner.settled and tuner.reason == ""
    assert (tuner.options.num_workers, tuner.options.workers.kind, tuner.options.in_flight) == \
        (3, "process", 5)
    assert Tuner(LoaderOptions(num_workers=0, workers=Workers(prefetch="auto"))).settled


def test_other_words_are_refused():
    from dlpack_io.reader.batch.options import options_from

    with pytest.raises(ValueError, match="num_workers='many': expected a count or 'auto'"):
        LoaderOptions(num_workers="many")
    with pytest.raises(ValueError, match="prefetch='deep': expected a count or 'auto'"):
        Workers(prefetch="deep")
    with pytest.raises(ValueError, match="pass one"):
        options_from({"workers": Workers(prefetch="auto")}, {"prefetch_factor": 2})


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



def test_every_turn_is_whole_starts_empty_and_reads_the_same_batches(packed, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for rule in ("skip", "drop_losers"):  # every candidate takes every turn: a fixed schedule
        monkeypatch.setattr(autotune, rule, lambda *args: None)
    monkeypatch.setattr(autotune, "converged", lambda trials: False)
    clock = StepClock()
    monkeypatch.setattr(autotune, "time", clock)
    events = []  # ("submit", ticket, runner) from the loader, ("got", k) from the loop
    for runner in (ThreadRunner, ProcessRunner):
        monkeypatch.setattr(runner, "submit", _recorded(events, runner.submit))
    cost = {("thread", 1): 14.0, ("thread", 2): 12.0, ("thread", 4): 13.0, ("process", 2): 10.0}
    options = dict(batch_size=2, seed=5, transforms=list(RECIPE), return_index=True)
    loader = Loader(Dataset(packed["raw"]), num_workers="auto", **options)
    auto = []
    for k, (x, y, i) in enumerate(loader):
        auto.append((np.array(i), x.numpy().copy(), y.numpy().copy()))
        events.append(("got", k))
        s = loader.stats()
        clock.now += cost[(s.worker_kind, s.num_workers)]  # the step, as the setting costs
    tuned = loader.stats().tuned
    loader.close()
    submits = [e[1] for e in events if e[0] == "submit"]
    batches_equal(auto, _read(Loader(Dataset(packed["raw"]), num_workers=1, **options)))
    assert sorted(submits) == list(range(36))  # every batch submitted once
    # 36 batches: a warm-up of 4 (2 threads), then turns of 4 batches: 2 threads, 4, 1
    # threads and 2 processes (each started engine's first turn untimed, before its timed
    # one), and 2 threads again from 32; no turn's batch is submitted before the turn
    # before it has delivered its last (an empty pipeline at every turn's start)
    for first in range(4, 36, 4):
        assert events.index(("got", first - 1)) < next(
            n for n, e in enumerate(events) if e[:2] == ("submit", first))
    # each turn is timed whole, steps included: its seconds per batch are the step's cost
    assert tuned.startswith("num_workers=2 worker_kind='process' prefetch=4 (measured: "
                            "1 thread 14000.0 ms/batch ")
    assert "2 threads 12000.0 ms/batch" in tuned and "4 threads 13000.0 ms/batch" in tuned
    assert "2 processes 10000.0 ms/batch" in tuned


def _recorded(events, submit):
    def recording(self, ticket, indices, epoch):
        events.append(("submit", ticket, id(self)))
        return submit(self, ticket, indices, epoch)
    return recording


def test_the_pool_keeps_the_runner_ups_engine_parked_for_the_check():
    made = []
    pool = EnginePool(make=lambda o: made.append(FakeEngine(o.num_workers)) or made[-1])
    pool.parking = True
    one, two, four = (LoaderOptions(num_workers=n) for n in (1, 2, 4))
    e1 = pool.swap(None, one)
    e2 = pool.swap(e1, two)
    e4 = pool.swap(e2, four)
    pool.parking, pool.spare = False, ("thread", 2, two.in_flight)  # settled on 1 thread
    assert pool.swap(e4, one) is e1 and not pool.fresh  # parked, not restarted
    assert (e2.closed, e4.closed) == (False, True) and list(pool.idle) == [pool.spare]
    pool.parking = True  # the check: the runner-up's parked workers take their turn
    assert pool.swap(e1, two) is e2 and not pool.fresh and len(made) == 3
    pool.parking = False  # the chosen one again: the spare, running, is parked, not closed
    assert pool.swap(e2, one) is e1 and not e2.closed and list(pool.idle) == [pool.spare]
    pool.close()  # the Loader's close: every parked engine, the spare's too
    assert e2.closed and not e1.closed and pool.idle == {}  # e1 runs: the Loader's to close
