"""``num_workers="auto"``'s second look: the chosen setting against the runner-up, later on.

The trials (trials.py) settle on a few short pieces taken at one moment; on a shared
machine whose capacity swings (docs/benchmarks.md, "num_workers=auto", round 3) that moment
can favour a setting the rest of the run does not. So, once settled, the Tuner (autotune.py)
gives the chosen setting and the runner-up (the fastest other candidate the trials kept)
equal turns again (whole turns of the trials' length, timed as the trials time them), later
in the run: ``gap`` batches after the trials, or after a warm-up turn at the start of the
next epoch. Both run as they would be settled (worker kind, count and batches in flight);
the runner-up's engine stays parked from the trials (EnginePool.spare). The runner-up takes over only when the median of its pieces is more than
MARGIN faster than the chosen one's (a margin against flapping between equals); the check
ends after two rounds when the third could not change that verdict (module ``certain``),
and it happens once per Loader.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dlpack_io.reader.batch.trials import ROUNDS, Trial, name

MARGIN = 0.03   # the runner-up must be this much faster (median interval) to take over


def runner_up(trials: list[Trial], best: Trial) -> Trial | None:
    """The fastest measured candidate other than ``best`` that the trials kept (not dropped,
    not skipped); the first of equals (the cheaper); None when there is none."""
    rest = [t for t in trials if t is not best and t.pieces and not t.dropped]
    return min(rest, key=lambda t: t.interval) if rest else None


def certain(kept: list[float], other: list[float]) -> bool:
    """Whether one more piece each cannot change the verdict (two pieces each or more):
    the runner-up's median stays at or above its smaller piece and the kept one's at or
    below its larger, and the other way round."""
    if len(kept) != len(other) or len(kept) < 2:
        return False
    keep = min(other) >= max(kept) * (1 - MARGIN)
    switch = max(other) < min(kept) * (1 - MARGIN)
    return keep or switch


@dataclass
class Check:
    """The later check: ``kept`` (the chosen setting) and ``other`` (the runner-up), fresh
    trials of ``span`` batches per turn, with the concrete LoaderOptions of each."""

    kept: Trial
    other: Trial
    settings: dict = field(default_factory=dict)   # id(trial) -> concrete LoaderOptions
    gap: int = 0    # batches after the trials (same epoch) before the check may start

    @classmethod
    def of(cls, best: Trial, second: Trial, best_options, second_options, gap: int):
        """A check of ``best`` against ``second`` with fresh trials of the same span."""
        kept = Trial(best.kind, best.workers, span=best.piece())
        other = Trial(second.kind, second.workers, span=best.piece())
        return cls(kept, other, {id(kept): best_options, id(other): second_options}, gap)

    def fresh(self) -> Check:
        """The same check with nothing measured (a check left unfinished starts over)."""
        kept, other = self.kept, self.other
        return Check.of(kept, other, self.options(kept), self.options(other), self.gap)

    def options(self, trial: Trial):
        """The concrete LoaderOptions ``trial``'s turns run with."""
        return self.settings[id(trial)]

    def length(self) -> int:
        """Batches the whole check may deliver: ROUNDS turns each of ``span`` batches, and
        an untimed turn of the runner-up, whose engine starts at the check."""
        return (2 * ROUNDS + 1) * self.kept.piece()

    def next_turn(self, extra: Trial | None = None) -> Trial | None:
        """The kept setting, then the runner-up, in turns; None once the verdict is certain
        or both measured ROUNDS pieces (``extra``: counted as one piece more)."""
        k = len(self.kept.pieces) + (extra is self.kept)
        o = len(self.other.pieces) + (extra is self.other)
        if (k == o and k >= ROUNDS) or (extra is None and certain(self.kept.pieces,
                                                                  self.other.pieces)):
            return None
        return self.kept if k <= o else self.other

    def winner(self) -> Trial:
        """The runner-up when its median interval beats the kept one's by more than MARGIN,
        else the kept setting."""
        switch = self.other.interval < self.kept.interval * (1 - MARGIN)
        return self.other if switch else self.kept

    def describe(self) -> str:
        """The verdict with its figures, for the log line."""
        won = self.winner()
        verb = "switched to" if won is self.other else "kept"
        figures = ", ".join(f"{name(t)} {t.interval * 1000:.1f} ms/batch"
                            for t in (self.kept, self.other))
        return (f"{verb} {name(won)}: {figures} (medians of {len(self.kept.pieces)} and "
                f"{len(self.other.pieces)} turns of {self.kept.piece()} batches, taken "
                f"in turns; the runner-up takes over when {MARGIN:.0%} faster)")
