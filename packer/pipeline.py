"""Encode inputs in worker processes and hand results back in input order.

Results come back in the order of the inputs whatever the number of workers, which is
what makes the packed bytes independent of ``--workers``. At most ``max_in_flight``
chunks are outstanding, so a slow writer never lets encoded pixels pile up in memory.
A worker that dies (OOM killer, segfault in a decoder) surfaces as ConversionError
instead of a hang: that is why this uses ProcessPoolExecutor and not multiprocessing.Pool.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from dlpack_io.packer.encode import encode_path


class ConversionError(Exception):
    """A conversion cannot go on; the message names the file and the fix."""


def _encode_chunk(items: list, options: dict) -> list:
    return [encode_path(item, options, ship_passthrough=False) for item in items]


def _worker_init(parent_pid: int) -> None:
    """Make a worker die with the packer: after ``kill -9`` no orphan keeps running.

    Ctrl-C is left to the parent, which shuts the pool down and removes its partial shard.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux only)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _context():
    # fork starts workers in milliseconds; elsewhere fall back to the platform default.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


def encode_in_order(items, options: dict, workers: int, *, chunk: int = 8,
                    max_in_flight: int | None = None):
    """Yield ``(status, value)`` from encode_path for each (path, size, mtime) item, in order.

    ``workers`` processes encode chunks of ``chunk`` files; ``workers == 0`` encodes in
    this process (used by tests and tiny jobs).
    """
    if workers == 0:
        for item in items:
            yield encode_path(item, options)
        return
    max_in_flight = max_in_flight or 4 * workers
    starts = iter(range(0, len(items), chunk))
    pending: deque = deque()
    with ProcessPoolExecutor(max_workers=workers, mp_context=_context(),
                             initializer=_worker_init, initargs=(os.getpid(),)) as pool:
        start = 0
        try:
            while True:
                while len(pending) < max_in_flight:
                    nxt = next(starts, None)
                    if nxt is None:
                        break
                    pending.append((nxt, pool.submit(_encode_chunk, items[nxt:nxt + chunk], options)))
                if not pending:
                    return
                start, future = pending.popleft()
                yield from future.result()
        except BrokenProcessPool:
            raise ConversionError(
                f"a worker process died while encoding {items[start][0]} .. "
                f"{items[min(start + chunk, len(items)) - 1][0]} (killed, out of memory, "
                f"or a crash in the image decoder); completed shards are kept, run "
                f"again with --resume") from None
        finally:
            for _, future in pending:
                future.cancel()
