"""``num_workers="auto"`` and ``prefetch="auto"``: the Loader settles its own worker setting.

The Loader delivers its first batches with a few candidate settings taking turns (up to
ROUNDS turns each, at batch boundaries), measures each as the training loop sees it, keeps
one for the rest of the run and logs what it chose and why (also ``loader.stats().tuned``).
It never does worse than the setting it replaces: the incumbent (the Loader's default, 2
threads) builds the batches unless another candidate is more than trials.CLEAR faster in
the trials and again at a check later in the run (trials.Check); an epoch too short for the
warm-up and one round keeps the incumbent, unmeasured.

An untimed warm-up turn of the incumbent comes first (the epoch's own start); a candidate's
engine is started at its first turn, which is not timed either, and parked between its turns
(:class:`EnginePool`, at the end of this module), so a timed turn measures the setting, not
a start-up. Every turn is the same number of batches (trials.equal_turn: a multiple of every
candidate's worker count) and starts with an empty pipeline. The incumbent goes first; its
first turn decides which candidates the host makes pointless (trials.skip). Turns taken in
turn mean a change in a shared machine's load hits every candidate alike; the median over a
candidate's turns drops one that met a burst. After each round a candidate more than DROP
slower than the best is dropped, and once two rounds leave every candidate within TIE of the
best or clearly behind it the trials end early; the setting is settled by the end of the
first epoch.

What a turn measures: its whole time, from the loop asking for its first batch to the loop
asking for the one after its last, over its batches (the slower of the loader and the
training step), and the CPU seconds per image of this process and its worker processes over
the same span (timing only the deliveries after a turn's first credited ``w`` workers with
the ``w - 1`` batches they finish together with it).

``prefetch="auto"``: ``2 x workers`` batches in flight (one being built and one ready per
worker), raised up to ``4 x workers`` only when the trial saw an irregularity of
JITTER_RAISE or more (the costliest window of ``2 x workers`` batches over the mean): a
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

from dlpack_io.reader.batch.errors import LoaderError
from dlpack_io.reader.batch.options import AUTO, MAX_PREFETCH, MAX_WORKERS
from dlpack_io.reader.batch.pipeline import Run, Shifted, deliver
from dlpack_io.reader.batch.stats import STAGES, tree_cpu, usable_cores
from dlpack_io.reader.batch.trials import (INCUMBENT, ROUNDS, Check, Trial, candidates, choose,
                                           converged, describe, drop_losers, equal_turn, name,
                                           skip)

__all__ = ["AUTO", "Shifted", "Trial", "Tuner", "candidates", "choose", "converged",
           "drop_losers", "usable_cores"]
log = logging.getLogger(__name__)
_USER, _STAGE_COUNT = STAGES.index("user"), len(STAGES)
TWO_ITERATORS = ("a newer iterator of this Loader started while num_workers='auto' measures, "
                 "swapping the workers: not supported before stats().tuned says 'checked later'")
JITTER_RAISE = 2.0    # prefetch="auto" goes deeper than 2 x workers only from this jitter on


class Tuner:
    """Which setting builds the batches now; trials the candidates, then settles."""

    def __init__(self, options, on_setting=None, cores: int | None = None):
        """``options``: the LoaderOptions asked for; ``on_setting(num_workers, worker_kind,
        reason)`` hears of every setting in use (the stats clock)."""
        self.asked, self._max_prefetch = options, MAX_PREFETCH
        self._tell = on_setting or (lambda *args: None)
        auto_workers = options.num_workers == AUTO
        self.auto_prefetch = options.workers.prefetch == AUTO
        self.cores = usable_cores() if cores is None else cores
        if auto_workers:
            kinds = candidates(self.cores, MAX_WORKERS)
        else:
            kinds = [(options.workers.kind, int(options.num_workers))]
        self.trials = [Trial(kind, n) for kind, n in kinds]
        # the incumbent: the Loader's default setting, what auto replaces only when another
        # wins clearly twice (trials.py); also what a too short epoch keeps, unmeasured
        self.fallback = next((t for t in self.trials if auto_workers and
                              (t.kind, t.workers) == INCUMBENT), self.trials[0])
        span = equal_turn([t.workers for t in self.trials])  # equal work, whole turns
        for t in self.trials if auto_workers else ():
            t.span = span
        self.settled = not (auto_workers or self.auto_prefetch) or not self.trials[0].workers
        self.reason = "" if self.settled else "measuring " + ", ".join(
            name(t) for t in self.trials)
        self.engines = EnginePool()  # the candidates' engines, parked between their turns
        self.engines.parking = not self.settled
        self.check, self._newest = None, 0  # trials.Check; deliveries started measuring
        self._why = ""       # what the choice rests on, in words (the log line's parentheses)
        self._use(self._concrete(self.fallback, None))

    def one_round(self) -> int:
        """Batches that the first round of the trials delivers: each candidate's turn, and
        before it an untimed one for every candidate but ``cores`` threads (_turn: its
        engine starts then)."""
        return sum(t.piece() * (1 + (t is not self.fallback)) for t in self.trials)

    def _concrete(self, trial: Trial, prefetch) -> object:
        asked = self.asked
        if prefetch is None:
            prefetch = None if asked.workers.prefetch == AUTO else asked.workers.prefetch
        return asked.with_setting(trial.workers, trial.kind, prefetch)

    def next_turn(self, extra: Trial | None = None) -> Trial | None:
        """The next turn: the candidate with the fewest turns, ``cores`` threads first,
        then in order (``extra``: counted as if it had measured one more turn)."""
        def pieces(t):
            return len(t.pieces) + (t is extra)
        left = [t for t in self.trials if not t.dropped and pieces(t) < ROUNDS]
        return min(left, key=lambda t: (pieces(t), self._rank(t))) if left else None

    def _rank(self, trial: Trial) -> tuple:
        """Turn order within a round: ``cores`` threads (its first turn decides what to
        skip: trials.skip), then more threads, then those skip may rule out."""
        first = self.fallback
        maybe = trial.kind == "process" or trial.workers < first.workers
        return trial is not first, maybe, self.trials.index(trial)

    def deliver(self, engine, swap, batches, start, ticket0, prefetch, epoch, on_batch):
        """engine.deliver's batches, in order, with the trials (and later the check of the
        choice: trials.Check) in between; ``swap(options)`` closes or parks the running engine
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
        warm = self.trials[0].piece()  # a turn's length, delivered before anything is timed
        if not self.settled and len(batches) - k < warm + self.one_round():
            engine = self.settle(engine, swap, short=len(batches) - k)
        if not self.settled:
            k = yield from self._plain(engine, run, k, k + warm)
            engine, k = yield from self._trials(engine, swap, run, k)
        if self.check is not None and k < len(batches):
            engine, k = yield from self._confirm(engine, swap, run, k, trials_now)
        yield from self._plain(engine, run, k, len(batches))

    def _plain(self, engine, run, k: int, end: int):
        """Deliver batches ``k`` to ``end`` (at most the epoch's) with ``engine``, timing
        nothing; returns the next batch. Before the trials (and a check at an epoch's
        start), one turn's worth warms up what every setting would pay once in a fresh
        epoch (the first reads, the first buffers, the pipeline's fill) so that no
        candidate's first turn is charged for it."""
        end = min(end, len(run.batches))
        if k < end:
            yield from deliver(engine, run.batches[:end], k, run.ticket0, run.shifted(k),
                               run.epoch, self.options.in_flight, run.on_batch)
        return max(k, end)

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
        """The check of the challenger against the incumbent (trials.Check), once: ``gap``
        batches after trials of this epoch, or one turn's worth (a warm-up: _plain) into a
        later epoch, when the epoch still holds the whole check; returns (engine, next
        batch)."""
        kept = self.check.options(self.check.kept)
        if not trials_now and engine_key(kept) != engine_key(self.options):
            self._use(kept)  # a check cut short left the incumbent's workers running
            engine = swap(kept)
        begin = min(len(run.batches), k + (self.check.gap if trials_now else
                                           self.check.kept.piece()))
        if len(run.batches) - begin < self.check.length():
            return engine, k  # the next epoch's start
        yield from self._plain(engine, run, k, begin)
        check, k = self.check.fresh(), begin
        self.check, self.engines.parking = check, True
        while (trial := check.next_turn()) is not None:
            engine, k = yield from self._turn(trial, check.options(trial), engine, swap, run, k)
        won, self.check, self.engines.spare = check.winner(), None, None
        self._why = f"{self._why[:-1]}; checked later: {check.describe()})"
        engine = self._keep(check.options(won), engine, swap)
        log.info("Loader auto setting, checked later: %s", self.reason)
        return engine, k

    def _turn(self, trial: Trial, options, engine, swap, run, k: int):
        """One turn of ``trial`` (run with concrete ``options``) from batch ``k``: its
        ``piece()`` batches, timed whole; returns (engine, next batch). An engine just
        started first takes an untimed turn: its first batches (first buffers, first use
        of each worker) are a start-up a fixed setting pays once too, not its rate (a
        4-thread engine's first turn measured 6x its steady seconds per batch)."""
        fresh = False
        if engine_key(options) != engine_key(self.options):
            self._use(options)
            engine, fresh = swap(options), self.engines.fresh
        end = min(len(run.batches), k + trial.piece())
        if fresh:
            k = yield from self._plain(engine, run, k, end)
            end = min(len(run.batches), k + trial.piece())
        yield from self._measured(trial, engine, run, k, end)
        return engine, end

    def _measured(self, trial, engine, run, k, end):
        """Deliver batches ``k`` to ``end`` from ``engine`` (an empty pipeline: every turn
        starts as every other does) and add the turn to ``trial``: its seconds per batch
        from the loop asking for the first to the loop asking for the one after the last,
        steps included, and the CPU, images and stage seconds over the same span. A turn
        the epoch cut short is not a piece (its length would not be the others')."""
        start, cpu0 = time.perf_counter(), tree_cpu(engine.runner.pids)
        builds, step, images, user = [], 0.0, 0, 0.0
        for item in deliver(engine, run.batches[:end], k, run.ticket0, run.shifted(k),
                            run.epoch, self.options.in_flight, run.on_batch):
            images += len(item[2])
            stages = item[1].stages
            if stages is not None:  # prefetch="auto"'s jitter: the batch's build seconds
                user += float(stages[_USER])
                builds.append(float(stages.sum()))
            handed = time.perf_counter()
            yield item  # the step runs here: the turn's time spans it, as the loop sees it
            step += time.perf_counter() - handed
        wall, cpu = time.perf_counter() - start, tree_cpu(engine.runner.pids) - cpu0
        trial.builds += builds
        stage = sum(builds)
        if end - k == trial.piece() and wall > 0:
            trial.pieces.append(wall / (end - k))
            trial.wall_s, trial.step_s = trial.wall_s + wall, trial.step_s + step
            trial.cpu_s, trial.images = trial.cpu_s + cpu, trial.images + images
            trial.user_s, trial.stage_s = trial.user_s + user, trial.stage_s + stage

    def _depth(self, trial: Trial):
        """``prefetch="auto"``'s depth for ``trial``'s setting (None: the one asked for):
        deeper than 2 x workers only for a real irregularity, since it costs a restart."""
        if not self.auto_prefetch:
            return None
        jitter = trial.jitter()
        depth = math.ceil(2 * trial.workers * jitter) if jitter >= JITTER_RAISE else 0
        return min(self._max_prefetch, 4 * trial.workers, max(2, 2 * trial.workers, depth))

    def settle(self, engine, swap, short: int = 0):
        """Keep the chosen setting (``prefetch="auto"``: its depth too), log why; returns the
        engine to go on with (``swap``'s when the setting changes). A challenger chosen over
        the incumbent meets it again later (trials.Check): the incumbent's engine stays
        parked for that; the other parked engines are closed. ``short``: the epoch has only
        this many batches, too few for one round of trials: the incumbent, unmeasured."""
        incumbent = self.fallback
        best = incumbent if short else choose(self.trials, incumbent)
        chosen = self._concrete(best, self._depth(best))
        if best is not incumbent:
            other = self._concrete(incumbent, self._depth(incumbent))
            self.check = Check.of(best, incumbent, chosen, other, gap=self.one_round())
            self.engines.spare = engine_key(other)  # its parked workers wait for the check
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
        self.reason = (f"num_workers={chosen.num_workers} worker_kind={chosen.workers.kind!r} "
                       f"prefetch={chosen.in_flight} {self._why}")
        self._use(chosen)
        if same:
            self.engines.close(self.engines.spare)
        return engine if same else swap(chosen)

    def _use(self, options) -> None:
        self.options = options
        self._tell(options.num_workers, options.workers.kind, self.reason)


# ---- engines parked between turns ------------------------------------------------------
# The engines of ``num_workers="auto"``'s candidates, kept alive between their turns.
#
# While the tuner (autotune.py) tries its candidates in turns, the engine of a candidate whose
# turn ended is parked here, idle, rather than closed: its next turn goes on with the same
# workers and buffers (no thread or process start, no fresh buffers to fault in, which on a
# fast data set cost more than the batches of a turn). Once the setting is settled, every
# parked engine is closed and an engine is closed, never parked, when it is swapped out.
# Every engine is closed through ``stop`` (the Loader's: the stats clock reads the CPU of
# its worker processes as they go), and ``pids`` lists the parked engines' worker processes
# (their CPU counts toward the epoch as the running engine's does: pipeline.StatsClock).
def engine_key(options) -> tuple:
    """What makes two engines interchangeable: worker kind, worker count, batches in flight."""
    return options.workers.kind, int(options.num_workers), options.in_flight


class EnginePool:
    """Parked engines by ``engine_key``; ``parking`` is on while the candidates are on trial."""

    def __init__(self, make=None):
        self.idle: dict = {}
        self.parking = False
        self.make = make      # options -> a new engine (the Loader's)
        self.stop = None      # engine -> None: closes it (None: engine.close())
        self._running = None  # the key of the engine swap() last handed out
        self.fresh = False    # whether swap() last handed out a new engine (not a parked one)
        self.spare = None     # the key of a parked engine kept past the trials (the incumbent's,
        #                       until the later check: trials.Check), or None

    def swap(self, engine, options):
        """The engine for concrete LoaderOptions ``options``: a parked one of the same key,
        or ``self.make(options)``. ``engine`` (the running one, or None) is parked while
        ``parking`` or when it is the ``spare``, closed otherwise (and then every parked
        engine but the spare is closed too)."""
        if engine is not None:
            if (self.parking or self._running == self.spare) and self._running not in self.idle:
                self.idle[self._running] = engine
            else:
                self._stop(engine)
        key = engine_key(options)
        found = self.idle.pop(key, None)
        if not self.parking:
            self.close(self.spare)
        self._running, self.fresh = key, found is None
        return found if found is not None else self.make(options)

    def close(self, spare=None) -> None:
        """Close every parked engine (the running one belongs to the Loader) but the one of
        key ``spare``."""
        idle = self.idle
        self.idle = {key: engine for key, engine in idle.items() if key == spare}
        for key, engine in idle.items():
            if key != spare:
                self._stop(engine)

    def pids(self) -> list[int]:
        """Process ids of the parked engines' worker processes (none for threads)."""
        return [pid for engine in list(self.idle.values()) for pid in engine.runner.pids]

    def _stop(self, engine) -> None:
        if self.stop is None:
            engine.close()
        else:
            self.stop(engine)
