"""Is training waiting for data? What the Loader measures while it runs (``loader.stats()``).

The training loop's time is cut at ``next()``: the seconds spent inside it are the wait for
data (``wait_s``), the seconds between two calls are the training step (``step_s``), and
``wait_fraction = wait_s / (wait_s + step_s)`` is the share of the loop's time lost to the
loader. Both are wall-clock seconds of the consumer thread, measured by the Loader's own
generator around each ``yield``, so they cost two clock reads per batch. Beside them: the
seconds the consumer spent finishing batches (the copy to the device and the kernels, or the
host hand-over), how many built batches were waiting when the loop asked (queue depth), and
CPU seconds: this process's (every thread) plus those of every worker process that ran in
the span, once each (from /proc; for stopped ones, ``Clock.retire``).

The clock that takes these readings is part of the delivery loop (pipeline.py: ``Clock``);
this module holds what the figures are, what they say (``verdict``) and how they are read
from the machine.
"""
from __future__ import annotations

import datetime
import math
import numbers
import os
import resource
import time
from dataclasses import asdict, dataclass, field

_NETWORK = "% of the wait was for records from object storage"
DATA_BOUND = 0.10   # waiting this share of the loop's time or more: data-bound
BUSY = 0.90         # workers this busy are the limit: more workers will not help
_TICK = os.sysconf("SC_CLK_TCK")  # /proc's CPU times are in these ticks per second
# The build stage's parts, each timed by the worker that does it (build.py): index lookups
# and random draws; reading + decoding + crop/resize + the CHW copy; the user's
# sample_transform; the host transforms after the pixels (jitter, normalise, cast, ...).
STAGES = ("plan", "decode", "user", "transforms")
# Ray workers' remote stage, carried by each batch (rayworkers.py): the actors' CPU seconds,
# the bytes that came through Ray's object store, the consumer's seconds taking them, and
# batches built again because the actor (or node) that held them was lost.
REMOTE = ("remote_cpu_s", "moved_bytes", "transfer_s", "rebuilt")


def usable_cores() -> int:
    """CPU cores for this rank's workers: those this process may run on, shared by the
    ``LOCAL_WORLD_SIZE`` ranks of the node (torchrun sets it)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: every core the OS reports
        cores = os.cpu_count() or 1
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    ranks = int(local) if local.strip().isdigit() and int(local) > 0 else 1
    return max(1, cores // ranks)


def proc_cpus(pids) -> dict:
    """{pid: CPU seconds (user + system) used so far} of the processes ``pids``, read from
    /proc in clock ticks (``os.sysconf("SC_CLK_TCK")``); gone ones are left out."""
    cpus, tick = {}, _TICK
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        cpus[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15)
    return cpus


def proc_cpu(pids) -> float:
    """CPU seconds (user + system) used so far by the processes ``pids`` (0 for gone ones)."""
    return sum(proc_cpus(pids).values())


def children_cpu() -> float:
    """CPU seconds of this process's children that have ended and were reaped (all of each
    one's, to its exit: the OS adds them once ``wait`` collects them)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fetched_bytes(stats) -> int:
    """Bytes fetched per a prefetch handle's ``stats``: a dict, or one per data set of a
    Mixture (a list, None for a set on disk); 0 for none."""
    if isinstance(stats, dict):
        return int(stats.get("bytes_fetched", 0))
    if isinstance(stats, (list, tuple)):
        return sum(fetched_bytes(s) for s in stats)
    return 0


def tree_cpu(pids) -> float:
    """CPU seconds used so far by this process (every thread) and the processes ``pids``."""
    return time.process_time() + proc_cpu(pids)


@dataclass
class LoaderStats:
    """The Loader's figures for one span (an epoch, or the whole run in ``run``)."""

    epoch: int = 0             # the epoch (a run's: its last one)
    scope: str = "epoch"       # "epoch": one epoch's figures; "run": the sum of epochs
    epochs: int = 1            # epochs these figures add up (a run's: every one so far)
    first_epoch: int = 0       # the first of them
    batches: int = 0
    images: int = 0
    wall_s: float = 0.0        # from the span's first next() to now (or to its end)
    wait_s: float = 0.0        # inside next(): the loop waited for data
    step_s: float = 0.0        # between next() calls: the training step
    finish_s: float = 0.0      # copy to the device + kernels (or host hand-over), consumer
    cpu_s: float = 0.0         # this process (all threads) + worker processes
    consumer_cpu_s: float = 0.0  # the training loop's own thread
    loop_cpu_s: float = 0.0    # of which inside next(): the Loader's work in that thread
    queue_depth: float = 0.0   # mean built batches waiting when the loop asked
    num_workers: int = 0
    worker_kind: str = "thread"
    cores: int = 0             # CPU cores this process may run on (0: unknown)
    images_per_set: list | None = None  # a Mixture's images of each set; None: one data set
    tuned: str = ""            # num_workers/prefetch="auto": what was chosen and why
    plan_s: float = 0.0        # worker seconds per stage (STAGES): lookups, draws
    decode_s: float = 0.0      # read + decode + crop/resize + CHW copy (device path: gather)
    user_s: float = 0.0        # the user's sample_transform
    transforms_s: float = 0.0  # host transforms after the pixels (jitter, normalise, ...)
    fetch_wait_s: float = 0.0  # the loop waited for records from object storage
    fetched_bytes: int = 0     # bytes fetched from object storage (remote data sets)
    remote_cpu_s: float = 0.0  # Ray workers: the actors' CPU seconds (also in cpu_s)
    moved_bytes: int = 0       # Ray workers: bytes of batches through Ray's object store
    transfer_s: float = 0.0    # Ray workers: the consumer taking batches from the store
    rebuilt: int = 0           # Ray workers: batches built again after an actor was lost
    gpu_wait_s: float = 0.0    # device="cuda": the GPU waited for data (CUDA events)
    gpu_step_s: float = 0.0    # device="cuda": the GPU ran the training step
    run: "LoaderStats | None" = field(default=None, repr=False)

    @property
    def wait_fraction(self) -> float:
        """wait_s / (wait_s + step_s): the share of the loop's time spent waiting for data;
        on a CUDA device the GPU's (gpu_wait_s / (gpu_wait_s + gpu_step_s), the CUDA
        events of pipeline.GpuTimeline)."""
        if self.gpu_wait_s + self.gpu_step_s > 0:
            return self.gpu_wait_s / (self.gpu_wait_s + self.gpu_step_s)
        total = self.wait_s + self.step_s
        return self.wait_s / total if total > 0 else 0.0

    @property
    def images_per_s(self) -> float:
        """Images delivered per wall-clock second."""
        return self.images / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_ms_per_image(self) -> float:
        """CPU milliseconds per image delivered: every thread and worker process, the
        training loop's own thread only inside next() (the Loader's work there)."""
        loader = self.cpu_s - self.consumer_cpu_s + self.loop_cpu_s
        return 1000 * max(0.0, loader) / self.images if self.images else 0.0

    @property
    def workers_busy(self) -> float:
        """Share of the workers' time spent working (their CPU seconds over wall x count;
        with num_workers=0 the consumer builds the batches: its time waiting for data)."""
        if self.wall_s <= 0:
            return 0.0
        if self.num_workers == 0:
            return min(1.0, self.wait_s / self.wall_s)
        work = max(0.0, self.cpu_s - self.consumer_cpu_s)
        return min(1.0, work / (self.wall_s * self.num_workers))

    @property
    def workers_occupied(self) -> float:
        """Share of the workers' time spent on batches, on a CPU or not (their stage
        seconds over wall x count; 0 when unmeasured or num_workers=0): occupied but not
        busy is a worker held up, by reads or (threads) by the GIL."""
        if self.wall_s <= 0 or self.num_workers == 0:
            return 0.0
        work = sum(getattr(self, f"{name}_s") for name in STAGES)
        return min(1.0, work / (self.wall_s * self.num_workers))

    def as_dict(self) -> dict:
        """Every figure, derived ones included (``run`` nested the same way)."""
        out = {k: v for k, v in asdict(self).items()
               if k != "run" and not (k == "images_per_set" and v is None)}
        out.update(wait_fraction=self.wait_fraction, images_per_s=self.images_per_s,
                   cpu_ms_per_image=self.cpu_ms_per_image, workers_busy=self.workers_busy,
                   workers_occupied=self.workers_occupied,
                   stage_shares=self.stage_shares(), verdict=self.verdict())
        if self.run is not None:
            out["run"] = self.run.as_dict()
        return out

    def verdict(self) -> str:
        """One line: is the loop data-bound, and what would help."""
        if not self.batches:
            return "no batches delivered yet: nothing to judge"
        waiting = f"{100 * self.wait_fraction:.1f}%"
        if self.wait_fraction < DATA_BOUND:
            return f"not data-bound: {waiting} of step time spent waiting for data"
        busy = self.workers_busy
        advice = self._advice(busy)
        where = self.stage_shares()
        if where and _NETWORK not in advice:
            advice += "; worker time: " + ", ".join(f"{name} {100 * share:.0f}%"
                                                     for name, share in where.items())
        return (f"data-bound: {waiting} of step time spent waiting for data; workers busy "
                f"{100 * busy:.0f}%: {advice}")

    def _advice(self, busy: float) -> str:
        """What would help a data-bound loop, from what was measured: the network when most
        of the wait was for object storage; a deeper prefetch when the workers sit idle;
        more workers only up to the cores and never a setting already in use (nothing about
        the worker count under num_workers="auto", which chose it); else what the workers'
        time goes to, by stage."""
        if self.wait_s > 0 and self.fetch_wait_s >= 0.5 * self.wait_s:
            return (f"{100 * min(1.0, self.fetch_wait_s / self.wait_s):.0f}{_NETWORK}: a "
                    "cache_limit that keeps the data set lets later epochs read locally "
                    "(docs/remote.md)")
        auto, stage, share = bool(self.tuned), *self._dominant()
        if busy < BUSY and self.workers_occupied >= BUSY:
            held = (f"workers on batches {100 * self.workers_occupied:.0f}% of the time but "
                    f"on a CPU {100 * busy:.0f}%: ")
            if self.worker_kind == "thread" and stage == "user":
                return held + (f"your sample_transform ({100 * share:.0f}% of the workers' "
                               f"time) holds the GIL: " + (
                                   "a cheaper one would help" if auto else
                                   "workers=Workers(kind='process') would help"))
            return held + "held up by reads: a deeper prefetch would help"
        if self.worker_kind == "ray":  # actors on other machines: not this node's cores
            return (f"more Ray actors (num_workers > {self.num_workers}) would help" if
                    busy >= BUSY else "Ray actors idle part of the time: a deeper prefetch "
                    "(batches in flight) would hide the network; then more actors")
        if busy < BUSY:
            return "workers idle part of the time: a deeper prefetch would help"
        if not auto and self.num_workers < self.cores:
            return (f"more workers (num_workers={self.cores}, one per core), device "
                    "transforms or a cheaper recipe would help")
        if not auto and not self.cores and self.num_workers == 0:
            return "worker threads (num_workers > 0) would help"
        return self._by_stage(stage, share)

    def _dominant(self) -> tuple:
        """(the stage holding most of the workers' seconds, its share); (None, 0) unmeasured."""
        shares = self.stage_shares()
        if not shares:
            return None, 0.0
        stage = max(shares, key=shares.get)
        return stage, shares[stage]

    @staticmethod
    def _by_stage(stage, share: float) -> str:
        """Advice for workers busy on every core: what their time goes to."""
        pct = f"{100 * share:.0f}%"
        if stage == "decode":
            return (f"decoding takes {pct} of the workers' time: more cores, smaller stored "
                    "images (convert --max-side) or raw records (--mode raw) would help")
        if stage == "transforms":
            return (f"host transforms take {pct} of the workers' time: device transforms "
                    "(device='cuda') or a cheaper recipe would help")
        if stage == "user":
            return (f"your sample_transform takes {pct} of the workers' time: a cheaper one "
                    "would help")
        return "more cores, device transforms or a cheaper recipe would help"

    def stage_shares(self) -> dict:
        """Each stage's share of the workers' seconds (STAGES order; empty when unmeasured)."""
        seconds = {name: getattr(self, f"{name}_s") for name in STAGES}
        total = sum(seconds.values())
        return {n: v / total for n, v in seconds.items() if v > 0} if total > 0 else {}

    def postfix(self) -> dict:
        """Short figures for a progress bar: ``tqdm(...).set_postfix(loader.stats().postfix())``."""
        wait = f"{100 * self.wait_fraction:.0f}%" if self.batches else "-"
        return {"wait": wait, "img/s": f"{self.images_per_s:.0f}"}

    def _span(self) -> str:
        """What the figures cover, for the line: "epoch 4" or "run of 2 epochs (3 to 4)"."""
        if self.scope != "run":
            return f"epoch {self.epoch}"
        if self.epochs <= 1:
            return f"run of {self.epochs} epoch{'' if self.epochs else 's'}" + (
                f" ({self.epoch})" if self.epochs else "")
        return f"run of {self.epochs} epochs ({self.first_epoch} to {self.epoch})"

    def _remote(self) -> str:
        """Ray workers: "; Ray: 150 KB/image moved (12.0 ms/batch), 2 batches rebuilt"."""
        if self.worker_kind != "ray" or not self.batches:
            return ""
        per = self.moved_bytes / max(1, self.images)
        rebuilt = f", {self.rebuilt} batches rebuilt after lost actors" if self.rebuilt else ""
        return (f"; Ray: {per / 1e3:,.1f} KB/image moved, "
                f"{1e3 * self.transfer_s / self.batches:.1f} ms/batch taking them{rebuilt}")

    def __str__(self) -> str:
        return (f"{self._span()}: {self.batches} batches, {self.images_per_s:,.0f} images/s, "
                f"{self.cpu_ms_per_image:.2f} CPU-ms/image; {self.verdict()}" + self._remote()
                + ("" if self.images_per_set is None else
                   f"; images per set {', '.join(map(str, self.images_per_set))}"))


def parse_log_every(value):
    """``log_every``: None, a number of batches (an integer, numpy's too), or seconds as a
    string ``"30s"`` or a ``datetime.timedelta``; returns ("batches" | "seconds" | None,
    amount). Anything else, zero, negative or not finite, is refused naming the forms."""
    if value is None:
        return None, 0
    seconds = _seconds(value)
    if seconds is not None and math.isfinite(seconds) and seconds > 0:
        return "seconds", seconds
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0:
        return "batches", int(value)
    hint = (f" (for {value} seconds write log_every='{value}s')"
            if isinstance(value, float) and math.isfinite(value) and value > 0 else "")
    raise ValueError(f"log_every {value!r}: expected a number of batches (an int > 0), "
                     f"seconds as a string such as '30s' (or a datetime.timedelta), or "
                     f"None{hint}")


def _seconds(value) -> float | None:
    """The seconds of ``"30s"`` / ``"2.5 S"`` or a timedelta; None for another form."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, str) and value.strip().lower().endswith("s"):
        try:
            return float(value.strip()[:-1])
        except ValueError:
            return None
    return None


class LogSchedule:
    """When to write the stats line through ``logging`` (Loader's ``log_every``); seconds
    count from the first batch the Loader delivers, not from its construction."""

    def __init__(self, value):
        self.unit, self.every = parse_log_every(value)
        self._last = None

    def due(self, batches: int) -> bool:
        """True when the line is due after the epoch's ``batches``-th batch."""
        if self.unit == "batches":
            return batches % self.every == 0
        if self.unit != "seconds":
            return False
        now = time.perf_counter()
        if self._last is None:
            self._last = now
        elif now - self._last >= self.every:
            self._last = now
            return True
        return False
