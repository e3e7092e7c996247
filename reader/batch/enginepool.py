"""The engines of ``num_workers="auto"``'s candidates, kept alive between their turns.

While the tuner (autotune.py) tries its candidates in turns, the engine of a candidate whose
turn ended is parked here, idle, rather than closed: its next turn goes on with the same
workers and buffers (no thread or process start, no fresh buffers to fault in, which on a
fast data set cost more than the batches of a turn). Once the setting is settled, every
parked engine is closed and an engine is closed, never parked, when it is swapped out.
Every engine is closed through ``stop`` (the Loader's: the stats clock reads the CPU of
its worker processes as they go), and ``pids`` lists the parked engines' worker processes
(their CPU counts toward the epoch as the running engine's does: statsclock.py).
"""
from __future__ import annotations


def engine_key(options) -> tuple:
    """What makes two engines interchangeable: worker kind, worker count, batches in flight."""
    return options.worker_kind, int(options.num_workers), options.in_flight


class EnginePool:
    """Parked engines by ``engine_key``; ``parking`` is on while the candidates are on trial."""

    def __init__(self, make=None):
        self.idle: dict = {}
        self.parking = False
        self.make = make      # options -> a new engine (the Loader's)
        self.stop = None      # engine -> None: closes it (None: engine.close())
        self._running = None  # the key of the engine swap() last handed out
        self.fresh = False    # whether swap() last handed out a new engine (not a parked one)
        self.spare = None     # the key of a parked engine kept past the trials (the runner-up's,
        #                       until the later check: confirm.py), or None

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
