"""Exceptions the loader raises into the training loop."""
from __future__ import annotations


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
