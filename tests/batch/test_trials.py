"""trials.py: equal turns for every candidate (a multiple of every worker count), ``cores``
threads first, and the first look at the host that skips the candidates it makes pointless
(fewer threads when the loop waits for data; processes when the threads kept every core busy
without a GIL-bound sample_transform)."""
from __future__ import annotations

from dlpack_io.reader import LoaderOptions
from dlpack_io.reader.batch.autotune import Tuner
from dlpack_io.reader.batch.trials import Trial, choose, describe, equal_turn, skip


def _first(step_s=0.0, cpu_s=0.0, user_s=0.0, stage_s=1.0, wall_s=1.0):
    return Trial("thread", 2, pieces=[0.01], wall_s=wall_s, step_s=step_s, cpu_s=cpu_s,
                 user_s=user_s, stage_s=stage_s)


def _others():
    return [Trial("thread", 1), Trial("thread", 4), Trial("process", 2)]


def test_a_loop_waiting_for_data_skips_fewer_threads_and_full_cores_skip_processes():
    one, four, procs = others = _others()
    first = _first(step_s=0.1, cpu_s=1.8)  # step 10% of the time, 90% of 2 cores busy
    skip([one, first, four, procs], first, cores=2)
    assert [t.dropped for t in others] == [True, False, True]
    assert one.skipped == "the loop waited for data: step 10% of each interval"
    assert procs.skipped == "2 threads kept 90% of 2 cores busy, sample_transform 0% of " \
        "the stage time"
    assert describe(one) == "1 thread skipped (the loop waited for data: step 10% of each " \
        "interval)"
    assert choose([first, one, four, procs]) is first  # skipped: never measured, never chosen


def test_a_busy_step_idle_cores_or_a_gil_bound_transform_keep_the_candidates():
    for first in (_first(step_s=0.25, cpu_s=1.0),            # step 25%, half the cores idle
                  _first(step_s=0.3, cpu_s=1.8, user_s=0.1)):  # GIL share 10%
        others = _others()
        skip(others + [first], first, cores=2)
        assert not any(t.dropped or t.skipped for t in others)
    unmeasured = _others()
    skip(unmeasured, _first(wall_s=0.0), cores=2)  # nothing measured: nothing skipped
    assert not any(t.dropped for t in unmeasured)


def test_every_candidate_gets_equal_pieces_and_cores_threads_go_first():
    tuner = Tuner(LoaderOptions(num_workers="auto"), cores=2)
    assert [(t.kind, t.workers, t.piece()) for t in tuner.trials] == \
        [("thread", 1, 4), ("thread", 2, 4), ("thread", 4, 4), ("process", 2, 4)]
    assert tuner.one_round() == 28  # an untimed first turn for every engine started
    order = []
    while (t := tuner.next_turn()) is not None and len(order) < 5:
        order.append((t.kind, t.workers))
        t.pieces.append(0.01)
    # 2 threads (its piece decides what to skip), 4 threads, then those skip may rule out
    assert order == [("thread", 2), ("thread", 4), ("thread", 1), ("process", 2),
                     ("thread", 2)]


def test_a_turn_is_a_multiple_of_every_candidates_workers():
    # w workers build a turn's batches w at a time: a turn of a multiple of every count ends
    # with no worker idle while the others finish, so whole turns compare like with like
    assert equal_turn([1, 2, 4, 2]) == 4        # 2 cores
    assert equal_turn([1, 2, 1]) == 4           # 1 core: at least 4
    assert equal_turn([8, 16, 32, 16]) == 32    # 16 cores
    assert equal_turn([16, 32, 40, 32]) == 80   # 32 cores, 40 workers at most: 2 x 40
    assert equal_turn([3, 7, 14, 7]) == 28      # lcm 42 > 2 x 14: 3 threads keep an edge
    assert equal_turn([0]) == 4 and equal_turn([]) == 4
