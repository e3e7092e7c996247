"""The stats clock: what the Loader's generator records around each ``yield`` (``loader.stats()``).

The figures themselves, their verdict and their one-line form live in stats.py
(``LoaderStats``); this module measures them: the wait inside ``next()``, the step outside
it, what each delivered batch carried, the CPU seconds, and the GPU's own timeline
(gputime.py) on a CUDA device.
"""
from __future__ import annotations

import time

from dlpack_io.reader.batch.gputime import GpuTimeline
from dlpack_io.reader.batch.stagetimes import STAGES
from dlpack_io.reader.batch.stats import LoaderStats, fetched_bytes, tree_cpu

def _add(total, counts) -> list:
    """Per-set image counts ``total`` (or None) plus ``counts``, as a new list."""
    counts = [int(c) for c in counts]
    return counts if total is None else [a + b for a, b in zip(total, counts)]


SUMMED = ("batches", "images", "wall_s", "wait_s", "step_s", "finish_s", "cpu_s",
          "consumer_cpu_s") + tuple(f"{s}_s" for s in STAGES) + (
          "fetch_wait_s", "fetched_bytes", "gpu_wait_s", "gpu_step_s")


class StatsClock:
    """Accumulates a Loader's figures; the Loader's generator calls it around each yield."""

    def __init__(self, num_workers: int, worker_kind: str, device=None):
        self.kind = dict(num_workers=num_workers, worker_kind=worker_kind)
        self.gpu = GpuTimeline(device)
        self.run = LoaderStats(**self.kind)       # epochs that have ended
        self.epoch = LoaderStats(**self.kind)     # the current (or last) epoch
        self.open, self._start, self._cpu0, self._thread0, self._depths = False, 0.0, 0.0, 0.0, 0

    def start_epoch(self, epoch: int, pids) -> None:
        """Epoch ``epoch`` starts now (its first next() is being served)."""
        self.epoch = LoaderStats(epoch=epoch, **self.kind)
        self.open, self._start, self._depths = True, time.perf_counter(), 0
        self._cpu0 = tree_cpu(pids)
        self._thread0 = time.thread_time()
        self.gpu.restart()

    def setting(self, num_workers: int, worker_kind: str, tuned: str = "") -> None:
        """The workers now building the batches (``tuned``: why, when chosen by "auto")."""
        self.kind = dict(num_workers=num_workers, worker_kind=worker_kind, tuned=tuned)
        for stats in (self.run, self.epoch):
            for name, value in self.kind.items():
                setattr(stats, name, value)

    def waited(self, seconds: float) -> None:
        """The loop waited ``seconds`` inside next()."""
        self.epoch.wait_s += seconds
        self.gpu.mark("wait")

    def stepped(self, seconds: float) -> None:
        """The loop spent ``seconds`` outside next() (its training step)."""
        self.epoch.step_s += seconds
        self.gpu.mark("step")

    def delivered(self, images: int, finish_s: float, depth: int, stages=None,
                  fetch_wait_s: float = 0.0) -> None:
        """One batch of ``images`` left the loader after ``finish_s`` of finishing, with
        ``depth`` more built batches waiting, its workers' ``stages`` seconds (STAGES
        order, or None) and ``fetch_wait_s`` spent waiting for remote records."""
        e = self.epoch
        e.batches, e.images, e.finish_s = e.batches + 1, e.images + images, e.finish_s + finish_s
        e.fetch_wait_s += fetch_wait_s
        self._depths += depth
        if stages is not None:
            for name, seconds in zip(STAGES, stages.tolist()):
                setattr(e, f"{name}_s", getattr(e, f"{name}_s") + seconds)
        self.gpu.resolve()

    def delivered_sets(self, counts) -> None:
        """A Mixture's batch held ``counts[s]`` images of set s (None: not a Mixture)."""
        if counts is not None:
            self.epoch.images_per_set = _add(self.epoch.images_per_set, counts)

    def end_epoch(self, pids, prefetch=None) -> None:
        """The epoch ended (or was abandoned): fix its figures and add them to the run's
        (``prefetch``: the remote data set's handle, for the bytes it fetched)."""
        if self.open:
            self.gpu.resolve(block=True)
            self._measure(pids, consumer_thread=True)
            self.epoch.fetched_bytes = fetched_bytes(getattr(prefetch, "stats", None))
            self.open = False
            for name in SUMMED:
                setattr(self.run, name, getattr(self.run, name) + getattr(self.epoch, name))
            self.run.epoch = self.epoch.epoch
            if self.epoch.images_per_set is not None:
                self.run.images_per_set = _add(self.run.images_per_set,
                                               self.epoch.images_per_set)

    def _measure(self, pids, consumer_thread: bool) -> None:
        e = self.epoch
        e.wall_s = time.perf_counter() - self._start
        e.cpu_s = tree_cpu(pids) - self._cpu0
        if consumer_thread:
            e.consumer_cpu_s = time.thread_time() - self._thread0
        e.queue_depth = self._depths / e.batches if e.batches else 0.0
        e.gpu_wait_s, e.gpu_step_s = self.gpu.wait_s, self.gpu.step_s

    def snapshot(self, pids, consumer_thread: bool) -> LoaderStats:
        """The current epoch's figures so far, with the whole run's in ``.run``.
        ``consumer_thread``: asked from the thread that iterates the loader (its own CPU
        time is then read now; from another thread the last reading is kept)."""
        if self.open:
            self._measure(pids, consumer_thread)
        run = LoaderStats(**{k: v for k, v in vars(self.run).items() if k != "run"})
        if self.open:
            for name in SUMMED:
                setattr(run, name, getattr(run, name) + getattr(self.epoch, name))
            if self.epoch.images_per_set is not None:
                run.images_per_set = _add(run.images_per_set, self.epoch.images_per_set)
        run.epoch = self.epoch.epoch
        run.queue_depth = self.epoch.queue_depth
        return LoaderStats(**{**vars(self.epoch), "run": run})
