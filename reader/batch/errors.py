"""What goes wrong with samples and workers: the exceptions the loader raises into the
training loop, and with ``on_error="skip"`` the account of the samples it left out.

A sample whose record cannot be read, decoded or transformed raises :class:`SampleError`
naming its shard file and record, or with ``on_error="skip"`` is dropped from its batch (the
batch comes out shorter; nothing is substituted, so no sample is ever seen twice). Workers
collect :class:`Skipped` entries per batch; the consumer adds them to the loader's
:class:`SkipAccount` (``loader.skipped``), which is reset at the start of every epoch and
logged once per epoch at WARNING. What is skipped is a pure function of the data, so the same
data skip the same samples whatever the worker count or kind.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

log = logging.getLogger(__name__)
ON_ERROR = ("raise", "skip")


class LoaderError(RuntimeError):
    """Base class of the loader's own errors."""


class SampleError(LoaderError):
    """A sample could not be loaded or transformed.

    ``where`` names the shard file and record (see ``Dataset.where``); the original
    exception is chained as ``__cause__`` (for process workers, its traceback text is in
    the message).
    """

    def __init__(self, message: str, where: str = "", sample: int | None = None):
        super().__init__(message)
        self.where = where
        self.sample = sample

    def __reduce__(self):
        return (type(self), (self.args[0], self.where, self.sample))


class WorkerError(LoaderError):
    """A worker died (killed, crashed, out of memory) or stopped answering."""


class LoaderTimeout(WorkerError):
    """A batch was not built within the Loader's ``timeout`` (a worker is stuck)."""


def check_on_error(value: str) -> str:
    """Validate the ``on_error`` option."""
    if value not in ON_ERROR:
        raise ValueError(f"on_error={value!r}: expected 'raise' (stop at the first bad sample) "
                         f"or 'skip' (leave bad samples out and count them)")
    return value


class Skipped(NamedTuple):
    """One sample left out: its global index, its shard file and record, and why."""

    sample: int
    where: str
    reason: str


def skipped_from(error) -> Skipped:
    """A ``Skipped`` entry from the SampleError a failing sample would have raised."""
    cause = error.__cause__ if error.__cause__ is not None else error
    return Skipped(int(error.sample), error.where, f"{type(cause).__name__}: {cause}")


class SkipAccount:
    """What ``on_error="skip"`` left out: ``samples`` of the current epoch, ``total`` overall.

    ``len(account)`` and iteration cover the current epoch's ``Skipped`` entries, in the
    order their batches were delivered. ``reset()`` clears everything.
    """

    def __init__(self):
        self.epoch = None
        self.samples: list[Skipped] = []
        self.total = 0

    def start_epoch(self, epoch: int) -> None:
        """Forget the previous epoch's entries (``total`` keeps counting)."""
        self.epoch, self.samples = int(epoch), []

    def add(self, entries) -> None:
        """Record the entries of one delivered batch."""
        self.samples.extend(entries)
        self.total += len(entries)

    def report(self) -> None:
        """Log the epoch's skips once, at WARNING (nothing when there were none)."""
        if self.samples:
            first = self.samples[0]
            log.warning("epoch %s: skipped %d unreadable sample(s) (on_error='skip'); first: %s: "
                        "%s; loader.skipped lists them all; `dlpack verify` checks the data set",
                        self.epoch, len(self.samples), first.where, first.reason)

    def reset(self) -> None:
        """Clear the epoch's entries and the total."""
        self.epoch, self.samples, self.total = None, [], 0

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self):
        return iter(self.samples)

    def __repr__(self) -> str:
        return f"SkipAccount(epoch={self.epoch}, skipped={len(self.samples)}, total={self.total})"
