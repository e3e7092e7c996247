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

The candidates: trials.candidates. Once settled, the chosen setting meets the runner-up
once more, later in the run (confirm.py: equal pieces in turns, the runner-up takes over
only when clearly faster), so that one unlucky moment of a shared machine does not decide
the whole run.

``prefetch="auto"``: ``2 x workers`` batches in flight (one being built and one ready per
worker), raised up to ``4 x workers`` only when the trial saw an irregularity of
JITTER_RAISE or more (the slowest window of ``workers`` deliveries over the mean one): a
deeper queue only absorbs jitter, the steady rate is the workers', and a new depth costs an
engine restart.

Nothing here can change a batch: its samples are a pure function of (seed, epoch, rank,
world size, batch size, drop_last, indices) and its augmentations of (seed, epoch, sample
index), whichever engine builds it, so the tuning is invisible in the data and in
``state_dict`` (a resumed epoch reads the same batches with whatever setting is running).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import replace

from dlpack_io.reader.batch import stagetimes
from dlpack_io.reader.batch.confirm import Check, runner_up
from dlpack_io.reader.batch.engine import Run, Shifted, deliver, prime
from dlpack_io.reader.batch.enginepool import EnginePool, engine_key
from dlpack_io.reader.batch.errors import LoaderError
from dlpack_io.reader.batch.stats import tree_cpu
from dlpack_io.reader.batch.trials import (ROUNDS, Trial, candidates, choose, converged,
                                           describe, drop_losers, name, skip, usable_cores)

__all__ = ["AUTO", "Shifted", "Trial", "Tuner", "candidates", "choose", "converged",
           "drop_losers", "usable_cores"]
log = logging.getLogger(__name__)
AUTO = "auto"
TWO_ITERATORS = ("a newer iterator of this Loader started while num_workers='auto' measures, "
                 "swapping the workers: not supported before stats().tuned says 'checked later'")
JITTER_RAISE = 1.5    # prefetch="auto" goes deeper than 2 x workers only from this jitter on


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
        self.check, self._newest = None, 0  # confirm.Check; deliveries started measuring
        self._why = ""       # what the choice rests on, in words (the log line's parentheses)
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
        """engine.deliver's batches, in order, with the trials (and later the check of the
        choice: confirm.py) in between; ``swap(options)`` closes or parks the running engine
        and returns one built for ``options`` (an iteration overtaken: TWO_ITERATORS)."""
        run = Run(batches, start, ticket0, prefetch, epoch, on_batch)
        if self.settled and self.check is None:  # nothing swaps the workers any more
            return self._batches(engine, swap, run)
        self._newest += 1
        return self._guarded(self._newest, self._batches(engine, swap, run))

    def _guarded(self, mine: int, items):
        for item in items:
            yield item
            if mine != self._newest:
                raise LoaderError(TWO_ITERATORS)

    def _batches(self, engine, swap, run):
        batches, k, trials_now = run.batches, run.start, not self.settled
        if not self.settled and len(batches) - k < self.one_round():
            engine = self.settle(engine, swap, short=len(batches) - k)
        if not self.settled:
            engine, k = yield from self._trials(engine, swap, run, k)
        if self.check is not None and k < len(batches):
            engine, k = yield from self._confirm(engine, swap, run, k, trials_now)
        if k < len(batches):
            yield from deliver(engine, batches, k, run.ticket0, run.shifted(k), run.epoch,
                               self.options.in_flight, run.on_batch, self._take(engine, k))

    def _trials(self, engine, swap, run, k: int):
        """The candidates' turns from batch ``k`` until settled (at the latest when the
        epoch ends); returns (engine, next batch)."""
        while not self.settled and k < len(run.batches):
            trial = self.next_turn()
            if trial is None:
                break
            engine, k = yield from self._turn(trial, self._concrete(trial, None), engine,
                                              swap, run, k)
            if trial is self.fallback and len(trial.pieces) == 1:
                skip(self.trials, trial, self.cores)
            drop_losers(self.trials)
            if converged(self.trials) and k < len(run.batches):
                break
        return self.settle(engine, swap), k

    def _confirm(self, engine, swap, run, k: int, trials_now: bool):
        """The check of the choice against the runner-up (confirm.py), once: ``gap``
        batches after trials of this epoch, or from ``k`` in a later epoch, when the epoch
        still holds the whole check; returns (engine, next batch)."""
        begin = min(len(run.batches), k + self.check.gap) if trials_now else k
        if len(run.batches) - begin < self.check.length():
            return engine, k  # the next epoch's start
        if begin > k:
            yield from deliver(engine, run.batches[:begin], k, run.ticket0, run.shifted(k),
                               run.epoch, self.options.in_flight, run.on_batch,
                               self._take(engine, k))
        check, k = self.check.fresh(), begin
        self.check, self.engines.parking = check, True
        while (trial := check.next_turn()) is not None:
            engine, k = yield from self._turn(trial, check.options(trial), engine, swap, run, k)
        won, self.check = check.winner(), None
        self._why = f"{self._why[:-1]}; checked later: {check.describe()})"
        engine = self._keep(check.options(won), engine, swap)
        log.info("Loader auto setting, checked later: %s", self.reason)
        return engine, k

    def _turn(self, trial: Trial, options, engine, swap, run, k: int):
        """One turn of ``trial`` (run with concrete ``options``) from batch ``k``: its
        piece of intervals, plus the first delivery (fill); returns (engine, next batch)."""
        if engine_key(options) != engine_key(self.options):
            self._use(options)
            engine = swap(options)
        end = min(len(run.batches), k + trial.piece() + 1)
        yield from self._measured(trial, engine, run, k, end)
        return engine, end

    def _take(self, engine, k: int) -> int:
        """Batches from ``k`` already submitted to ``engine`` by a priming (0: none)."""
        primed, self._primed = self._primed, None
        return primed[2] if primed and primed[0] is engine and primed[1] == k else 0

    def _after(self, trial: Trial):
        """(the turn after ``trial``'s, its concrete options), or None: the check's turns
        while it runs, else the trials'."""
        if self.check is not None and self.settled:
            after = self.check.next_turn(extra=trial)
            return None if after is None else (after, self.check.options(after))
        after = self.next_turn(extra=trial)
        return None if after is None else (after, self._concrete(after, None))

    def _prime(self, trial: Trial, run, end: int) -> None:
        """Overlap the turns: the next candidate's parked engine takes the first batch of
        its turn while ``trial`` builds its last, so no turn after the first round starts
        empty. Local data only (a remote batch waits on the prefetcher, in deliver's order).
        Primed before the turn's figures are in: a candidate dropped (or not chosen) right
        after keeps that one batch unread until its engine is closed at settle."""
        after = self._after(trial)
        engine = None if after is None or after[0] is trial or end >= len(run.batches) else \
            self.engines.parked(after[1])
        if engine is not None:
            self._primed = (engine, end, prime(engine, run.batches, end, run.ticket0,
                                               run.epoch, 1))

    def _measured(self, trial, engine, run, k, end):
        last = cpu0 = None
        piece, step = [], 0.0
        for item in deliver(engine, run.batches[:end], k, run.ticket0, run.shifted(k),
                            run.epoch, self.options.in_flight, run.on_batch,
                            self._take(engine, k)):
            now, cpu = time.perf_counter(), tree_cpu(engine.runner.pids)
            if last is not None:  # the first delivery of a piece pays start-up and fill
                piece.append(now - last)
                trial.cpu_s, trial.images = trial.cpu_s + cpu - cpu0, trial.images + len(item[2])
                stages = stagetimes.totals(item[1].stages)
                if stages is not None:
                    trial.user_s += float(stages[stagetimes.USER])
                    trial.stage_s += float(stages.sum())
            if item[0] == end - 2 and run.prefetch is None:
                self._prime(trial, run, end)
            last, cpu0, handed = now, cpu, time.perf_counter()
            yield item  # the step runs here: the next interval spans it, as the loop sees it
            step += time.perf_counter() - handed if len(piece) < trial.piece() else 0.0
        if piece:
            trial.intervals += piece
            trial.pieces.append(sum(piece) / len(piece))
            trial.wall_s, trial.step_s = trial.wall_s + sum(piece), trial.step_s + step

    def _depth(self, trial: Trial):
        """``prefetch="auto"``'s depth for ``trial``'s setting (None: the one asked for):
        deeper than 2 x workers only for a real irregularity, since it costs a restart."""
        if not self.auto_prefetch:
            return None
        jitter = trial.jitter()
        depth = math.ceil(2 * trial.workers * jitter) if jitter >= JITTER_RAISE else 0
        return min(self._max_prefetch, 4 * trial.workers, max(2, 2 * trial.workers, depth))

    def settle(self, engine, swap, short: int = 0):
        """Keep the best trial's setting (``prefetch="auto"``: its depth too), log why;
        returns the engine to go on with (``swap``'s when the setting changes; the parked
        candidates' engines are closed). ``short``: the epoch has only this many batches,
        too few for one round of trials: the fallback setting, unmeasured. The runner-up,
        if any, is checked against it later (confirm.py)."""
        best = self.fallback if short else choose(self.trials)
        chosen = self._concrete(best, self._depth(best))
        second = None if short or len(self.trials) < 2 else runner_up(self.trials, best)
        if second is not None:
            self.check = Check.of(best, second, chosen, self._concrete(second,
                                                                       self._depth(second)),
                                  gap=self.one_round())
        self.settled = True
        why = f"not measured: an epoch of {short} batches is too short for the trials" \
            if short else "measured: " + "; ".join(describe(t) for t in self.trials)
        self._why = f"({why})"
        engine = self._keep(chosen, engine, swap)
        log.info("Loader auto setting: %s", self.reason)
        return engine

    def _keep(self, chosen, engine, swap):
        """Go on with concrete ``chosen`` (parking off, the parked engines closed); returns
        the engine: the running one when it is ``chosen``'s, else ``swap``'s."""
        same = engine_key(chosen) == engine_key(self.options)
        self.engines.parking = False
        self.reason = (f"num_workers={chosen.num_workers} worker_kind={chosen.worker_kind!r} "
                       f"prefetch={chosen.in_flight} {self._why}")
        self._use(chosen)
        if same:
            self.engines.close()
        return engine if same else swap(chosen)

    def _use(self, options) -> None:
        self.options = options
        self._tell(options.num_workers, options.worker_kind, self.reason)
