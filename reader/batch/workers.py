"""The workers: who builds the batches (the calling thread, worker threads, or worker
processes) for the build stage's jobs (build.py, gather.py).

Every runner offers the same small protocol to the Loader (``ticket`` is a number the
Loader gives each submitted batch, unique over the runner's life):

    submit(ticket, indices, epoch)  queue a batch (errors surface at ``get``)
    can_submit() -> bool            room for another batch (processes: a free slot)
    ready(ticket) -> bool           the batch is built (never blocks)
    get(ticket) -> HostBatch        wait for it (at most ``timeout`` seconds) or raise
    close()                         stop; idempotent; leaves no thread or process behind
    pids                            worker process ids (empty for threads)
    in_process                      True: builds in this process (reads records as the
                                    prefetcher lands them); False: batches are gated
    opens_data                      True: the workers open the data set themselves (Ray
                                    actors, rayworkers.py): the Loader starts no prefetch

Threads are the default: the heavy steps (region decode, PIL resize, HWC->CHW copies, the
torch epilogue) release the GIL and write straight into the batch tensor. A batch is split
into parts (ranges of samples) that any thread may fill, so the first and the last batch of
an epoch use every thread. What a batch contains never depends on who builds it.

Processes (:class:`ProcessRunner`, ``worker_kind="process"``): each worker writes a batch's
pixels into one of ``num_slots`` anonymous shared mappings created before the fork (no file
names, so nothing can leak: the memory goes away with the last process that maps it) and
sends back only small metadata. Each worker has its own task pipe and result pipe, so a
worker killed in the middle of a write cannot wedge a lock the others need. The consumer
waits on the result pipes *and* the process sentinels: a dead worker is noticed at once and
reported with the sample it was on. Workers ignore SIGINT (Ctrl-C is the training loop's to
handle), exit when their parent dies (PR_SET_PDEATHSIG on Linux, plus a parent-pid check
every second), and are joined, then terminated, then killed by ``close`` (and at once after
a ``timeout``). They never touch CUDA (only numpy, the C decoder and one-thread torch CPU ops
run in them), so forking after CUDA was initialised is safe; a slot stays held until the
consumer releases it (after its device copy), which bounds the memory in flight to
``num_slots`` slots.
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import traceback
from multiprocessing.connection import wait

import numpy as np

from dlpack_io.reader.batch.errors import LoaderTimeout, SampleError, WorkerError

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
    in_process = True  # builds in this process: reads records as the prefetcher lands them
    opens_data = False

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
    in_process = True  # builds in this process: reads records as the prefetcher lands them
    opens_data = False

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


# ---- worker processes ------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent-pid check remains
        pass


def _portable(exc: BaseException) -> BaseException:
    """The exception itself if it pickles, else a SampleError carrying its traceback."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return SampleError(f"{type(exc).__name__}: {exc}\n(worker traceback)\n{text}")


def _worker_main(wid, build, slots, progress, tasks, results, parent_pid) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    import torch

    torch.set_num_threads(1)  # the epilogue's torch ops: one thread per worker process
    state = {}
    while True:
        if not tasks.poll(1.0):
            if os.getppid() != parent_pid:
                return
            continue
        task = tasks.recv()
        if task is None:
            return
        k, slot, args = task
        try:
            meta = build(slots[slot], progress[wid:wid + 1], state, *args)
            results.send((k, slot, meta, None))
        except BaseException as exc:
            results.send((k, slot, None, _portable(exc)))
        progress[wid] = -1


class ProcessRunner:
    """``num_workers`` forked processes running ``job.build``; ``job.collect`` runs in the
    consumer on each result and gets a ``release`` callback that frees the slot."""

    in_process = False  # workers read only the verified local cache: batches are gated
    opens_data = False

    def __init__(self, job, num_workers: int, slot_bytes: int, num_slots: int, *,
                 timeout: float | None = None, describe=None):
        ctx = mp.get_context("fork")
        self._job, self._timeout = job, timeout
        self._describe = describe or (lambda sample: f"sample {sample}")
        self._slot_maps = [mmap.mmap(-1, max(int(slot_bytes), 1)) for _ in range(num_slots)]
        self._free = list(range(num_slots))
        self._progress_map = mmap.mmap(-1, 8 * num_workers)
        progress = np.frombuffer(self._progress_map, dtype=np.int64)
        progress[:] = -1
        self._progress = progress
        self._outstanding = {}  # ticket -> worker
        self._done = {}
        self._procs, self._tasks, self._results = [], [], []
        for wid in range(num_workers):
            self._start(ctx, wid, job.build)

    def _start(self, ctx, wid, build) -> None:
        task_r, task_w = ctx.Pipe(duplex=False)
        res_r, res_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker_main, name=f"dlpack-loader-{wid}", daemon=True,
                           args=(wid, build, self._slot_maps, self._progress, task_r, res_w,
                                 os.getpid()))
        proc.start()
        task_r.close()
        res_w.close()
        self._procs.append(proc)
        self._tasks.append(task_w)
        self._results.append(res_r)

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (for tests and debugging)."""
        return [p.pid for p in self._procs]

    def slot_buffers(self) -> list:
        """The shared slots (the device path registers them as pinned memory once)."""
        return list(self._slot_maps)

    def can_submit(self) -> bool:
        """True when a slot is free for another batch."""
        return bool(self._free)

    def submit(self, ticket: int, indices, epoch: int) -> None:
        """Send the batch to worker ``ticket % num_workers`` with a free slot."""
        if not self._free:
            raise RuntimeError("ProcessRunner.submit without a free slot (check can_submit)")
        slot = self._free.pop()
        wid = ticket % len(self._procs)
        self._outstanding[ticket] = wid
        try:
            self._tasks[wid].send((ticket, slot, (indices, epoch)))
        except OSError as exc:  # BrokenPipeError: the worker died since its last batch
            self._procs[wid].join(1.0)
            self._check_alive()  # raises WorkerError naming the worker, batch and sample
            raise WorkerError(f"loader worker {wid} (pid {self._procs[wid].pid}) stopped "
                              f"accepting work ({exc}) at batch {ticket}") from exc

    def ready(self, ticket: int) -> bool:
        """True when the batch's result arrived (polls the pipes, never blocks)."""
        if ticket not in self._done:
            self._poll(0.0)
        return ticket in self._done

    def get(self, ticket: int):
        """Wait for the batch; return ``job.collect(...)`` or raise the worker's error."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while ticket not in self._done:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self._time_out(ticket)
            self._poll(5.0 if left is None else min(left, 5.0))
        slot, meta, exc = self._done.pop(ticket)
        if exc is not None:
            self._release(slot)
            raise exc
        return self._job.collect(self._slot_maps[slot], meta,
                                 lambda slot=slot: self._release(slot))

    def _release(self, slot: int) -> None:
        if slot not in self._free:
            self._free.append(slot)

    def _time_out(self, ticket: int) -> None:
        wid = self._outstanding.get(ticket)
        names = [(f"worker {w} (pid {p.pid})", self._progress[w:w + 1])
                 for w, p in enumerate(self._procs)]
        busy = describe_busy(names, self._describe)
        self.close(timeout=0.0)
        raise LoaderTimeout(f"batch {ticket} (sent to worker {wid}) not built after "
                            f"timeout={self._timeout:g} s: {busy}; the worker processes were "
                            f"killed (a stuck file system read, or a sample_transform that "
                            f"never returns?)")

    def _poll(self, timeout: float) -> None:
        busy = set(self._outstanding.values())
        sentinels = [p.sentinel for wid, p in enumerate(self._procs) if wid in busy]
        ready = wait(self._results + sentinels, timeout=timeout)
        got = False
        for conn in self._results:
            if conn in ready:
                try:
                    k, slot, meta, exc = conn.recv()
                except (EOFError, OSError):
                    continue
                self._outstanding.pop(k, None)
                self._done[k] = (slot, meta, exc)
                got = True
        if not got and (ready or timeout > 0):
            self._check_alive()

    def _check_alive(self) -> None:
        for wid, proc in enumerate(self._procs):
            if proc.is_alive() or wid not in self._outstanding.values():
                continue
            batch = min(k for k, w in self._outstanding.items() if w == wid)
            sample = int(self._progress[wid])
            code = proc.exitcode
            how = (f"was killed by {signal.Signals(-code).name}" if code and code < 0
                   else f"exited with code {code}")
            at = f"at {self._describe(sample)}" if sample >= 0 else "before its first sample"
            raise WorkerError(f"loader worker {wid} (pid {proc.pid}) {how} while building "
                              f"batch {batch}, {at}; if it ran out of memory, lower "
                              f"num_workers, prefetch or batch_size")

    def close(self, timeout: float = 5.0) -> None:
        """Stop, join, terminate and finally kill the workers; drop unclaimed results."""
        for conn in self._tasks:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        for proc in self._procs:
            proc.join(timeout)
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        for conn in self._tasks + self._results:
            conn.close()
        self._procs, self._tasks, self._results = [], [], []
        self._done.clear()
        self._outstanding.clear()
