"""A process for tests/remote/test_s3_growing_untrusted.py (not a test module).

    python grow_child.py URL CACHE_DIR cut|kill|cutshard

cut: join shard 0's growing file, cut it to one page while it is mapped, then read a record
another process wrote; prints what happened (never dies of SIGBUS).
kill: start epoch 0 and die by SIGKILL in the middle of the first write of a record.
cutshard: map assembled shard 0 (written by another process: checked first) and cut it to one page while its
records are being checked; prints what ``view`` returned.
"""
from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    url, cache_dir, action = sys.argv[1:4]
    from dlpack_io.reader.dataset import Dataset
    from dlpack_io.reader.remote import cache

    ds = Dataset(url, cache_dir=cache_dir, fetch_mode="records")
    grow = ds._remote.growing
    if action == "cut":
        assert grow.start(0, 1 << 40)
        os.truncate(grow.path(0), 4096)
        try:
            grow.record(0, 1)
            print("served")
        except Exception as exc:  # noqa: BLE001 - the test reads what it was
            print(f"{type(exc).__name__}: {exc}")
        return
    if action == "cutshard":
        from dlpack_io.reader.remote import assembled

        check = assembled._intact

        def cut_then_check(*args):
            os.truncate(ds._remote.whole.path(0), 4096)
            return check(*args)
        assembled._intact = cut_then_check
        print("mapped" if ds._remote.whole.view(0) is not None else "discarded")
        return
    real, head = cache.pwrite_all, ds.shards[0].header

    def half_then_die(fd, data, at):
        if head.data_offset <= at < head.index_offset:  # records, not header or index
            real(fd, memoryview(data)[:len(data) // 2], at)
            os.kill(os.getpid(), signal.SIGKILL)
        real(fd, data, at)
    cache.pwrite_all = half_then_die
    prefetch = ds.start_prefetch([[0, 1, 2]], mode="records")
    prefetch.wait(0)


if __name__ == "__main__":
    main()
