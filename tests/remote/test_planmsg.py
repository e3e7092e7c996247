"""The planner's error raised again in the waiting thread (reader/remote/prefetch.py): the
same class, attributes and words, so a user's ``except ShardChangedError`` still works."""
from __future__ import annotations

import errno
import pickle

import pytest

from dlpack_io.reader.remote.prefetch import rewrap
from dlpack_io.reader.remote.storage import BodyOverrun, BucketNotFoundError
from dlpack_io.reader.shard import ShardChangedError


def test_a_shard_changed_error_stays_one():
    exc = ShardChangedError("/c/records/0.grow", "4096 bytes, the shard has 9000")
    new = rewrap(exc, 3)
    assert type(new) is ShardChangedError and new.__cause__ is exc
    assert (new.path, new.change) == (exc.path, exc.change)
    assert str(new) == f"{exc} (while prefetching batch 3 and earlier)"
    assert type(pickle.loads(pickle.dumps(new))) is ShardChangedError  # process workers


def test_an_os_error_keeps_its_errno_and_words():
    exc = OSError(errno.ENOSPC, "No space left on device: writing records/0.grow")
    new = rewrap(exc, 0)
    assert type(new) is OSError and new.errno == errno.ENOSPC
    assert str(new) == ("[Errno 28] No space left on device: writing records/0.grow "
                        "(while prefetching batch 0 and earlier)")


class _TwoArgs(Exception):
    """An error whose constructor's arguments are not its message."""

    def __init__(self, url, why, *, extra=None):
        super().__init__(f"{url}: {why}")
        self.url, self.extra = url, extra


@pytest.mark.parametrize("exc", [BodyOverrun(10, 20), _TwoArgs("s3://b/p", "bad", extra=1),
                                 BucketNotFoundError("LIST s3://b/p/ bucket does not exist"),
                                 KeyError("k"), RuntimeError("x")])
def test_every_class_is_kept(exc):
    new = rewrap(exc, 5)
    assert type(new) is type(exc)
    assert "(while prefetching batch 5 and earlier)" in str(new)
    assert vars(new) == vars(exc)


def test_a_cancelled_task_is_not_raised_as_such_in_the_waiting_thread():
    """CancelledError and KeyboardInterrupt are not Exceptions: re-raised in a consumer they
    would escape its ``except Exception``; they stay a RuntimeError saying what happened."""
    import asyncio

    for exc in (asyncio.CancelledError(), KeyboardInterrupt()):
        new = rewrap(exc, 2)
        assert type(new) is RuntimeError and str(new).startswith("prefetch failed before batch 2")
