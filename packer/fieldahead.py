"""Field blocks made ahead, in threads, while the workers encode the images.

The field block of an input (sidecars read, boxes checked, a mask PNG decoded and
compressed: packer/targets.py) is made in the packer's parent process. Made one by one
in the loop that writes the shards, it capped a conversion with masks at about half the
images/s of one without (benchmarks/convert_targets.py); PIL's decoders and zlib release
the GIL, so a few threads working ahead of the writer take that cost off its path. The
results come back in input order, at most ``depth`` ahead, so memory stays bounded.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor

from dlpack_io.packer.records import RejectedInput


def field_result(source, i: int) -> tuple:
    """("ok", field block) of input ``i``, or ("reject", why): whatever goes wrong with one
    input's fields rejects that input, never ends the run."""
    try:
        return "ok", source.block(i)
    except RejectedInput as exc:
        return "reject", str(exc)
    except Exception as exc:  # noqa: BLE001  (MemoryError, RecursionError, a decoder's bug)
        return "reject", f"its fields could not be made: {type(exc).__name__}: {str(exc)[:300]}"


def fields_ahead(source, todo, threads: int, depth: int = 64):
    """Yield ``field_result(source, i)`` for each ``i`` of ``todo``, in that order, made
    by ``threads`` threads at most ``depth`` inputs ahead (0 threads: made here, in turn)."""
    if threads < 1:
        for i in todo:
            yield field_result(source, int(i))
        return
    todo = iter(todo)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dlpack-fields") as pool:
        pending: deque = deque()
        try:
            for i in todo:
                pending.append(pool.submit(field_result, source, int(i)))
                if len(pending) >= depth:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
