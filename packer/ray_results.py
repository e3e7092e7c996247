"""How the Ray engine's driver waits on its tasks: a task's result, or ConversionError
naming the work and the fix; and, when a conversion stops, waiting for the tasks it no
longer needs instead of cancelling them.

Shared by the encode phase (ray_engine.py) and the shard assembly (ray_planner.py), which
submit their tasks with the same retry policy, ``MAX_RETRIES``.
"""
from __future__ import annotations

import logging

from dlpack_io.packer.pipeline import ConversionError

log = logging.getLogger(__name__)

MAX_RETRIES = 3       # attempts after a worker or node dies mid-task (Ray re-runs it)
SETTLE_SECONDS = 300  # the longest a stopped conversion waits for its submitted tasks


def settle_tasks(ray, refs: list, what: str) -> None:
    """Wait for tasks the conversion no longer needs instead of cancelling them.

    ``ray.cancel`` racing with a task that is just finishing aborts the driver inside Ray
    (RAY_CHECK "Tried to complete task that was not pending", ray-project/ray#54846): the
    load series of 2026-11-24 saw it once, in an ``--on-error fail`` conversion. The wait is
    short, a few tasks' time: at most 2 encode segments per CPU and one shard write per CPU
    are ever in flight. A second Ctrl-C leaves at once; a private cluster's shutdown then
    stops them."""
    if not refs:
        return
    log.info("stopping: waiting for %d %s already submitted to finish", len(refs), what)
    _, running = ray.wait(refs, num_returns=len(refs), timeout=SETTLE_SECONDS,
                          fetch_local=False)
    if running:
        log.warning("%d %s still running after %d s: left to the cluster", len(running),
                    what, SETTLE_SECONDS)


def task_result(ray, ref, doing: str):
    """``ray.get(ref)`` with Ray's failures turned into ConversionError naming the work."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # the task raised: OSError, MemoryError...
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        fix = "fix the cause (free disk space?) and " if isinstance(cause, OSError) else ""
        raise ConversionError(f"{doing} ({type(cause).__name__}: {cause}); completed shards "
                              f"are kept: {fix}run again with --resume") from None
    except ray.exceptions.RayError as exc:  # a worker or node died, again after the retries
        first_line = str(exc).strip().split("\n", 1)[0][:200]
        raise ConversionError(f"{doing}: Ray gave up after {MAX_RETRIES} retries "
                              f"({type(exc).__name__}: {first_line}); a worker or node was "
                              f"killed, ran out of memory or crashed in the image decoder; "
                              f"completed shards are kept, run again with --resume") from None
