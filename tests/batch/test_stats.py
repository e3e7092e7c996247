"""loader.stats(): the stall figures are right, not just present (checked against the time
the test itself measures around next()), and the counts are exact."""
from __future__ import annotations

import datetime
import logging
import time

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Loader, RandomResizedCrop, Workers
from dlpack_io.reader.batch.stats import LoaderStats, LogSchedule, parse_log_every

from helpers import pack_jpeg_and_raw


SAMPLE_PAUSE = 0.005  # seconds of work per image (a sample_transform that sleeps)


def slow_sample(image):
    """A sample_transform of known cost (module level: worker processes run it too). It
    makes the no-step epoch wait ~0.1 s in all, so that a scheduler or GIL hiccup of a
    millisecond in the microseconds between the Loader's clock read at its yield and the
    test's own around next() cannot move wait_fraction by 0.05: with 48 bare 48x64 images
    the whole epoch waited ~5 ms, and a 0.8 ms hiccup under load moved it by 0.13."""
    time.sleep(SAMPLE_PAUSE)
    return image


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("stats"), 48, 3, seed=7, shard_size="60KB")


def _measured_epoch(loader, step_seconds: float):
    """Iterate one epoch; return (seconds inside next(), seconds outside, batches, images)."""
    inside = outside = 0.0
    batches = images = 0
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            x, _ = next(it)
        except StopIteration:
            inside += time.perf_counter() - t0
            break
        t1 = time.perf_counter()
        inside += t1 - t0
        batches, images = batches + 1, images + len(x)
        if step_seconds:
            time.sleep(step_seconds)  # the "training step": a known time outside next()
        outside += time.perf_counter() - t1
    return inside, outside, batches, images


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("step", [0.0, 0.03], ids=["no-step", "sleep-step"])
def test_wait_fraction_matches_the_wait_measured_around_next(packed, kind, step):
    loader = Loader(Dataset(packed["jpeg"]), batch_size=8, num_workers=2,
                    workers=Workers(kind=kind), transforms=[RandomResizedCrop(32)], seed=1,
                    sample_transform=slow_sample)
    inside, outside, batches, images = _measured_epoch(loader, step)
    if not step:
        assert inside >= 0.1  # long enough for the 0.05 bound to mean something
    stats = loader.stats()
    assert (stats.batches, stats.images) == (batches, images) == (6, 48)
    assert stats.wait_fraction == pytest.approx(inside / (inside + outside), abs=0.05)
    assert stats.wait_s + stats.step_s <= inside + outside + 0.01  # one clock, no double count
    assert stats.step_s == pytest.approx(outside, abs=0.02 + 0.05 * outside)
    if step:
        assert stats.step_s >= batches * step
    loader.close()


def test_run_adds_up_the_epochs_and_each_epoch_starts_afresh(packed):
    loader = Loader(Dataset(packed["raw"]), batch_size=10, num_workers=1, drop_last=False)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sum(len(x) for x, _ in loader) == 48
        stats = loader.stats()
        assert (stats.epoch, stats.batches, stats.images) == (epoch, 5, 48)
        assert (stats.run.batches, stats.run.images) == (5 * (epoch + 1), 48 * (epoch + 1))
    assert stats.run.wall_s >= stats.wall_s > 0
    assert stats.as_dict()["run"]["images"] == 96
    assert stats.as_dict()["wait_fraction"] == stats.wait_fraction
    loader.close()


def test_log_every_writes_the_line_every_n_batches(packed, caplog):
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=0,
                    workers=Workers(log_every=2))
    with caplog.at_level(logging.INFO, logger="dlpack_io.reader.batch.loader"):
        list(loader)
    lines = [r.getMessage() for r in caplog.records if "batches" in r.getMessage()]
    assert len(lines) == 3 and lines[0].startswith("Loader: epoch 0: 2 batches")
    assert "data-bound" in lines[-1]


@pytest.mark.parametrize("bad", [0, -3, "fast", "0s", True, 2.5])
def test_log_every_refuses_what_is_not_a_count_or_seconds(packed, bad):
    with pytest.raises(ValueError, match="log_every"):
        Loader(Dataset(packed["raw"]), workers=Workers(log_every=bad))


def test_the_verdict_names_the_remedy():
    bound = LoaderStats(wall_s=10, wait_s=3.4, step_s=6.6, cpu_s=19.6, consumer_cpu_s=0,
                        num_workers=2, images=1000, batches=4)
    assert bound.verdict() == ("data-bound: 34.0% of step time spent waiting for data; "
                               "workers busy 98%: more cores, device transforms or a cheaper "
                               "recipe would help")
    idle = LoaderStats(wall_s=10, wait_s=5, step_s=5, cpu_s=4, num_workers=4, images=1000,
                       batches=4)
    assert idle.verdict().endswith("workers busy 10%: workers idle part of the time: a "
                                   "deeper prefetch would help")
    fed = LoaderStats(wall_s=10, wait_s=0.04, step_s=9.96, num_workers=2, images=1000,
                      batches=4)
    assert fed.verdict() == "not data-bound: 0.4% of step time spent waiting for data"
    assert bound.cpu_ms_per_image == pytest.approx(19.6) and bound.images_per_s == 100
    assert fed.postfix() == {"wait": "0%", "img/s": "100"}


def test_no_batches_is_no_verdict(packed):
    """An epoch that yields nothing (drop_last with fewer samples than a batch), or stats
    asked before the first batch: no verdict, no NaN, no ZeroDivisionError."""
    fresh = Loader(Dataset(packed["raw"]), batch_size=100, drop_last=True, num_workers=1)
    assert fresh.stats().verdict() == "no batches delivered yet: nothing to judge"
    assert list(fresh) == []
    stats = fresh.stats()
    assert stats.verdict() == "no batches delivered yet: nothing to judge"
    assert str(stats).startswith("epoch 0: 0 batches, 0 images/s, 0.00 CPU-ms/image; no batches")
    assert "nan" not in str(stats).lower() and "nan" not in str(stats.as_dict()).lower()
    assert stats.postfix() == {"wait": "-", "img/s": "0"}
    fresh.close()


def test_saturated_workers_with_cores_to_spare_ask_for_more_workers():
    """Workers busy 98% on 2 of 16 cores: more workers help, up to one per core."""
    spare = LoaderStats(wall_s=10, wait_s=3.4, step_s=6.6, cpu_s=19.6, num_workers=2,
                        images=1000, batches=4, cores=16)
    assert spare.verdict() == ("data-bound: 34.0% of step time spent waiting for data; "
                               "workers busy 98%: more workers (num_workers=16, one per "
                               "core), device transforms or a cheaper recipe would help")
    full = LoaderStats(**{**vars(spare), "cores": 2})
    assert full.verdict().endswith("workers busy 98%: more cores, device transforms or a "
                                   "cheaper recipe would help")
    alone = LoaderStats(wall_s=10, wait_s=9.5, step_s=0.5, num_workers=0, images=1000,
                        batches=4, cores=2)
    assert "more workers (num_workers=2, one per core)" in alone.verdict()


@pytest.mark.parametrize("workers,kind,cores,tuned", [
    (4, "thread", 2, "num_workers=4 worker_kind='thread' prefetch=8 (measured: ...)"),
    (2, "process", 8, "num_workers=2 worker_kind='process' prefetch=4 (measured: ...)"),
    (1, "thread", 4, "measuring 1 thread, 2 threads, 4 threads, 2 processes"),
    (8, "thread", 2, ""), (3, "thread", 2, "")])
def test_advice_never_names_a_setting_in_use_nor_more_workers_than_cores(workers, kind, cores,
                                                                          tuned):
    """Whatever the figures, the advice never suggests num_workers='auto' to a loop using it,
    no worker count under auto (it chose the count) and never more workers than cores."""
    import re

    shapes = [dict(wall_s=10, wait_s=4, step_s=6, cpu_s=c, decode_s=d, user_s=u,
                   transforms_s=t) for c in (1, 9, 19.9) for d, u, t in
              ((9, 0, 1), (1, 9, 0), (1, 0, 9), (0, 0, 0))]
    for shape in shapes:
        stats = LoaderStats(**shape, num_workers=workers, worker_kind=kind, cores=cores,
                            tuned=tuned, images=100, batches=4)
        advice = stats.verdict()
        if tuned:
            assert "num_workers" not in advice, advice
            assert "auto" not in advice, advice
        for n in re.findall(r"num_workers[=>]+ ?(\d+)", advice):
            assert int(n) <= cores, advice
        if kind == "process":
            assert "kind='process'" not in advice, advice


def test_saturated_workers_are_told_what_their_time_goes_to():
    """On every core, busy: the advice follows the stage that holds the workers' time."""
    base = dict(wall_s=10, wait_s=3.4, step_s=6.6, cpu_s=19.6, num_workers=2, images=1000,
                batches=4, cores=2)
    decode = LoaderStats(**base, decode_s=18, transforms_s=1, plan_s=0.5)
    assert "decoding takes 92% of the workers' time: more cores, smaller stored images " \
           "(convert --max-side) or raw records (--mode raw) would help" in decode.verdict()
    host = LoaderStats(**base, decode_s=5, transforms_s=14)
    assert "host transforms take 74% of the workers' time: device transforms" in host.verdict()
    user = LoaderStats(**base, decode_s=5, user_s=14)
    assert "your sample_transform takes 74% of the workers' time" in user.verdict()


def test_a_wait_for_object_storage_names_the_network():
    remote = LoaderStats(wall_s=10, wait_s=4, step_s=6, cpu_s=2, num_workers=2, images=1000,
                         batches=4, cores=2, fetch_wait_s=3)
    assert remote.verdict() == ("data-bound: 40.0% of step time spent waiting for data; "
                                "workers busy 10%: 75% of the wait was for records from "
                                "object storage: a cache_limit that keeps the data set lets "
                                "later epochs read locally (docs/remote.md)")


@pytest.mark.parametrize("bad", ["infs", "inf s", "nans", "-1s", "1m", "5", float("inf")])
def test_log_every_refuses_seconds_that_never_come(packed, bad):
    with pytest.raises(ValueError, match="log_every .*expected a number of batches"):
        Loader(Dataset(packed["raw"]), workers=Workers(log_every=bad))


def test_log_every_float_names_the_seconds_form(packed):
    with pytest.raises(ValueError, match=r"for 2.5 seconds write log_every='2.5s'"):
        Loader(Dataset(packed["raw"]), workers=Workers(log_every=2.5))


@pytest.mark.parametrize("value, parsed", [
    ("30s", ("seconds", 30.0)), (" 0.5 S", ("seconds", 0.5)), ("30S", ("seconds", 30.0)),
    (datetime.timedelta(minutes=2), ("seconds", 120.0)), (np.int64(5), ("batches", 5)),
    (7, ("batches", 7)), (None, (None, 0))])
def test_log_every_forms(value, parsed):
    assert parse_log_every(value) == parsed


def test_log_every_seconds_count_from_the_first_batch(monkeypatch):
    """A Loader built long before it iterates does not log at its first batch."""
    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    schedule = LogSchedule("30s")
    now[0] = 1000.0
    assert not schedule.due(1)
    now[0] = 1029.0
    assert not schedule.due(2)
    now[0] = 1030.0
    assert schedule.due(3)
    now[0] = 1031.0
    assert not schedule.due(4)


def test_the_runs_line_says_it_is_the_run(packed):
    """print(loader.stats().run) after two epochs read 'epoch 1: 10 batches', as if epoch 1
    alone had had them."""
    loader = Loader(Dataset(packed["raw"]), batch_size=10, num_workers=1)
    loader.set_epoch(3)
    list(loader)
    list(loader)
    stats = loader.stats()
    assert str(stats).startswith("epoch 4: 5 batches, ")
    assert str(stats.run).startswith("run of 2 epochs (3 to 4): 10 batches, ")
    assert (stats.run.epochs, stats.epochs) == (2, 1)
    assert stats.as_dict()["run"]["epochs"] == 2
    it = iter(loader)
    next(it)  # epoch 5 under way: the run counts it
    assert str(loader.stats().run).startswith("run of 3 epochs (3 to 5): 11 batches, ")
    del it
    loader.close()


@pytest.mark.parametrize("kind, remedy", [
    ("thread", "your sample_transform (92% of the workers' time) holds the GIL: "
               "workers=Workers(kind='process') would help"),
    ("process", "held up by reads: a deeper prefetch would help")])
def test_workers_on_batches_all_the_time_are_not_called_idle(kind, remedy):
    """Two workers on batches 97.5% of the wall time but on a CPU 25% (a sample_transform
    holding the GIL, or slow reads) are not 'idle part of the time'."""
    held = LoaderStats(wall_s=10, wait_s=5, step_s=5, cpu_s=5, num_workers=2, images=1000,
                       batches=4, cores=2, worker_kind=kind, decode_s=1.5, user_s=18)
    assert held.workers_occupied == 0.975
    assert held.verdict() == ("data-bound: 50.0% of step time spent waiting for data; workers "
                              "busy 25%: workers on batches 98% of the time but on a CPU 25%: "
                              + remedy + "; worker time: decode 8%, user 92%")
