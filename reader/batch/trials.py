"""What ``num_workers="auto"`` measures and how it judges: a candidate's trial (its turns,
each a piece of consecutive batches timed whole), the choice, the drop and tie rules, which
candidates a first look at the host makes pointless, and the later check of a choice (pure
functions; the Tuner in autotune.py drives them).

Auto never does worse than the setting it replaces: the **incumbent**, the Loader's default
(INCUMBENT: 2 threads), is always a candidate, and another setting takes its place only when
its median is more than CLEAR faster in the trials (``choose``) *and again* at the check
later in the run (``Check``); otherwise the incumbent builds the batches.

Equal work: every candidate's turn is the same number of batches (``span``, equal_turn), a
multiple of every candidate's worker count, so the candidates are judged on the throughput
of equal work, and no turn ends with some workers idle while others finish. The first turn
is the incumbent's; from it, ``skip`` reads two facts of the host before the other
candidates pay a turn:

* the **step share**: the part of each interval the training loop spent outside
  ``next()``. Under STEP_SHARE the loop waits for data, so fewer threads than the
  incumbent's cannot deliver sooner: those candidates are skipped;
* the **GIL share** of a batch: the user's ``sample_transform`` seconds over all the stage
  seconds of the piece (the build stage's own figures), and the **CPU share**: CPU seconds of the piece over
  its wall seconds x ``cores``. Processes can only win where threads leave cores idle
  because Python holds the GIL; when the threads already kept CPU_FULL of every core busy
  and the GIL share is under GIL_SHARE, the process candidate is skipped.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

INCUMBENT = ("thread", 2)  # the Loader's default setting: what num_workers="auto" replaces
CLEAR = 0.05          # a challenger replaces the incumbent only when this much faster (its
#                       median interval), in the trials and again at the check (4 threads on
#                       2 busy cores once won a trial by noise and ran at 55% of 2 threads)
TIE = 0.02            # within 2% of the best is equal (the trials' convergence; without an
#                       incumbent, the cheaper of equals wins)
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
    user_s: float = 0.0    # workers' seconds in the sample_transform (the build stage's USER)
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


def choose(trials: list[Trial], incumbent: Trial | None = None) -> Trial:
    """The setting to keep: the fastest trial only when its median interval beats the
    ``incumbent``'s by more than CLEAR, else the incumbent. Without an incumbent, the trial
    with the shortest interval, the first of those within TIE of it."""
    best = min(t.interval for t in trials)
    fastest = next(t for t in trials if t.interval <= best * (1 + TIE) or best == math.inf)
    if incumbent is None or fastest is incumbent:
        return fastest
    return fastest if fastest.interval < incumbent.interval * (1 - CLEAR) else incumbent


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
    """After ``first`` (the incumbent) measured a piece, skip the candidates the host
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


def candidates(cores: int, max_workers: int, processes: bool = True) -> list[tuple[str, int]]:
    """(worker kind, count) to try on ``cores`` cores, cheapest first (``processes``: with
    a process setting).

    For ``cores`` = CPU cores this process may use / ``LOCAL_WORLD_SIZE`` (usable_cores):
    threads, fewest first: the incumbent's 2 (INCUMBENT, the default auto replaces),
    ``cores / 2`` (enough when the training loop itself needs a core, or the machine is
    shared), ``cores`` (decode, resize and copies release the GIL) and ``2 x cores`` (covers
    reads that wait on a disk or the network); then ``cores`` processes (Python that holds the
    GIL -- a ``sample_transform``, and at raw-record rates the per-sample Python glue itself --
    runs in parallel only in processes)."""
    c = max(1, min(cores, max_workers))
    counts = {max(1, c // 2), c, min(2 * c, max_workers), min(INCUMBENT[1], max_workers)}
    return [("thread", n) for n in sorted(counts)] + ([("process", c)] if processes else [])


# ---- the second look: a challenger against the incumbent, later on --------------------
# The trials settle on a few short pieces taken at one moment; on a shared machine whose
# capacity swings that moment can favour a setting the rest of the run does not. So when the
# trials chose a challenger over the incumbent, the Tuner (autotune.py) gives the two equal
# turns again (whole turns of the trials' length, timed as the trials time them) later in the
# run: ``gap`` batches after the trials, or after a warm-up turn at the start of the next
# epoch. Both run as they would be settled (worker kind, count and batches in flight); the
# incumbent's engine stays parked from the trials (EnginePool.spare). The challenger is kept
# only when its median is again more than CLEAR faster; otherwise the incumbent returns. The
# check ends after two rounds when the third could not change that verdict (``certain``),
# and it happens once per Loader.
def certain(challenger: list[float], incumbent: list[float]) -> bool:
    """Whether one more piece each cannot change the check's verdict (two pieces each or
    more): the challenger's slowest piece still more than CLEAR faster than the incumbent's
    fastest (it stays), or its fastest not that much faster than the incumbent's slowest
    (the incumbent returns)."""
    if len(challenger) != len(incumbent) or len(challenger) < 2:
        return False
    stays = max(challenger) < min(incumbent) * (1 - CLEAR)
    returns = min(challenger) >= max(incumbent) * (1 - CLEAR)
    return stays or returns


@dataclass
class Check:
    """The later check: ``kept`` (the challenger the trials chose) against ``other`` (the
    incumbent), fresh trials of ``span`` batches per turn, with the concrete LoaderOptions of
    each."""

    kept: Trial
    other: Trial
    settings: dict = field(default_factory=dict)   # id(trial) -> concrete LoaderOptions
    gap: int = 0    # batches after the trials (same epoch) before the check may start

    @classmethod
    def of(cls, best: Trial, incumbent: Trial, best_options, incumbent_options, gap: int):
        """A check of ``best`` against ``incumbent`` with fresh trials of the same span."""
        kept = Trial(best.kind, best.workers, span=best.piece())
        other = Trial(incumbent.kind, incumbent.workers, span=best.piece())
        return cls(kept, other, {id(kept): best_options, id(other): incumbent_options}, gap)

    def fresh(self) -> Check:
        """The same check with nothing measured (a check left unfinished starts over)."""
        kept, other = self.kept, self.other
        return Check.of(kept, other, self.options(kept), self.options(other), self.gap)

    def options(self, trial: Trial):
        """The concrete LoaderOptions ``trial``'s turns run with."""
        return self.settings[id(trial)]

    def length(self) -> int:
        """Batches the whole check may deliver: ROUNDS turns each of ``span`` batches, and
        an untimed turn of the incumbent, whose engine starts at the check."""
        return (2 * ROUNDS + 1) * self.kept.piece()

    def next_turn(self, extra: Trial | None = None) -> Trial | None:
        """The challenger, then the incumbent, in turns; None once the verdict is certain
        or both measured ROUNDS pieces (``extra``: counted as one piece more)."""
        k = len(self.kept.pieces) + (extra is self.kept)
        o = len(self.other.pieces) + (extra is self.other)
        if (k == o and k >= ROUNDS) or (extra is None and certain(self.kept.pieces,
                                                                  self.other.pieces)):
            return None
        return self.kept if k <= o else self.other

    def winner(self) -> Trial:
        """The challenger when its median interval again beats the incumbent's by more than
        CLEAR, else the incumbent."""
        stays = self.kept.interval < self.other.interval * (1 - CLEAR)
        return self.kept if stays else self.other

    def describe(self) -> str:
        """The verdict with its figures, for the log line."""
        won = self.winner()
        verb = "kept" if won is self.kept else "switched back to"
        figures = ", ".join(f"{name(t)} {t.interval * 1000:.1f} ms/batch"
                            for t in (self.kept, self.other))
        return (f"{verb} {name(won)}: {figures} (medians of {len(self.kept.pieces)} and "
                f"{len(self.other.pieces)} turns of {self.kept.piece()} batches, taken "
                f"in turns; a setting replaces the default {name(self.other)} only when "
                f"{CLEAR:.0%} faster, in the trials and again here)")
