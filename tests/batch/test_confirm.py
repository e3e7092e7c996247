"""num_workers="auto"'s later check (trials.Check): a challenger the trials chose over the
incumbent (the default, 2 threads) meets it again in equal pieces taken in turns; the
challenger stays only when its median is again more than CLEAR faster, else the incumbent
returns; the check ends once a third round could not change the verdict, and the batches
(indices, pixels, labels) stay those of a fixed setting throughout.

The Loader runs on a clock of the test's own (autotune's ``time``): each batch's step
advances it by a cost that depends on the setting delivering it (loader.stats()) and on the
epoch, so every interval the tuner measures is exact and no test waits for time."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Loader, Output, RandomHorizontalFlip, RandomResizedCrop
from dlpack_io.reader.batch import autotune
from dlpack_io.reader.batch.trials import CLEAR, Check, Trial, certain, choose

from helpers import StepClock, batches_equal, pack_jpeg_and_raw

RECIPE = (RandomResizedCrop(24), RandomHorizontalFlip())
# seconds per batch as the loop sees it, per setting: in the trials (epoch 0) 2 processes
# are fastest, clearly faster than the incumbent 2 threads (none more than DROP slower: all
# keep their turns)
TRIALS = {("thread", 1): 14.0, ("thread", 2): 12.0, ("thread", 4): 13.0, ("process", 2): 10.0}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("confirm"), 72, 3, seed=11,
                             shard_size="60KB")



def _run(path, monkeypatch, later: dict, epochs: int = 3, trials: dict = TRIALS, **options):
    """[(indices, images, labels)] of ``epochs`` epochs of batch 2 (36 batches an epoch),
    each step costing TRIALS in epoch 0 and ``later`` (falling back on TRIALS) after it;
    also the setting that delivered each batch and the Loader's last stats."""
    clock = StepClock()
    monkeypatch.setattr(autotune, "time", clock)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # CI's 2 cores
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    loader = Loader(Dataset(path), batch_size=2, seed=5, transforms=list(RECIPE),
                    output=Output(return_index=True), num_workers="auto", **options)
    out, used = [], []
    for epoch in range(epochs):
        for x, y, i in loader:
            out.append((np.array(i), x.numpy().copy(), y.numpy().copy()))
            s = loader.stats()
            used.append((epoch, s.worker_kind, s.num_workers))
            costs = trials if epoch == 0 else {**trials, **later}
            clock.now += costs[(s.worker_kind, s.num_workers)]  # the step
    stats = loader.stats()
    loader.close()
    return out, used, stats


def _fixed(path, epochs: int = 3) -> list:
    loader = Loader(Dataset(path), batch_size=2, seed=5, transforms=list(RECIPE),
                    output=Output(return_index=True), num_workers=2)
    out = [(np.array(i), x.numpy().copy(), y.numpy().copy())
           for _ in range(epochs) for x, y, i in loader]
    loader.close()
    return out



def test_the_incumbent_returns_when_the_challenger_is_slower_later_and_the_batches_stay(
        packed, monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger=autotune.__name__):
        got, used, stats = _run(packed["raw"], monkeypatch, {("process", 2): 20.0})
    batches_equal(got, _fixed(packed["raw"]))
    # epoch 0: a warm-up turn, then the trials in turns of 4 batches (a candidate whose
    # workers start takes an untimed turn first) until the epoch ends in round two; they
    # settle on 2 processes; the incumbent's threads stay parked. epoch 1: a warm-up turn
    # of 2 processes, then 2 processes, 2 threads, twice; 20 s against 12 s in both
    # rounds, so a third could not change the verdict: 2 threads from batch 20 on
    p, t = [("process", 2)] * 4, [("thread", 2)] * 4
    assert [u[1:] for u in used if u[0] == 1] == p * 2 + t + p + t * 5
    assert {u[1:] for u in used if u[0] == 2} == {("thread", 2)}
    lines = [r.getMessage() for r in caplog.records if "auto setting" in r.getMessage()]
    assert len(lines) == 2 and "num_workers=2 worker_kind='process' prefetch=4" in lines[0]
    assert stats.tuned == lines[1].split("checked later: ", 1)[1]
    assert stats.tuned.startswith("num_workers=2 worker_kind='thread' prefetch=4 (measured: "
                                  "1 thread 14000.0 ms/batch")
    assert stats.tuned.endswith(
        "; checked later: switched back to 2 threads: 2 processes 20000.0 ms/batch, 2 threads "
        "12000.0 ms/batch (medians of 2 and 2 turns of 4 batches, taken in turns; a setting "
        "replaces the default 2 threads only when 5% faster, in the trials and again here))")
    assert (stats.worker_kind, stats.num_workers) == ("thread", 2)


@pytest.mark.parametrize("later,kept", [({}, True), ({("process", 2): 9.8, ("thread", 2): 10.0},
                                                 False)],
                         ids=["clearly-faster-again", "within-the-margin"])
def test_the_challenger_stays_only_when_clearly_faster_again(packed, monkeypatch, later, kept):
    got, used, stats = _run(packed["jpeg"], monkeypatch, later, epochs=2)
    batches_equal(got, _fixed(packed["jpeg"], 2))
    # 9.8 s is 2% faster than 10 s: not enough (CLEAR 5%); after two rounds of steady
    # pieces a third could not change that, so the check ends there and the incumbent
    # returns; 10 s against 12 s is clear, and 2 processes stay
    p, t = [("process", 2)] * 4, [("thread", 2)] * 4
    rest = p * 4 if kept else t * 4
    assert [u[1:] for u in used if u[0] == 1] == p * 2 + t + p + t + rest
    won = "kept 2 processes" if kept else "switched back to 2 threads"
    assert stats.tuned.startswith("num_workers=2 worker_kind="
                                  f"{'process' if kept else 'thread'!r} prefetch=4")
    assert f"; checked later: {won}: 2 processes " \
        f"{later.get(('process', 2), 10.0) * 1000:.1f} ms/batch, 2 threads " \
        f"{later.get(('thread', 2), 12.0) * 1000:.1f} ms/batch (medians of 2 and 2 turns" \
        in stats.tuned


def test_an_epoch_too_short_for_the_check_never_runs_it(packed, monkeypatch):
    # on 2 cores an epoch that holds the trials' first round (32 batches) holds the check
    # too (at most 32 with its warm-up turn); made longer than these 36-batch epochs, it
    # waits for an epoch that holds it, which never comes: the choice stays
    monkeypatch.setattr(Check, "length", lambda self: 33)
    got, used, stats = _run(packed["raw"], monkeypatch, {("process", 2): 20.0})
    assert len(got) == 3 * 36
    assert {u[1:] for u in used if u[0] >= 1} == {("process", 2)}
    assert stats.tuned.startswith("num_workers=2 worker_kind='process'")
    assert "checked later" not in stats.tuned


def test_four_threads_lucky_in_the_trials_on_two_busy_cores_give_way_to_the_default(
        packed, monkeypatch):
    """4 threads won the trials on 2 cores by 8% (a quiet moment); later, with the cores busy,
    they run at half the default's rate: the check hands the rest of the run back to the
    default 2 threads, and no batch changes."""
    lucky = {("thread", 1): 14.0, ("thread", 2): 12.0, ("thread", 4): 11.0,
             ("process", 2): 13.0}
    got, used, stats = _run(packed["raw"], monkeypatch, {("thread", 4): 22.0}, epochs=2,
                            trials=lucky)
    batches_equal(got, _fixed(packed["raw"], 2))
    assert {u[1:] for u in used[-16:]} == {("thread", 2)}
    assert stats.tuned.startswith("num_workers=2 worker_kind='thread' prefetch=4")
    assert "checked later: switched back to 2 threads: 4 threads 22000.0 ms/batch, 2 " \
        "threads 12000.0 ms/batch" in stats.tuned


def test_a_challenger_replaces_the_incumbent_only_when_clearly_faster():
    incumbent = Trial("thread", 2, pieces=[0.100, 0.100, 0.100])
    four, procs = Trial("thread", 4, pieces=[0.097] * 3), Trial("process", 2, pieces=[0.099] * 3)
    assert choose([incumbent, four, procs], incumbent) is incumbent   # 3% faster: not clear
    four.pieces = [0.094] * 3
    assert choose([incumbent, four, procs], incumbent) is four        # 6% faster: clear
    dropped = Trial("thread", 1, pieces=[0.05], dropped=True)
    assert choose([incumbent, dropped], incumbent) is dropped or CLEAR == 0.05
    assert choose([incumbent, Trial("thread", 8)], incumbent) is incumbent  # unmeasured


def test_the_check_ends_when_a_third_round_could_not_change_the_verdict():
    assert not certain([1.0], [2.0])                      # one round: never
    assert certain([0.9, 0.9], [1.0, 1.0])                # always more than 5% faster: stays
    assert certain([1.0, 0.98], [1.0, 1.01])              # never 5% faster: incumbent returns
    assert not certain([0.9, 0.97], [1.0, 1.0])           # a third piece may decide
    assert not certain([0.96, 0.9], [1.0, 1.0])


def test_the_check_takes_turns_and_decides_on_medians():
    check = Check.of(Trial("process", 2, span=4), Trial("thread", 2, span=4), "p", "t", gap=16)
    assert check.length() == 28 and check.gap == 16
    assert (check.options(check.kept), check.options(check.other)) == ("p", "t")
    order = []
    for piece in (1.0, 1.0, 0.9, 1.0, 1.0, 0.98):  # the challenger, the incumbent, in turns
        turn = check.next_turn()
        order.append(turn is check.kept)
        turn.pieces.append(piece)
    assert order == [True, False] * 3 and check.next_turn() is None
    assert check.kept.interval == 1.0 and check.winner() is check.other  # not faster: back
    check.kept.pieces = [0.9, 0.94, 0.95]
    assert 0.94 < 1.0 * (1 - CLEAR) and check.winner() is check.kept
    again = check.fresh()
    assert again.kept.pieces == [] and again.options(again.other) == "t"
    assert (again.kept.kind, again.kept.workers, again.kept.span) == ("process", 2, 4)


def test_a_check_cut_short_starts_over_and_a_state_saved_in_it_resumes(packed, monkeypatch):
    clock = StepClock()
    monkeypatch.setattr(autotune, "time", clock)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    options = dict(batch_size=2, seed=5, transforms=list(RECIPE), return_index=True)
    loader = Loader(Dataset(packed["raw"]), num_workers="auto", **options)
    got, used = [], []

    def take(x, y, i, epoch):
        got.append((np.array(i), x.numpy().copy(), y.numpy().copy()))
        s = loader.stats()
        used.append((epoch, s.worker_kind, s.num_workers))
        slow = {("process", 2): 20.0} if epoch else {}
        clock.now += {**TRIALS, **slow}[(s.worker_kind, s.num_workers)]

    for x, y, i in loader:  # epoch 0: the trials settle on 2 processes
        take(x, y, i, 0)
    for x, y, i in loader:  # epoch 1: the check, cut short in the incumbent's first turn
        take(x, y, i, 1)  # (8-11: after the warm-up, 0-3, and 2 processes, 4-7)
        if len(got) == 36 + 10:
            break
    state = loader.state_dict()
    assert "checked later" not in loader.stats().tuned
    for x, y, i in loader:  # epoch 2: the check starts over, whole, and switches
        take(x, y, i, 2)
    loader.close()
    # the chosen setting's workers again (the incumbent's were running), then the turns
    p, t = [("process", 2)] * 4, [("thread", 2)] * 4
    assert [u[1:] for u in used if u[0] == 2] == p * 2 + t + p + t * 5
    assert loader.stats().tuned.count("checked later") == 1
    fixed = _fixed(packed["raw"])
    batches_equal(got, fixed[:46] + fixed[72:])
    again = Loader(Dataset(packed["raw"]), num_workers="auto", **options)
    again.load_state_dict(state)  # the rest of epoch 1, 26 batches: too few for trials
    rest = [(np.array(i), x.numpy().copy(), y.numpy().copy()) for x, y, i in again]
    again.close()
    batches_equal(got[:46] + rest, fixed[:72])
