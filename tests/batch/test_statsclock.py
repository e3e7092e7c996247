"""The stats clock cuts the loop's time at next() exactly where the loop does: every piece of
the Loader's own work inside next() (the epoch's start, what is done to a batch after it is
built, the end of the epoch) is waiting, the step of a batch the loop broke out after is a
step, and the CPU the Loader spends in the loop's own thread is the Loader's CPU. Known
pauses are put inside next() by the test; the figures are compared with the test's own
measurement around next()."""
from __future__ import annotations

import os
import time

import pytest

from dlpack_io.reader import Dataset, Loader, RandomResizedCrop, Workers
from dlpack_io.reader.batch.finish import HostFinisher

from helpers import pack_jpeg_and_raw

PAUSE = 0.04  # seconds of the Loader's work inside next() the test adds at each point


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("clock"), 48, 3, seed=5, shard_size="60KB")


def _loop(loader, step: float, stop_after: int | None = None):
    """Iterate (``stop_after`` batches, then break); return the seconds inside next(), the
    seconds outside it, the wall time and the loop thread's CPU seconds inside next()."""
    inside = outside = cpu = 0.0
    it, done, start = iter(loader), 0, time.perf_counter()
    while stop_after is None or done < stop_after:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            next(it)
        except StopIteration:
            inside, cpu = inside + time.perf_counter() - t0, cpu + time.thread_time() - c0
            break
        t1 = time.perf_counter()
        inside, cpu, done = inside + t1 - t0, cpu + time.thread_time() - c0, done + 1
        time.sleep(step)
        outside += time.perf_counter() - t1
    del it  # a loop left early: the generator is closed here, as a for loop's is
    return inside, outside, time.perf_counter() - start, cpu


def _slowed(loader, monkeypatch):
    """Add PAUSE inside next() at the epoch's start, after each batch is built, and at the
    epoch's end (the next() that raises StopIteration)."""
    def slow(fn):
        def wrapped(*args, **kwargs):
            time.sleep(PAUSE)
            return fn(*args, **kwargs)
        return wrapped
    monkeypatch.setattr(loader.dataset, "start_prefetch", slow(loader.dataset.start_prefetch))
    monkeypatch.setattr(HostFinisher, "finish", slow(HostFinisher.finish))
    monkeypatch.setattr(loader.skipped, "report", slow(loader.skipped.report))


@pytest.mark.parametrize("step", [0.0, 0.03], ids=["no-step", "sleep-step"])
def test_the_loaders_work_inside_next_is_waiting(packed, monkeypatch, step):
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=1)
    _slowed(loader, monkeypatch)
    inside, outside, wall, _ = _loop(loader, step)
    stats = loader.stats()
    assert stats.batches == 6 and inside >= 8 * PAUSE
    assert stats.wait_s == pytest.approx(inside, abs=0.02)
    assert stats.step_s == pytest.approx(outside, abs=0.02)
    assert stats.wait_fraction == pytest.approx(inside / (inside + outside), abs=0.05)
    assert stats.wall_s == pytest.approx(wall, abs=0.02)
    assert stats.wait_s + stats.step_s <= stats.wall_s + 1e-6
    loader.close()


def test_an_epoch_left_early_counts_the_last_step(packed):
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=1)
    inside, outside, _, _ = _loop(loader, 0.05, stop_after=3)
    stats = loader.stats()
    assert stats.batches == 3 and stats.step_s >= 3 * 0.05
    assert stats.step_s == pytest.approx(outside, abs=0.02)
    assert stats.wait_s == pytest.approx(inside, abs=0.02)
    assert stats.run.step_s == stats.step_s  # the epoch ended when its iterator was dropped
    loader.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_the_loaders_cpu_in_the_loops_thread_is_the_loaders(packed, workers):
    """num_workers=0 builds every batch inside next(), in the loop's thread: that CPU is
    the Loader's (CPU-ms per image read 0.00); the loop's own step is not."""
    loader = Loader(Dataset(packed["jpeg"]), batch_size=8, num_workers=workers,
                    transforms=[RandomResizedCrop(32)])
    _, _, _, inside_cpu = _loop(loader, 0.0)
    stats = loader.stats()
    loader_cpu = stats.cpu_ms_per_image * stats.images / 1000
    assert stats.loop_cpu_s == pytest.approx(inside_cpu, rel=0.25, abs=0.003)
    assert loader_cpu >= stats.loop_cpu_s > 0
    if workers == 0:
        assert loader_cpu == pytest.approx(inside_cpu, rel=0.25, abs=0.003)
    loader.close()


class _FakeEvent:
    """A CUDA event on a pretend GPU timeline: it is 'reached' at the fake clock's time."""
    clock = [0.0]

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream=None):
        self.at = _FakeEvent.clock[0]

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, later):
        return 1000.0 * (later.at - self.at)


def test_the_gpu_timeline_counts_the_wait_for_the_first_batch(monkeypatch):
    """device="cuda": the GPU's wait for an epoch's first batch is measured from the first
    next() (an event at the epoch's start), as the host's is; no GPU needed (fake events)."""
    import torch

    from dlpack_io.reader.batch.pipeline import StatsClock

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    clock, at = StatsClock(1, "thread", torch.device("cuda")), _FakeEvent.clock
    at[0] = 0.0
    clock.start_epoch(0, [])
    for handed, asked in ((1.0, 3.0), (3.5, 4.0)):
        at[0] = handed
        clock.delivered(8, 0.0, 0)
        clock.handed()
        at[0] = asked
        clock.asked()
    clock.end_epoch([])
    stats = clock.snapshot([], True)
    assert (stats.gpu_wait_s, stats.gpu_step_s) == (1.5, 2.5)
    assert stats.wait_fraction == 1.5 / 4.0


def test_the_runs_queue_depth_is_the_mean_over_all_its_batches():
    from dlpack_io.reader.batch.pipeline import StatsClock

    clock = StatsClock(2, "thread")
    for epoch, depth in ((0, 2), (1, 0)):
        clock.start_epoch(epoch, [])
        for _ in range(2):
            clock.delivered(8, 0.0, depth)
            clock.handed()
            clock.asked()
        clock.end_epoch([])
    stats = clock.snapshot([], True)
    assert (stats.queue_depth, stats.run.queue_depth) == (0.0, 1.0)


def burn(image):
    """A sample_transform that spends 3 ms of CPU (module level: worker processes run it):
    /proc counts CPU in 10 ms ticks, so the workers need some to count."""
    start = time.thread_time()
    while time.thread_time() - start < 0.003:
        pass
    return image


@pytest.mark.parametrize("persistent", [True, False])
def test_workers_stopped_at_the_epochs_end_keep_their_cpu(packed, persistent):
    """persistent_workers=False stops the worker processes inside the last next(): their
    CPU seconds were read after they had gone (lost, and their start-up's subtracted)."""
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=2,
                    workers=Workers(kind="process", persistent=persistent), sample_transform=burn)
    it = iter(loader)
    next(it)
    pids = loader.worker_pids()
    for _ in it:
        pass
    stats = loader.stats()
    assert [os.path.exists(f"/proc/{pid}") for pid in pids] == [persistent] * 2
    workers = stats.cpu_s - stats.consumer_cpu_s
    assert workers >= 48 * 0.003 - 0.03  # the 48 burns, less a tick per process and slack
    loader.close()


def test_bytes_fetched_from_object_storage_show_while_the_epoch_runs(s3_env, tmp_path):
    """A cold s3:// epoch 0 is when the fetch matters, and stats() read 0 bytes until the
    epoch had ended."""
    from helpers import pack_and_upload

    pack_and_upload(tmp_path, "s3://dlpack-test/clock", s3_env.env(), count=24, classes=3,
                    seed=4, size=(48, 64))
    loader = Loader(Dataset("s3://dlpack-test/clock"), batch_size=4, num_workers=1,
                    transforms=[RandomResizedCrop(32)])
    it = iter(loader)
    next(it)
    during = loader.stats().fetched_bytes
    assert during > 0 and loader.stats().run.fetched_bytes == during
    for _ in it:
        pass
    assert loader.stats().fetched_bytes >= during
    loader.close()


def test_a_snapshot_reads_the_gpu_events_reached_since_the_last_batch(monkeypatch):
    """stats() in the middle of an epoch takes the GPU intervals the GPU has finished since
    the last delivery (they were read only when the next batch was delivered)."""
    import torch

    from dlpack_io.reader.batch.pipeline import StatsClock

    class Lagging(_FakeEvent):
        reached = [False]

        def query(self):
            return Lagging.reached[0]

    monkeypatch.setattr(torch.cuda, "Event", Lagging)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    clock, at = StatsClock(1, "thread", torch.device("cuda")), _FakeEvent.clock
    at[0] = 0.0
    clock.start_epoch(0, [])
    at[0] = 1.0
    clock.delivered(8, 0.0, 0)  # the GPU is still busy: nothing read
    clock.handed()
    at[0] = 4.0
    clock.asked()
    Lagging.reached[0] = True  # the GPU has caught up; no batch delivered since
    stats = clock.snapshot([], True)
    assert (stats.gpu_wait_s, stats.gpu_step_s) == (1.0, 3.0)
