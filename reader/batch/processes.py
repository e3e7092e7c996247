"""Worker processes: build batches in forked processes, straight into shared memory slots.

The process runner of runners.py's protocol (``worker_kind="process"``).

Each worker writes a batch's pixels into one of ``num_slots`` anonymous shared mappings
created before the fork (no file names, so nothing can leak: the memory goes away with
the last process that maps it) and sends back only small metadata. Each worker has its
own task pipe and result pipe, so a worker killed in the middle of a write cannot wedge
a lock the others need. The consumer waits on the result pipes *and* the process
sentinels: a dead worker is noticed at once and reported with the sample it was on.

Workers ignore SIGINT (Ctrl-C is the training loop's to handle), exit when their parent
dies (PR_SET_PDEATHSIG on Linux, plus a parent-pid check every second), and are joined,
then terminated, then killed by ``close`` (and at once after a ``timeout``). They never
touch CUDA (only numpy, the C decoder and one-thread torch CPU ops run in them), so forking
after CUDA was initialised is safe; a slot stays held until the consumer releases it
(after its device copy), which bounds the memory in flight to ``num_slots`` slots.
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import multiprocessing as mp
import os
import signal
import traceback
from multiprocessing.connection import wait

import numpy as np

import time

from dlpack_io.reader.batch.errors import LoaderTimeout, SampleError, WorkerError
from dlpack_io.reader.batch.runners import describe_busy

log = logging.getLogger(__name__)
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
