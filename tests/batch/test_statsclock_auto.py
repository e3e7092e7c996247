"""CPU seconds under num_workers="auto": every engine that ran in an epoch counts toward it,
once. The candidates' worker processes are parked between their turns and closed when the
setting is settled; their CPU was lost (only the running engine's workers were read), and a
parked engine that ran again must not be counted twice. The work is known: a
sample_transform burns CPU, measures it with time.thread_time in the worker and writes
the figure to a file; the figures are compared with what the test measured itself."""
from __future__ import annotations

import multiprocessing as mp
import os
import resource
import time
from functools import partial

import pytest

from dlpack_io.reader import Dataset, Loader
from dlpack_io.reader.batch import autotune
from dlpack_io.reader.batch.pipeline import StatsClock

from helpers import in_forked_child, pack_jpeg_and_raw

BURN = 0.008  # CPU seconds each sample_transform call spends
TICK = 1 / os.sysconf("SC_CLK_TCK")  # /proc's resolution of a live process's CPU


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("auto_cpu"), 48, 3, seed=5,
                             shard_size="60KB")


def burn(log_path, image):
    """A sample_transform of known CPU cost: burns BURN CPU seconds of its own thread and
    appends "pid seconds" to ``log_path`` (one write: lines from threads and processes do
    not mix)."""
    start = time.thread_time()
    while time.thread_time() - start < BURN:
        pass
    spent = time.thread_time() - start
    with open(log_path, "a") as f:
        f.write(f"{os.getpid()} {spent!r}\n")
    return image


def _burns(log_path) -> dict:
    """{pid: CPU seconds its sample_transform calls measured}."""
    out: dict = {}
    with open(log_path) as f:
        for line in f:
            pid, seconds = line.split()
            out[int(pid)] = out.get(int(pid), 0.0) + float(seconds)
    return out


def _all_cpu() -> float:
    """CPU seconds of this process and of its reaped children."""
    me, kids = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                       resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def test_auto_counts_the_cpu_of_the_process_candidates_it_parked_and_closed(
        packed, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # 2, 4, 1 threads, 2 procs
    # every candidate takes its turns (no skip, no drop, no early end) and threads are kept;
    # batches of 1, 48 an epoch: a warm-up of 4, then turns of 4 (2, 4, 1 threads, 2
    # processes; an engine's first turn, untimed, before its timed one), so the process
    # engine runs batches 24-31 and 44-47, parked between, and is closed at settle
    monkeypatch.setattr(autotune, "skip", lambda *args: None)
    monkeypatch.setattr(autotune, "drop_losers", lambda trials: None)
    monkeypatch.setattr(autotune, "converged", lambda trials: False)
    monkeypatch.setattr(autotune, "choose",
                        lambda trials, incumbent=None: next(t for t in trials
                                                            if t.kind == "thread"))
    log_path = tmp_path / "burns.txt"
    total0 = _all_cpu()
    loader = Loader(Dataset(packed["raw"]), batch_size=1, num_workers="auto",
                    sample_transform=partial(burn, str(log_path)))
    it = iter(loader)
    next(it)  # built by 2 threads, the first candidate
    main0 = time.process_time()
    batches = 1 + sum(1 for _ in it)
    main = time.process_time() - main0  # this process, every thread, after the first batch
    stats = loader.stats()
    loader.close()
    total = _all_cpu() - total0
    burns = _burns(log_path)
    workers = {pid: s for pid, s in burns.items() if pid != os.getpid()}
    assert batches == stats.batches == 48 and "worker_kind='thread'" in stats.tuned
    assert len(workers) == 2 and sum(workers.values()) >= 12 * BURN  # three turns of 4
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers)  # closed at settle
    # at least: this process's CPU after the first batch, and the workers' known work
    assert stats.cpu_s >= main + sum(workers.values()) - 0.01
    assert stats.cpu_s >= sum(burns.values())
    # at most: all the CPU this process and its children used (nothing counted twice)
    assert stats.cpu_s <= total + 0.01
    assert stats.run.cpu_s == stats.cpu_s


BEFORE_EPOCH = 0.3  # CPU s a worker burns before the epoch starts: not the epoch's


def _worker(ready, go, out) -> None:
    """Burns BEFORE_EPOCH s, says ready, waits for go, burns 0.1 s more and sends that figure."""
    start = time.process_time()
    while time.process_time() - start < BEFORE_EPOCH:
        pass
    ready.set()
    go.wait()
    start = time.process_time()
    while time.process_time() - start < 0.1:
        pass
    out.send(time.process_time() - start)


@in_forked_child
def test_a_stopped_process_counts_its_cpu_since_the_epochs_start_to_its_exit():
    """The work it finished while being stopped counts (read from the OS once reaped, not
    from /proc before the stop); what it did before the epoch started does not. In a forked
    child, whose only child is the worker: in the suite's process another thread once reaped
    another child during the stop, and the OS's children's CPU grew by that too (CI, +0.05 s)."""
    ctx = mp.get_context("fork")
    ready, go = ctx.Event(), ctx.Event()
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker, args=(ready, go, send), daemon=True)
    proc.start()
    assert ready.wait(30)
    clock = StatsClock(1, "process")
    clock.start_epoch(0, [proc.pid])
    main0 = time.process_time()
    clock.retire([proc.pid], lambda: (go.set(), proc.join()))
    during_stop = recv.recv()
    main = time.process_time() - main0
    cpu = clock.snapshot([], True).cpu_s
    assert during_stop >= 0.1
    assert cpu >= during_stop + main
    # the BEFORE_EPOCH s before the epoch: not counted. What the worker does after its last
    # reading (sending, exiting: 0.04 s once under CI's load) counts, and the epoch's start
    # is read at /proc's resolution: half of BEFORE_EPOCH leaves room for both.
    assert cpu < during_stop + main + BEFORE_EPOCH / 2
