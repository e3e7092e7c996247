"""What ``num_workers="auto"`` measures and how it judges: a candidate's trial (its turns,
each a piece of consecutive batches timed whole), the choice, the drop and tie rules, and
which candidates a first look at the host makes pointless (pure functions; the Tuner in
autotune.py drives them).

Equal work: every candidate's turn is the same number of batches (``span``, equal_turn), a
multiple of every candidate's worker count, so the candidates are judged on the throughput
of equal work, and no turn ends with some workers idle while others finish. The first turn
is ``cores`` threads' (today's default); from it, ``skip`` reads two facts of the host
before the other candidates pay a turn:

* the **step share**: the part of each interval the training loop spent outside
  ``next()``. Under STEP_SHARE the loop waits for data, so fewer threads than ``cores``
  cannot deliver sooner: the ``cores / 2`` threads candidate is skipped;
* the **GIL share** of a batch: the user's ``sample_transform`` seconds over all the stage
  seconds of the piece (stagetimes.py), and the **CPU share**: CPU seconds of the piece over
  its wall seconds x ``cores``. Processes can only win where threads leave cores idle
  because Python holds the GIL; when the threads already kept CPU_FULL of every core busy
  and the GIL share is under GIL_SHARE, the process candidate is skipped.
"""
from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field

TIE = 0.02            # within 2% of the best is equal: the cheaper one wins (a wider tie
#                       kept 2 threads where 2 processes ran 6% faster: docs/benchmarks.md)
ROUNDS = 3            # each candidate is measured in this many pieces, taken in turns
DROP = 0.5            # after a round, a candidate this much slower than the best is dropped
#                       (one short piece is noisy: at 0.25 a lucky piece dropped the rest)
STEP_SHARE = 0.25     # a loop outside next() for less of an interval waits for data
GIL_SHARE = 0.02      # a sample_transform share of the stage seconds that asks for processes
#                       (4-5% was enough for 2 processes to run 2-6% faster than threads)
CPU_FULL = 0.75       # threads that kept this share of every core busy left none idle (a
#                       whole turn's edges -- its start, its last batches -- idle a core for
#                       5-10% of it; below this the GIL may be what idles them)


@dataclass
class Trial:
    """One candidate's measurements: pieces of consecutive deliveries."""

    kind: str
    workers: int
    builds: list = field(default_factory=list)      # workers' seconds per batch (jitter)
    pieces: list = field(default_factory=list)      # seconds per batch of each whole turn
    cpu_s: float = 0.0
    images: int = 0
    dropped: bool = False
    span: int = 0          # batches per turn, the same for every candidate (0: own rule)
    skipped: str = ""      # why a first look made this candidate pointless
    wall_s: float = 0.0    # seconds of the measured turns
    step_s: float = 0.0    # of which the loop spent outside next()
    user_s: float = 0.0    # workers' seconds in the sample_transform (stagetimes USER)
    stage_s: float = 0.0   # workers' seconds in every stage

    def piece(self) -> int:
        """Batches per turn (the trial is ROUNDS turns): ``span`` when set, else (a trial
        on its own: prefetch="auto" with a fixed count) twice the workers' batches, at
        least 4."""
        return self.span or max(4, 2 * self.workers)

    def done(self) -> bool:
        """Measured in every round, or dropped as clearly slower than another candidate."""
        return len(self.pieces) >= ROUNDS or self.dropped

    @property
    def interval(self) -> float:
        """Median over the turns of their seconds per batch (the turns are taken in turn
        with the other candidates, so a change in the machine's load hits them all; the
        median drops a turn that met a burst); inf when nothing measured."""
        return statistics.median(self.pieces) if self.pieces else math.inf

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds per image over the measured turns."""
        return 1000 * self.cpu_s / self.images if self.images else 0.0

    def jitter(self) -> float:
        """The costliest window of ``2 x workers`` consecutive batches (workers' seconds to
        build them) over the mean window (>= 1): how irregular the batches are, which a
        deeper queue absorbs. Build seconds, not the seconds between deliveries (those come
        in clumps at every turn's start, a pattern of the turns); windows of two rounds of
        the workers' batches, as one round's build seconds on oversubscribed cores swing
        with the scheduler (4 threads on 2 cores read 1.6-1.9 on steady data)."""
        w = 2 * max(1, self.workers)
        windows = [sum(self.builds[i:i + w]) for i in range(0, len(self.builds) - w + 1, w)]
        mean = sum(windows) / len(windows) if windows else 0.0
        return max(windows) / mean if mean > 0 else 1.0


def name(trial: Trial) -> str:
    """'2 threads', '1 process': a trial's setting in words."""
    plural = "" if trial.workers == 1 else ("es" if trial.kind == "process" else "s")
    return f"{trial.workers} {trial.kind}{plural}"


def describe(trial: Trial) -> str:
    """A trial's figures in words, for the log line."""
    if trial.skipped:
        return f"{name(trial)} skipped ({trial.skipped})"
    return (f"{name(trial)} {trial.interval * 1000:.1f} ms/batch {trial.cpu_ms:.2f} "
            f"CPU-ms/image" + (" (dropped)" if trial.dropped else ""))


def choose(trials: list[Trial]) -> Trial:
    """The trial with the shortest interval; the first of those within TIE of it."""
    best = min(t.interval for t in trials)
    return next(t for t in trials if t.interval <= best * (1 + TIE) or best == math.inf)


def drop_losers(trials: list[Trial]) -> None:
    """Once every candidate still on trial has as many pieces as the others (a round is
    over), drop those more than DROP slower than the best: their turns would only cost."""
    live = [t for t in trials if not t.dropped]
    if len({len(t.pieces) for t in live}) != 1 or not live[0].pieces:
        return
    best = min(t.interval for t in live)
    for t in live:
        t.dropped = t.interval > best * (1 + DROP)


def converged(trials: list[Trial]) -> bool:
    """Two rounds or more are over and another would buy little for its turns: every
    candidate still on trial is either within TIE of the best (the cheapest of equals wins)
    or clearly behind it (its fastest turn more than TIE slower than the best's slowest)."""
    live = [t for t in trials if not t.dropped]
    if len({len(t.pieces) for t in live}) != 1 or len(live[0].pieces) < 2:
        return False
    lead = min(live, key=lambda t: t.interval)
    return all(t.interval <= lead.interval * (1 + TIE)
               or min(t.pieces) > max(lead.pieces) * (1 + TIE) for t in live)


def skip(trials: list[Trial], first: Trial, cores: int) -> None:
    """After ``first`` (``cores`` threads) measured a piece, skip the candidates the host
    makes pointless (module docstring): fewer threads when the loop waits for data,
    processes when the threads kept every core busy without a GIL-bound transform."""
    if not first.wall_s:
        return
    step = first.step_s / first.wall_s
    cpu = first.cpu_s / (first.wall_s * max(1, cores))
    gil = first.user_s / first.stage_s if first.stage_s > 0 else 0.0
    for t in trials:
        if t.pieces or t is first:
            continue
        if t.kind == "thread" and t.workers < first.workers and step < STEP_SHARE:
            t.skipped = f"the loop waited for data: step {step:.0%} of each interval"
        elif t.kind == "process" and cpu >= CPU_FULL and gil < GIL_SHARE:
            t.skipped = (f"{name(first)} kept {cpu:.0%} of {cores} cores busy, "
                         f"sample_transform {gil:.0%} of the stage time")
        t.dropped = t.dropped or bool(t.skipped)


def equal_turn(workers: list[int]) -> int:
    """Batches per turn for candidates of these worker counts: the least common multiple
    (``w`` workers build a turn's batches ``w`` at a time, so a turn that is a multiple of
    every count ends with no worker idle while others finish), at least 4; where that
    multiple exceeds twice the largest count, twice the largest count (the counts that do
    not divide it -- ``cores / 2`` threads on an odd core count -- keep a small edge)."""
    counts = [max(1, w) for w in workers] or [1]
    top, multiple = max(counts), math.lcm(*counts)
    return max(4, multiple if multiple <= 2 * top else 2 * top)


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


def candidates(cores: int, max_workers: int, processes: bool = True) -> list[tuple[str, int]]:
    """(worker kind, count) to try on ``cores`` cores, cheapest first (``processes``: with
    a process setting).

    For ``cores`` = CPU cores this process may use / ``LOCAL_WORLD_SIZE`` (usable_cores):
    ``cores / 2`` threads (enough when the training loop itself needs a core, or the machine
    is shared), ``cores`` threads (decode, resize and copies release the GIL), ``2 x cores``
    threads (covers reads that wait on a disk or the network), and ``cores`` processes
    (Python that holds the GIL -- a ``sample_transform``, and at raw-record rates the
    per-sample Python glue itself -- runs in parallel only in processes; docs/benchmarks.md,
    "num_workers=auto", round 2)."""
    c = max(1, min(cores, max_workers))
    out = [("thread", max(1, c // 2)), ("thread", c), ("thread", min(2 * c, max_workers))]
    out += [("process", c)] if processes else []
    return list(dict.fromkeys(out))  # no setting twice (max_workers may fold them)
