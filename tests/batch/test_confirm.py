"""num_workers="auto"'s later check (confirm.py): once settled, the chosen setting and the
runner-up take equal pieces in turns again; the runner-up takes over only when its median
is more than MARGIN faster, the check ends once a third round could not change the verdict,
and the batches (indices, pixels, labels) stay those of a fixed setting throughout.

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
from dlpack_io.reader.batch.trials import MARGIN, Check, certain, runner_up
from dlpack_io.reader.batch.trials import Trial

from helpers import StepClock, batches_equal, pack_jpeg_and_raw

RECIPE = (RandomResizedCrop(24), RandomHorizontalFlip())
# seconds per batch as the loop sees it, per setting: in the trials (epoch 0) 2 processes
# are fastest and 2 threads the runner-up (none more than DROP slower: all keep their turns)
TRIALS = {("thread", 1): 14.0, ("thread", 2): 12.0, ("thread", 4): 13.0, ("process", 2): 10.0}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("confirm"), 72, 3, seed=11,
                             shard_size="60KB")



def _run(path, monkeypatch, later: dict, epochs: int = 3, **options):
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
            costs = TRIALS if epoch == 0 else {**TRIALS, **later}
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



def test_a_runner_up_clearly_faster_later_takes_over_and_the_batches_stay(packed, monkeypatch,
                                                                         caplog):
    with caplog.at_level(logging.INFO, logger=autotune.__name__):
        got, used, stats = _run(packed["raw"], monkeypatch, {("process", 2): 20.0})
    batches_equal(got, _fixed(packed["raw"]))
    # epoch 0: a warm-up turn, then the trials in turns of 4 batches (a candidate whose
    # workers start takes an untimed turn first) until the epoch ends in round two; they
    # settle on 2 processes; the runner-up's threads stay parked. epoch 1: a warm-up turn
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
        "; checked later: switched to 2 threads: 2 processes 20000.0 ms/batch, 2 threads "
        "12000.0 ms/batch (medians of 2 and 2 turns of 4 batches, taken in turns; the "
        "runner-up takes over when 3% faster))")
    assert (stats.worker_kind, stats.num_workers) == ("thread", 2)


@pytest.mark.parametrize("later", [{}, {("thread", 2): 9.8}],
                         ids=["unchanged", "within-the-margin"])
def test_the_choice_stays_unless_the_runner_up_beats_it_by_the_margin(packed, monkeypatch,
                                                                      later):
    got, used, stats = _run(packed["jpeg"], monkeypatch, later, epochs=2)
    batches_equal(got, _fixed(packed["jpeg"], 2))
    # 9.8 s is 2% faster than 10 s: not enough (MARGIN 3%); after two rounds of steady
    # pieces a third could not change that, so the check ends there and 2 processes stay
    p, t = [("process", 2)] * 4, [("thread", 2)] * 4
    assert [u[1:] for u in used if u[0] == 1] == p * 2 + t + p + t + p * 4
    assert stats.tuned.startswith("num_workers=2 worker_kind='process' prefetch=4")
    assert "; checked later: kept 2 processes: 2 processes 10000.0 ms/batch, 2 threads " \
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


def test_the_runner_up_is_the_fastest_other_candidate_the_trials_kept():
    best, slow, second = Trial("process", 2, pieces=[0.1]), Trial("thread", 1, pieces=[0.14]), \
        Trial("thread", 2, pieces=[0.12])
    dropped, skipped = Trial("thread", 4, pieces=[0.05], dropped=True), Trial("thread", 8)
    assert runner_up([slow, best, second, dropped, skipped], best) is second
    assert runner_up([best, dropped], best) is None


def test_the_check_ends_when_a_third_round_could_not_change_the_verdict():
    assert not certain([1.0], [2.0])                      # one round: never
    assert certain([1.0, 1.0], [1.2, 0.98])               # the runner-up never 3% faster
    assert not certain([1.0, 1.0], [1.2, 0.96])           # a third piece may decide
    assert certain([1.0, 1.1], [0.9, 0.96])               # always more than 3% faster
    assert not certain([1.0, 1.1], [0.9, 0.98])


def test_the_check_takes_turns_and_decides_on_medians():
    check = Check.of(Trial("process", 2, span=4), Trial("thread", 2, span=4), "p", "t", gap=16)
    assert check.length() == 28 and check.gap == 16
    assert (check.options(check.kept), check.options(check.other)) == ("p", "t")
    order = []
    for piece in (1.0, 1.0, 1.0, 0.9, 1.0, 0.98):  # kept, runner-up, in turns
        turn = check.next_turn()
        order.append(turn is check.kept)
        turn.pieces.append(piece)
    assert order == [True, False] * 3 and check.next_turn() is None
    assert check.other.interval == 0.98 and check.winner() is check.kept  # 2% < MARGIN
    check.other.pieces = [0.9, 0.94, 0.95]
    assert 0.94 < 1.0 * (1 - MARGIN) and check.winner() is check.other
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
    for x, y, i in loader:  # epoch 1: the check, cut short in the runner-up's first turn
        take(x, y, i, 1)  # (8-11: after the warm-up, 0-3, and 2 processes, 4-7)
        if len(got) == 36 + 10:
            break
    state = loader.state_dict()
    assert "checked later" not in loader.stats().tuned
    for x, y, i in loader:  # epoch 2: the check starts over, whole, and switches
        take(x, y, i, 2)
    loader.close()
    # the chosen setting's workers again (the runner-up's were running), then the turns
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
