"""A Mixture's prefetch waits for all its remote sets within ONE deadline: a set that took
most of the time leaves the next only what is left, never a fresh full timeout."""
from __future__ import annotations

import time

import pytest

from dlpack_io.reader.mixture import MixturePrefetch


class _SlowSet:
    """A set's prefetch handle (Prefetch's wait protocol) whose batch takes ``spend``
    seconds to arrive, and that records the timeout it was given. A stand-in: a real
    remote set cannot be made to finish at a chosen moment."""

    def __init__(self, spend: float):
        self.spend, self.given = spend, []

    def wait(self, k: int, timeout) -> None:
        self.given.append(timeout)
        if timeout is not None and timeout < self.spend:
            raise TimeoutError(f"batch {k}: {timeout:.3f} s given, {self.spend} needed")
        end = time.monotonic() + self.spend
        while time.monotonic() < end:  # the batch arriving: time really passes
            pass


def test_the_timeout_is_one_deadline_shared_by_every_set():
    first, second = _SlowSet(0.3), _SlowSet(0.3)
    with pytest.raises(TimeoutError, match="needed"):
        MixturePrefetch([first, second]).wait(4, timeout=0.5)
    assert 0.5 - 0.3 < first.given[0] <= 0.5
    assert 0 <= second.given[0] <= 0.5 - 0.3  # what the first set left, not 0.5 again


def test_sets_ready_within_the_deadline_pass_and_none_keeps_each_stores_own():
    sets = [_SlowSet(0.0), _SlowSet(0.0), _SlowSet(0.0)]
    MixturePrefetch(sets).wait(0, timeout=5.0)
    assert all(0 < s.given[0] <= 5.0 for s in sets)
    MixturePrefetch(sets).wait(1)
    assert [s.given[1] for s in sets] == [None, None, None]
