"""The delivery loop: the pipeline of one Loader at work, and the clock that times it.

A Loader composes its stages once (loader.py: ``make_engine``): a build job (build.py or
gather.py), the workers that run it (workers.py) and the finisher that puts batches on their
device (finish.py), held together as an :class:`Engine` across epochs. :func:`deliver` runs
them: it keeps ``in_flight`` batches submitted, gates batches of a remote data set on the
prefetcher where workers cannot fetch (processes), and starts the next batch's device copy
before the current batch is yielded, so that the copy overlaps the training step.

The :class:`StatsClock` observes the loop at one seam (``loader.stats()``): the Loader's
generator cuts the training loop's time at ``next()`` (``handed`` / ``asked``), ``deliver``
reports each batch (``delivered``), and on a CUDA device a :class:`GpuTimeline` reads the
GPU's own view from CUDA events. The figures themselves, and what they say, are stats.py's.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from dlpack_io.reader.batch.stats import (REMOTE, STAGES, LoaderStats, children_cpu,
                                          fetched_bytes, proc_cpus, usable_cores)


@dataclass
class Engine:
    """A Loader's job, runner (workers) and finisher."""

    job: object
    runner: object
    finisher: object

    def close(self) -> None:
        """Stop the workers; copies in flight finish before their slots go away."""
        self.finisher.close()
        self.runner.close()


def stage_next(runner, finisher, ticket):
    """Take a built batch early and start its copy to the device, so that the copy overlaps
    the training step on the batch before it; a failure is returned, raised when it is due."""
    try:
        hb = runner.get(ticket)
    except Exception as exc:  # noqa: BLE001 - delivered in order, one batch later
        return exc
    finisher.stage(hb)
    return hb


def timed_wait(prefetch, k: int) -> float:
    """``prefetch.wait(k)``: the seconds it took (records still on their way from storage)."""
    t0 = time.perf_counter()
    prefetch.wait(k)
    return time.perf_counter() - t0


def deliver(engine: Engine, batches, start: int, ticket0: int, prefetch, epoch: int,
            in_flight: int, on_batch=None):
    """Run ``batches[start:]`` (runner tickets from ``ticket0 + start``) and yield
    ``(k, built batch, images, labels)`` in order; ``prefetch`` (or None) is the remote
    data set's prefetch of ``batches[start:]``. ``on_batch(images, finish_s, depth, stages,
    fetch_wait_s, remote)`` hears of each batch: its size, the seconds its finish took, the built
    batches behind it, its workers' seconds per stage (build.stage_totals), the seconds this
    loop waited for its records to arrive from object storage and (Ray workers) the remote
    stage's figures, ``remote``."""
    runner, finisher, total = engine.runner, engine.finisher, len(batches)
    # Remote data: thread workers read records as the prefetcher lands them (they wait
    # per record in this process); worker processes only read the local cache, so a
    # batch goes to them once its records are all there (the next one due: waited for;
    # later ones: only when already complete, so the first batch is not held up).
    gated = prefetch is not None and not runner.in_process
    submitted, staged = start, None
    for k in range(start, total):
        finisher.reclaim()
        fetch_wait = 0.0  # seconds this batch waited for records from object storage
        while submitted < min(total, k + in_flight):
            if not runner.can_submit():
                if submitted > k:
                    break  # batch k is on its way; the rest waits for free slots
                finisher.reclaim(block=True)  # slots held by finished device copies
            if gated and submitted > k and not prefetch.ready(submitted - start):
                break
            if gated:
                fetch_wait += timed_wait(prefetch, submitted - start)
            runner.submit(ticket0 + submitted, batches[submitted], epoch)
            submitted += 1
        if prefetch is not None:  # the batch due next: the prefetcher may overcommit
            fetch_wait += timed_wait(prefetch, k - start)
        if staged is None and not runner.ready(ticket0 + k):
            finisher.reclaim(block=True)  # a worker may be waiting for a held buffer
        hb = staged if staged is not None else runner.get(ticket0 + k)
        if isinstance(hb, BaseException):  # batch k failed while it was being staged
            raise hb
        staged = None
        if k + 1 < submitted and runner.ready(ticket0 + k + 1):
            staged = stage_next(runner, finisher, ticket0 + k + 1)
        t0 = time.perf_counter()
        images, labels = finisher.finish(hb)
        if on_batch is not None:
            on_batch(len(hb.indices), time.perf_counter() - t0,
                     sum(runner.ready(ticket0 + j) for j in range(k + 1, submitted)),
                     hb.stages, fetch_wait, hb.remote)
        yield k, hb, images, labels
        if prefetch is not None:  # after the consumer read the batch's fields from the cache
            prefetch.release(k - start)


class Shifted:
    """A remote prefetch handle seen from batch ``offset`` of its batches (None: no remote)."""

    def __new__(cls, prefetch, offset: int):
        if prefetch is None or offset == 0:
            return prefetch
        return super().__new__(cls)

    def __init__(self, prefetch, offset: int):
        self.inner, self.offset = prefetch, offset

    def wait(self, k: int, timeout: float | None = None) -> None:
        """The inner handle's wait for batch ``k + offset``."""
        self.inner.wait(k + self.offset, timeout)

    def ready(self, k: int) -> bool:
        """The inner handle's ready for batch ``k + offset``."""
        return self.inner.ready(k + self.offset)

    def release(self, k: int) -> None:
        """The inner handle's release of batch ``k + offset``."""
        self.inner.release(k + self.offset)


class Run(NamedTuple):
    """One epoch's delivery as the tuner (autotune.py) cuts it into turns: the arguments of
    ``deliver`` that stay the same from one turn to the next."""

    batches: list
    start: int
    ticket0: int
    prefetch: object
    epoch: int
    on_batch: object

    def shifted(self, k: int):
        """The remote prefetch handle as seen from batch ``k`` (None: a local data set)."""
        return Shifted(self.prefetch, k - self.start)


# ---- the clock ------------------------------------------------------------------------
def _add(total, counts) -> list:
    """Per-set image counts ``total`` (or None) plus ``counts``, as a new list."""
    counts = [int(c) for c in counts]
    return counts if total is None else [a + b for a, b in zip(total, counts)]


def _count_epoch(run: LoaderStats, epoch: int) -> None:
    """The run's figures now also cover ``epoch``."""
    run.first_epoch = epoch if run.epochs == 0 else run.first_epoch
    run.epochs, run.epoch = run.epochs + 1, epoch


SUMMED = ("batches", "images", "wall_s", "wait_s", "step_s", "finish_s", "cpu_s",
          "consumer_cpu_s", "loop_cpu_s") + tuple(f"{s}_s" for s in STAGES) + (
          "fetch_wait_s", "fetched_bytes", "gpu_wait_s", "gpu_step_s") + REMOTE


class StatsClock:
    """Accumulates a Loader's figures; the Loader's generator calls it around each yield."""

    def __init__(self, num_workers: int, worker_kind: str, device=None):
        self.kind = dict(num_workers=num_workers, worker_kind=worker_kind, cores=usable_cores())
        self.gpu = GpuTimeline(device)
        self.run = LoaderStats(scope="run", epochs=0, **self.kind)  # epochs that have ended
        self.epoch = LoaderStats(**self.kind)     # the current (or last) epoch
        self.open, self._start, self._cpu0, self._thread0, self._depths = False, 0.0, 0.0, 0.0, 0
        self._mark, self._inside = 0.0, False     # the last cut at next(); in it since then?
        self._tmark = self._tnow = 0.0            # the loop thread's CPU clock: at that cut, now
        self._run_depths = 0                      # queue depths summed over the ended epochs
        self._retired = 0.0                       # CPU of worker processes stopped this epoch
        self._base: dict = {}                     # pid -> its CPU when the epoch started
        self._prefetch = None                     # a remote data set's handle (bytes fetched)
        self.live, self._token = 0, 0             # iterations under way; the open epoch's id

    def start_epoch(self, epoch: int, pids, asked: float | None = None) -> int:
        """Epoch ``epoch`` starts: its first next() was called at ``asked`` (perf_counter;
        None: now), so planning and start-up count as waiting. ``pids``: every live worker
        process, the running engine's and those parked by ``num_workers="auto"``. Returns
        the epoch's token for ``end_epoch``. An epoch still open (another iterator of the
        Loader, alive) is closed first, at ``asked``: its figures join the run's, and what
        its iterator delivers from now on counts in this epoch (one loop, one clock)."""
        now = time.perf_counter() if asked is None else asked
        if self.open:
            self._close(pids, until=now)
        self.live, self._token = self.live + 1, self._token + 1
        self.epoch = LoaderStats(epoch=epoch, first_epoch=epoch, **self.kind)
        self.open, self._start, self._depths, self._mark, self._inside = True, now, 0, now, True
        self._cpu0, self._retired, self._prefetch = time.process_time(), 0.0, None
        self._base = proc_cpus(pids)
        self._thread0 = self._tmark = time.thread_time()
        self.gpu.restart()
        self.gpu.mark("step")  # the GPU's first wait is measured from here
        return self._token

    def setting(self, num_workers: int, worker_kind: str, tuned: str = "") -> None:
        """The workers now building the batches (``tuned``: why, when chosen by "auto")."""
        self.kind = dict(self.kind, num_workers=num_workers, worker_kind=worker_kind, tuned=tuned)
        for stats in (self.run, self.epoch):
            for name, value in self.kind.items():
                setattr(stats, name, value)

    def handed(self) -> None:
        """A batch is handed to the loop now (right before the ``yield``): the time since
        it asked was waiting."""
        now = time.perf_counter()
        self.epoch.wait_s += now - self._mark
        self.epoch.loop_cpu_s += time.thread_time() - self._tmark
        self._mark, self._inside = now, False
        self.gpu.mark("wait")

    def asked(self) -> None:
        """The loop asks for the next batch now (right after the ``yield``): the time
        since the hand-over was its training step."""
        now = time.perf_counter()
        self.epoch.step_s += now - self._mark
        self._mark, self._inside, self._tmark = now, True, time.thread_time()
        self.gpu.mark("step")

    def _pending(self, stats: LoaderStats, now: float, consumer_thread: bool = True) -> None:
        """Add the time since the last cut to ``stats``: waiting if the loop is inside
        next() (or the epoch ended there; with the loop thread's CPU, read from that
        thread), else its step."""
        if self._inside:
            stats.wait_s += now - self._mark
            if consumer_thread:  # the loop thread's CPU clock as _measure read it
                stats.loop_cpu_s += self._tnow - self._tmark
        else:
            stats.step_s += now - self._mark

    def fetching(self, prefetch) -> None:
        """The epoch's records come through ``prefetch`` (None: a data set on disk); its
        bytes fetched are read at each snapshot, not only at the epoch's end."""
        self._prefetch = prefetch

    def retire(self, pids, stop) -> None:
        """``stop()`` stops an engine whose worker processes are ``pids`` (none: threads,
        whose CPU is this process's): in an epoch, their CPU seconds in it are kept. Read
        twice: from /proc before the stop, and as the children's CPU the OS adds when the
        stop reaps them (to their exit, work finished during the stop included); the
        larger counts, less what they had at the epoch's start."""
        before = proc_cpus(pids) if self.open else {}
        reaped = children_cpu()
        stop()
        reaped = children_cpu() - reaped
        base = sum(self._base.pop(pid, 0.0) for pid in pids)
        if self.open and pids:
            self._retired += max(reaped, sum(before.values())) - base

    def stop_engine(self, engine) -> None:
        """Close ``engine`` (engine.Engine: its runner's ``pids``, none for threads), with
        its worker processes' CPU kept for the epoch (``retire``)."""
        self.retire(engine.runner.pids, engine.close)

    def delivered(self, images: int, finish_s: float, depth: int, stages=None,
                  fetch_wait_s: float = 0.0, remote=None) -> None:
        """One batch of ``images`` left the loader after ``finish_s`` of finishing, with
        ``depth`` more built batches waiting, its workers' ``stages`` seconds (STAGES
        order, or None), ``fetch_wait_s`` spent waiting for remote records and (Ray
        workers) ``remote``, a dict of the REMOTE figures."""
        e = self.epoch
        for name, value in (remote or {}).items():
            setattr(e, name, getattr(e, name) + value)
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

    def end_epoch(self, pids, prefetch=None, token: int | None = None) -> bool:
        """The epoch ``token`` (start_epoch's; None: the open one) ended or was abandoned:
        fix its figures and add them to the run's (``prefetch``: the remote data set's
        handle, for the bytes it fetched); nothing if a newer epoch had closed it. Returns
        True when no other iteration is under way."""
        self.live = max(0, self.live - 1)
        if self.open and token in (None, self._token):
            self._prefetch = prefetch if prefetch is not None else self._prefetch
            self._close(pids)
        return self.live == 0

    def _close(self, pids, until: float | None = None) -> None:
        """Close the open epoch (at ``until``, perf_counter; None: now) into the run."""
        self.gpu.resolve(block=True)
        self._measure(pids, consumer_thread=True)
        if until is not None:
            self.epoch.wall_s = max(0.0, until - self._start)
        self._pending(self.epoch, self._start + self.epoch.wall_s)
        self._prefetch = None  # closed after this: its figures are the epoch's now
        self.open, self._run_depths = False, self._run_depths + self._depths
        for name in SUMMED:
            setattr(self.run, name, getattr(self.run, name) + getattr(self.epoch, name))
        _count_epoch(self.run, self.epoch.epoch)
        if self.epoch.images_per_set is not None:
            self.run.images_per_set = _add(self.run.images_per_set,
                                           self.epoch.images_per_set)

    def _measure(self, pids, consumer_thread: bool) -> None:
        e = self.epoch
        e.wall_s = time.perf_counter() - self._start  # _pending(e, _start + wall_s) may follow
        if consumer_thread:  # read first: the process's CPU, read after it, holds it all
            self._tnow = time.thread_time()
            e.consumer_cpu_s = self._tnow - self._thread0
        # every live worker once, less its CPU at the start (one started since: all of it)
        live = sum(cpu - self._base.get(pid, 0.0) for pid, cpu in proc_cpus(pids).items())
        e.cpu_s = time.process_time() - self._cpu0 + live + self._retired + e.remote_cpu_s
        e.queue_depth = self._depths / e.batches if e.batches else 0.0
        self.gpu.resolve()  # the events the GPU has reached (no wait; all at an epoch's end)
        e.gpu_wait_s, e.gpu_step_s = self.gpu.wait_s, self.gpu.step_s
        e.fetched_bytes = fetched_bytes(getattr(self._prefetch, "stats", None))

    def snapshot(self, pids, consumer_thread: bool) -> LoaderStats:
        """The current epoch's figures so far, with the whole run's in ``.run``.
        ``consumer_thread``: asked from the thread that iterates the loader (its own CPU
        time is then read now; from another thread the last reading is kept)."""
        if self.open:
            self._measure(pids, consumer_thread)
        epoch = LoaderStats(**vars(self.epoch))
        if self.open:
            self._pending(epoch, self._start + epoch.wall_s, consumer_thread)  # under way
        run = LoaderStats(**{k: v for k, v in vars(self.run).items() if k != "run"})
        if self.open:  # the epoch under way joins the run's figures so far
            for name in SUMMED:
                setattr(run, name, getattr(run, name) + getattr(epoch, name))
            if epoch.images_per_set is not None:
                run.images_per_set = _add(run.images_per_set, epoch.images_per_set)
            _count_epoch(run, epoch.epoch)
        depths = self._run_depths + (self._depths if self.open else 0)
        run.queue_depth = depths / run.batches if run.batches else 0.0
        epoch.run = run
        return epoch


# ---- the GPU's view -------------------------------------------------------------------
# The training loop's time as the GPU sees it (``device="cuda"``): CUDA events.
#
# On a CUDA device the host's clock misreads a training loop: kernels are queued, the host
# returns from the step at once and may then wait inside ``next()`` while the GPU is still
# busy with the step (no data stall at all), or run far ahead of a GPU that sits idle. So
# the Loader also records one CUDA event on the current stream when it hands a batch over
# and one when the loop asks for the next, and reads the GPU's timeline between them:
#
#     handed(k) -> asked(k):      the step on batch k, as the GPU ran it   (gpu_step_s)
#     asked(k)  -> handed(k+1):   the GPU waited for batch k+1's data       (gpu_wait_s)
#
# Events are read without blocking (``query()``) as later batches are delivered, and at the
# end of an epoch after a synchronisation of the last one. Recording an event costs a few
# microseconds; nothing here runs without CUDA (``GpuTimeline(None)`` does nothing).
class GpuTimeline:
    """Pairs of CUDA events around the training step; seconds of GPU step and GPU wait."""

    def __init__(self, device=None):
        self.device = device if device is not None and device.type == "cuda" else None
        self.step_s = self.wait_s = 0.0
        self._events, self._last = deque(), None

    def mark(self, kind: str) -> None:
        """Record an event now on the current stream; the GPU time since the previous mark
        is ``kind``'s: "wait" (a batch is handed over) or "step" (the loop asks again)."""
        if self.device is None:
            return
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        self._events.append((event, kind))

    def resolve(self, block: bool = False) -> None:
        """Add the intervals whose events the GPU has reached (all of them with ``block``)."""
        while self._events:
            event, kind = self._events[0]
            if block:
                event.synchronize()
            elif not event.query():
                return
            if self._last is not None:
                seconds = self._last.elapsed_time(event) / 1000.0
                if kind == "step":
                    self.step_s += seconds
                else:
                    self.wait_s += seconds
            self._last = event
            self._events.popleft()

    def restart(self) -> None:
        """A new span (epoch): forget the figures and the pending events."""
        self.step_s = self.wait_s = 0.0
        self._events.clear()
        self._last = None
