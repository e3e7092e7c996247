"""Who builds the batches: the calling thread, worker threads, or worker processes.

Every runner offers the same small protocol to the Loader (``ticket`` is a number the
Loader gives each submitted batch, unique over the runner's life):

    submit(ticket, indices, epoch)  queue a batch (errors surface at ``get``)
    can_submit() -> bool            room for another batch (processes: a free slot)
    ready(ticket) -> bool           the batch is built (never blocks)
    get(ticket) -> HostBatch        wait for it (at most ``timeout`` seconds) or raise
    close()                         stop; idempotent; leaves no thread or process behind
    pids                            worker process ids (empty for threads)

Threads are the default: the heavy steps (region decode, PIL resize, HWC->CHW copies, the
torch epilogue) release the GIL and write straight into the batch tensor. A batch is split
into parts (ranges of samples) that any thread may fill, so the first and the last batch of
an epoch use every thread. What a batch contains never depends on who builds it.
Processes: procrunner.py.
"""
from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np

from dlpack_io.reader.batch.errors import LoaderTimeout

log = logging.getLogger(__name__)


class _Failure:
    """An exception raised while building a batch, carried to the consumer."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


def _unwrap(result):
    if isinstance(result, _Failure):
        raise result.exc
    return result


def describe_busy(progress: list, describe) -> str:
    """'name on <where>' for every worker whose progress slot holds a sample."""
    busy = [f"{name} on {describe(int(p[0]))}" for name, p in progress if int(p[0]) >= 0]
    return "; ".join(busy) if busy else "no worker was inside a sample (stuck between samples?)"


class SerialRunner:
    """num_workers=0: each batch is built in the calling thread when it is asked for
    (``timeout`` cannot apply: there is no one else to wait for)."""

    pids: list = []

    def __init__(self, job):
        self._job = job
        self._pending = {}
        self._state = {}

    def submit(self, ticket: int, indices, epoch: int) -> None:
        """Remember the batch; it is built by ``get``."""
        self._pending[ticket] = (indices, epoch)

    def can_submit(self) -> bool:
        """Always: nothing is built ahead."""
        return True

    def ready(self, ticket: int) -> bool:
        """Never: a serial batch is built only when it is asked for."""
        return False

    def get(self, ticket: int):
        """Build and return the batch."""
        indices, epoch = self._pending.pop(ticket)
        parts, finalize = self._job.split(ticket, indices, epoch)
        for part in parts:
            part(self._state)
        return finalize()

    def close(self) -> None:
        """Nothing to release."""
        self._pending.clear()


class _Batch:
    """Bookkeeping of one batch whose parts are being filled."""

    __slots__ = ("left", "errors", "finalize")

    def __init__(self, count: int, finalize):
        self.left, self.errors, self.finalize = count, {}, finalize


class ThreadRunner:
    """A pool of daemon threads filling batch parts."""

    pids: list = []

    def __init__(self, job, num_workers: int, *, timeout: float | None = None,
                 describe=None, name: str = "dlpack-loader"):
        self._job, self._timeout = job, timeout
        self._describe = describe or (lambda sample: f"sample {sample}")
        self._tasks = queue.SimpleQueue()
        self._results = {}
        self._cv = threading.Condition()
        self._stop = self._abandoned = False
        self._progress = [(f"{name}-{i}", np.full(1, -1, dtype=np.int64))
                          for i in range(num_workers)]
        self._threads = [threading.Thread(target=self._run, args=(p,), name=n, daemon=True)
                         for n, p in self._progress]
        for t in self._threads:
            t.start()

    def _run(self, progress) -> None:
        import torch

        # The epilogue's torch ops run in many worker threads at once: one intra-op thread
        # each (per-thread with OpenMP; the training thread keeps its own setting).
        torch.set_num_threads(1)
        state = {"progress": progress}
        while True:
            task = self._tasks.get()
            if task is None or self._stop:
                return
            ticket, batch, i, part = task
            try:
                part(state)
            except BaseException as exc:  # delivered to the consumer, never lost
                with self._cv:
                    batch.errors[i] = exc
            progress[0] = -1
            with self._cv:
                batch.left -= 1
                last = batch.left == 0
            if last:
                self._complete(ticket, batch)

    def _complete(self, ticket: int, batch: _Batch) -> None:
        if batch.errors:
            result = _Failure(batch.errors[min(batch.errors)])
        else:
            try:
                result = batch.finalize()
            except BaseException as exc:
                result = _Failure(exc)
        with self._cv:
            self._results[ticket] = result
            self._cv.notify_all()

    def submit(self, ticket: int, indices, epoch: int) -> None:
        """Split the batch into parts and queue them (errors surface at ``get``)."""
        try:
            parts, finalize = self._job.split(ticket, indices, epoch)
        except BaseException as exc:
            with self._cv:
                self._results[ticket] = _Failure(exc)
            return
        batch = _Batch(len(parts), finalize)
        if not parts:
            self._complete(ticket, batch)
        for i, part in enumerate(parts):
            self._tasks.put((ticket, batch, i, part))

    def can_submit(self) -> bool:
        """Always: the job's own buffer pools bound what is in flight."""
        return True

    def ready(self, ticket: int) -> bool:
        """True when the batch is built (or failed)."""
        with self._cv:
            return ticket in self._results

    def get(self, ticket: int):
        """Wait for the batch; raise what building it raised, or LoaderTimeout."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        with self._cv:
            while ticket not in self._results:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._abandoned = True
                    raise LoaderTimeout(
                        f"batch {ticket} not built after timeout={self._timeout:g} s: "
                        f"{describe_busy(self._progress, self._describe)}; the worker threads "
                        f"are abandoned (a stuck file system read, or a sample_transform that "
                        f"never returns?)")
                if not any(t.is_alive() for t in self._threads):
                    raise RuntimeError("all loader threads have exited")
                self._cv.wait(timeout=1.0 if left is None else min(left, 1.0))
            result = self._results.pop(ticket)
        return _unwrap(result)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the threads (parts being filled are finished first) and drop results;
        threads abandoned after a timeout are not waited for (they are daemons)."""
        self._stop = True
        for _ in self._threads:
            self._tasks.put(None)
        if not self._abandoned:
            for t in self._threads:
                t.join(timeout)
                if t.is_alive():
                    log.warning("loader thread %s still busy after %.0f s; leaving it (daemon)",
                                t.name, timeout)
        with self._cv:
            for result in self._results.values():
                if not isinstance(result, _Failure):
                    result.release()
            self._results.clear()
