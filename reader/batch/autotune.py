"""``num_workers="auto"`` and ``prefetch="auto"``: the Loader settles its own worker setting.

The Loader delivers its first batches with a few candidate settings taking turns (up to
ROUNDS short pieces each, at batch boundaries), measures each one as the training loop sees
it, then keeps the best for the rest of the run and logs what it chose and why (one line;
also ``loader.stats().tuned``). A candidate's engine (workers and buffers) is started at its
first turn and parked between its turns (enginepool.py): a turn starts nothing, so it
measures the setting and not its start-up; from the second round on, the next candidate's
parked engine is handed the first batch of its turn while the running one builds its last
(``prime``), so no turn starts with an empty pipeline. Every candidate's piece is the same
number of batches (equal work), ``cores`` threads go first, and their first piece decides
which candidates the host makes pointless (trials.skip: fewer threads when the loop waits
for data, processes when the threads kept every core busy without a GIL-bound
``sample_transform``). Taking turns means a change in a shared
machine's load hits every candidate alike, and the median over a candidate's pieces drops a
piece that met a burst. After each round a candidate more than DROP slower than the best is
dropped (its turns would only cost), and once two rounds leave the candidates within TIE of
each other the trials end early; the setting is settled by the end of the first epoch
(on what was measured), and an epoch too short for one round keeps ``cores`` threads.

What a trial measures: the seconds between two deliveries, which is the slower of the
loader and the training step (the step is in the loop, not in our hands), over batches
after the trial's first (pipeline fill is not counted), and the CPU seconds per image of
this process and its worker processes. The best setting is the one with the shortest
(median) interval; settings within ``TIE`` of it are equal, and among equals the earlier
candidate wins (the candidates are listed cheapest first: threads before processes, fewer
before more). A loop that is not data-bound therefore keeps the cheapest setting.

The candidates, for ``cores`` = CPU cores this process may use / ``LOCAL_WORLD_SIZE`` (the
ranks of one node share its cores): ``cores / 2`` threads (enough when the training loop
itself needs a core, or the machine is shared), ``cores`` threads (decode, resize and
copies release the GIL), ``2 x cores`` threads (covers reads that wait on a disk or the
network), and ``cores`` processes (Python that holds the GIL -- a ``sample_transform``,
and at raw-record rates the per-sample Python glue itself -- runs in parallel only in
processes; docs/benchmarks.md, "num_workers=auto", round 2). ``prefetch="auto"``:
``2 x workers`` batches in flight (one being built and one ready per worker), raised up to
``4 x workers`` only when the trial saw an irregularity of JITTER_RAISE or more (the slowest
window of ``workers`` deliveries over the mean one): a deeper queue only absorbs jitter, the
steady rate is the workers', and a new depth costs an engine restart.

Nothing here can change a batch: its samples are a pure function of (seed, epoch, rank,
world size, batch size, drop_last, indices) and its augmentations of (seed, epoch, sample
index), whichever engine builds it, so the tuning is invisible in the data and in
``state_dict`` (a resumed epoch reads the same batches with whatever setting is running).
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import replace

from dlpack_io.reader.batch import stagetimes
from dlpack_io.reader.batch.engine import deliver, prime
from dlpack_io.reader.batch.enginepool import EnginePool
from dlpack_io.reader.batch.stats import tree_cpu
from dlpack_io.reader.batch.trials import (ROUNDS, Trial, choose, converged, describe,
                                           drop_losers, name, skip)

__all__ = ["AUTO", "Shifted", "Trial", "Tuner", "candidates", "choose", "converged",
           "drop_losers", "usable_cores"]
log = logging.getLogger(__name__)
AUTO = "auto"
JITTER_RAISE = 1.5    # prefetch="auto" goes deeper than 2 x workers only from this jitter on


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
    a process setting)."""
    c = max(1, min(cores, max_workers))
    out = [("thread", max(1, c // 2)), ("thread", c), ("thread", min(2 * c, max_workers))]
    out += [("process", c)] if processes else []
    return list(dict.fromkeys(out))  # no setting twice (max_workers may fold them)


class Tuner:
    """Which setting builds the batches now; trials the candidates, then settles."""

    def __init__(self, options, on_setting=None, cores: int | None = None):
        """``options``: the LoaderOptions asked for; ``on_setting(num_workers, worker_kind,
        reason)`` hears of every setting in use (the stats clock)."""
        from dlpack_io.reader.batch.options import MAX_PREFETCH, MAX_WORKERS

        self.asked, self._max_prefetch = options, MAX_PREFETCH
        self._tell = on_setting or (lambda *args: None)
        auto_workers = options.num_workers == AUTO
        self.auto_prefetch = options.prefetch == AUTO
        self.cores = usable_cores() if cores is None else cores
        if auto_workers:
            kinds = candidates(self.cores, MAX_WORKERS)
        else:
            kinds = [(options.worker_kind, int(options.num_workers))]
        self.trials = [Trial(kind, n) for kind, n in kinds]
        # too short an epoch to measure: cores threads (every heavy step releases the GIL)
        self.fallback = next((t for t in self.trials if t.kind == "thread" and auto_workers
                              and t.workers == min(self.cores, MAX_WORKERS)), self.trials[0])
        span = self.fallback.piece()  # equal work: every candidate's piece as long
        for t in self.trials if auto_workers else ():
            t.span = span
        self.settled = not (auto_workers or self.auto_prefetch) or not self.trials[0].workers
        self.reason = "" if self.settled else "measuring " + ", ".join(
            name(t) for t in self.trials)
        self.engines = EnginePool()  # the candidates' engines, parked between their turns
        self.engines.parking = not self.settled
        self._primed = None  # (engine, first batch, count): the next turn's batches submitted
        self._use(self._concrete(self.fallback, None))

    def one_round(self) -> int:
        """Batches that one round of the trials delivers (each candidate's piece + fill)."""
        return sum(t.piece() + 1 for t in self.trials)

    def _concrete(self, trial: Trial, prefetch) -> object:
        asked = self.asked
        if prefetch is None:
            prefetch = None if asked.prefetch == AUTO else asked.prefetch
        return replace(asked, num_workers=trial.workers, worker_kind=trial.kind,
                       prefetch=prefetch)

    def next_turn(self, extra: Trial | None = None) -> Trial | None:
        """The next turn: the candidate with the fewest pieces, ``cores`` threads first,
        then in order (``extra``: counted as if it had measured one more piece)."""
        def pieces(t):
            return len(t.pieces) + (t is extra)
        left = [t for t in self.trials if not t.dropped and pieces(t) < ROUNDS]
        return min(left, key=lambda t: (pieces(t), self._rank(t))) if left else None

    def _rank(self, trial: Trial) -> tuple:
        """Turn order within a round: ``cores`` threads (its first piece decides what to
        skip: trials.skip), then more threads, then those skip may rule out."""
        first = self.fallback
        maybe = trial.kind == "process" or trial.workers < first.workers
        return trial is not first, maybe, self.trials.index(trial)

    def deliver(self, engine, swap, batches, start, ticket0, prefetch, epoch, on_batch):
        """engine.deliver's batches, in order, with the trials in between; ``swap(options)``
        closes the running engine and returns one built for ``options``."""
        k = start
        if not self.settled and len(batches) - start < self.one_round():
            engine = self.settle(engine, swap, short=len(batches) - start)
        while not self.settled and k < len(batches):
            trial = self.next_turn()
            if trial is None:
                engine = self.settle(engine, swap)
                break
            if (trial.kind, trial.workers) != (self.options.worker_kind, self.options.num_workers):
                self._use(self._concrete(trial, None))
                engine = swap(self.options)
            end = min(len(batches), k + trial.piece() + 1)
            yield from self._measured(trial, engine, batches, k, end, ticket0,
                                      Shifted(prefetch, k - start), epoch, on_batch)
            if trial is self.fallback and len(trial.pieces) == 1:
                skip(self.trials, trial, self.cores)
            drop_losers(self.trials)
            k = end
            if converged(self.trials) and k < len(batches):
                engine = self.settle(engine, swap)
        if not self.settled:  # the first epoch ends: settled on what it measured
            engine = self.settle(engine, swap)
        if k < len(batches):
            yield from deliver(engine, batches, k, ticket0, Shifted(prefetch, k - start),
                               epoch, self.options.in_flight, on_batch, self._take(engine, k))

    def _take(self, engine, k: int) -> int:
        """Batches from ``k`` already submitted to ``engine`` by a priming (0: none)."""
        primed, self._primed = self._primed, None
        return primed[2] if primed and primed[0] is engine and primed[1] == k else 0

    def _prime(self, trial: Trial, batches, end: int, ticket0: int, epoch: int) -> None:
        """Overlap the turns: the next candidate's parked engine takes the first batch of
        its turn while ``trial`` builds its last, so no turn after the first round starts
        empty. Local data only (a remote batch waits on the prefetcher, in deliver's order).
        Primed before the turn's figures are in: a candidate dropped (or not chosen) right
        after keeps that one batch unread until its engine is closed at settle."""
        after = self.next_turn(extra=trial)
        engine = None if after is None or after is trial or end >= len(batches) else \
            self.engines.parked(self._concrete(after, None))
        if engine is not None:
            self._primed = (engine, end, prime(engine, batches, end, ticket0, epoch, 1))

    def _measured(self, trial, engine, batches, k, end, ticket0, prefetch, epoch, on_batch):
        last = cpu0 = None
        piece, step = [], 0.0
        for item in deliver(engine, batches[:end], k, ticket0, prefetch, epoch,
                            self.options.in_flight, on_batch, self._take(engine, k)):
            now, cpu = time.perf_counter(), tree_cpu(engine.runner.pids)
            if last is not None:  # the first delivery of a piece pays start-up and fill
                piece.append(now - last)
                trial.cpu_s, trial.images = trial.cpu_s + cpu - cpu0, trial.images + len(item[2])
                stages = stagetimes.totals(item[1].stages)
                if stages is not None:
                    trial.user_s += float(stages[stagetimes.USER])
                    trial.stage_s += float(stages.sum())
            if item[0] == end - 2 and prefetch is None:
                self._prime(trial, batches, end, ticket0, epoch)
            last, cpu0, handed = now, cpu, time.perf_counter()
            yield item  # the step runs here: the next interval spans it, as the loop sees it
            step += time.perf_counter() - handed if len(piece) < trial.piece() else 0.0
        if piece:
            trial.intervals += piece
            trial.pieces.append(sum(piece) / len(piece))
            trial.wall_s, trial.step_s = trial.wall_s + sum(piece), trial.step_s + step

    def settle(self, engine, swap, short: int = 0):
        """Keep the best trial's setting (``prefetch="auto"``: its depth too), log why;
        returns the engine to go on with (``swap``'s when the setting changes; the parked
        candidates' engines are closed). ``short``: the epoch has only this many batches,
        too few for one round of trials: the fallback setting, unmeasured."""
        best = self.fallback if short else choose(self.trials)
        prefetch, jitter = None, best.jitter()
        if self.auto_prefetch:  # deeper only for a real irregularity: it costs a restart
            depth = math.ceil(2 * best.workers * jitter) if jitter >= JITTER_RAISE else 0
            prefetch = min(self._max_prefetch, 4 * best.workers, max(2, 2 * best.workers, depth))
        chosen = self._concrete(best, prefetch)
        self.settled, self.engines.parking = True, False
        why = f"not measured: an epoch of {short} batches is too short for the trials" \
            if short else "measured: " + "; ".join(describe(t) for t in self.trials)
        self.reason = (f"num_workers={chosen.num_workers} worker_kind={chosen.worker_kind!r} "
                       f"prefetch={chosen.in_flight} ({why})")
        log.info("Loader auto setting: %s", self.reason)
        same = (chosen.worker_kind, chosen.num_workers, chosen.in_flight) == \
            (self.options.worker_kind, self.options.num_workers, self.options.in_flight)
        self._use(chosen)
        if same:
            self.engines.close()
        return engine if same else swap(chosen)

    def _use(self, options) -> None:
        self.options = options
        self._tell(options.num_workers, options.worker_kind, self.reason)


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
