"""Thread workers: build batches on N threads, hand them back in batch order.

Threads are the default because the heavy steps (region JPEG decode, PIL resize, the
HWC->CHW copies) release the GIL and write straight into the batch tensor, so nothing is
pickled or copied between processes. A batch is split into parts (ranges of samples) that
any thread may fill, so the last batch of an epoch and the first one (time to first
batch) use every thread. What a batch contains never depends on which thread fills it.

Jobs given to these workers implement ``split(k, *args) -> (parts, finalize)``: each part
is a callable taking the calling thread's private ``state`` dict (for scratch buffers);
``finalize()`` runs once all parts succeeded and returns the batch.
"""
from __future__ import annotations

import logging
import queue
import threading

log = logging.getLogger(__name__)


class _Failure:
    """An exception raised while building a batch, carried to the consumer."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


def _raise(result):
    if isinstance(result, _Failure):
        raise result.exc
    return result


class SerialWorkers:
    """num_workers=0: build each batch in the calling thread when it is asked for."""

    def __init__(self, split):
        self._split = split
        self._pending = {}
        self._state = {}

    def submit(self, k: int, *args) -> None:
        """Remember batch ``k``; it is built by ``get``."""
        self._pending[k] = args

    def get(self, k: int):
        """Build and return batch ``k``."""
        parts, finalize = self._split(k, *self._pending.pop(k))
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


class ThreadWorkers:
    """A pool of daemon threads filling batch parts; ``get(k)`` waits for batch k."""

    def __init__(self, split, num_workers: int, name: str = "dlpack-loader"):
        self._split = split
        self._tasks = queue.SimpleQueue()
        self._results = {}
        self._cv = threading.Condition()
        self._stop = False
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(num_workers)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        state = {}
        while True:
            task = self._tasks.get()
            if task is None or self._stop:
                return
            k, batch, i, part = task
            try:
                part(state)
            except BaseException as exc:  # delivered to the consumer, never lost
                with self._cv:
                    batch.errors[i] = exc
            with self._cv:
                batch.left -= 1
                last = batch.left == 0
            if last:
                self._complete(k, batch)

    def _complete(self, k: int, batch: _Batch) -> None:
        if batch.errors:
            result = _Failure(batch.errors[min(batch.errors)])
        else:
            try:
                result = batch.finalize()
            except BaseException as exc:
                result = _Failure(exc)
        with self._cv:
            self._results[k] = result
            self._cv.notify_all()

    def submit(self, k: int, *args) -> None:
        """Split batch ``k`` into parts and queue them (errors surface at ``get(k)``)."""
        try:
            parts, finalize = self._split(k, *args)
        except BaseException as exc:
            with self._cv:
                self._results[k] = _Failure(exc)
            return
        batch = _Batch(len(parts), finalize)
        if not parts:
            self._complete(k, batch)
        for i, part in enumerate(parts):
            self._tasks.put((k, batch, i, part))

    def get(self, k: int):
        """Wait for batch ``k`` and return it, or raise what building it raised."""
        with self._cv:
            while k not in self._results:
                if not any(t.is_alive() for t in self._threads):
                    raise RuntimeError("all loader threads have exited")
                self._cv.wait(timeout=1.0)
            result = self._results.pop(k)
        return _raise(result)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the threads (parts being filled are finished first) and drop results."""
        self._stop = True
        for _ in self._threads:
            self._tasks.put(None)
        for t in self._threads:
            t.join(timeout)
            if t.is_alive():
                log.warning("loader thread %s still busy after %.0f s; leaving it (daemon)",
                            t.name, timeout)
        with self._cv:
            self._results.clear()
