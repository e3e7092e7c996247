"""A process for tests/remote/test_full_cache_dir.py (not a test module): run inside a
mount namespace of its own, with FOLDER a small tmpfs (a real file system that fills up).

    python full_child.py URL FOLDER stream|setup|release

stream: open the data set with cache_dir FOLDER/c and cache_limit 1.5 MB, fill the file
system up to 400 KB (another job's files), read two epochs; prints the samples of each.
setup: open the data set with cache_dir FOLDER/c on a file system with no room left;
prints the error.
release: two batches of records from shards far apart, nothing kept. Once batch 0 is
in, the file system is filled to leave batch 1's first write room for all but one block;
that write fails, and its failure reaches the planner only after the consumer released
batch 0 (the order a loaded machine found by chance). Prints the failures seen and "read"
once batch 1 is in.
"""
from __future__ import annotations

import os
import sys


def main() -> None:
    url, folder, action = sys.argv[1:4]
    from dlpack_io.reader import Loader, RandomResizedCrop
    from dlpack_io.reader.dataset import Dataset

    cache = os.path.join(folder, "c")
    if action == "setup":
        _fill(folder, 0)
        try:
            Dataset(url, cache_dir=cache)
            print("opened")
        except OSError as exc:
            print(f"{type(exc).__name__}: {exc}")
        return
    if action == "release":
        _release_while_full(Dataset, url, folder, cache)
        return
    ds = Dataset(url, cache_dir=cache, cache_limit=1_500_000)
    _fill(folder, 400_000)
    counts = []
    for _ in range(2):
        loader = Loader(ds, batch_size=8, seed=0, transforms=[RandomResizedCrop(32)])
        counts.append(sum(len(labels) for _, labels in loader))
    print(*counts)


def _release_while_full(Dataset, url: str, folder: str, cache: str) -> None:
    import threading

    import numpy as np

    from dlpack_io.reader.remote import planner as planner_mod
    from dlpack_io.reader.remote.fetchplan import PRESENT
    from dlpack_io.reader.remote.keep import CacheFull

    probe = Dataset(url, cache_dir=cache)
    n = len(probe)
    batches = [np.arange(6), np.arange(n - 6, n)]  # shards far apart: separate requests
    sizes = [int(probe._remote.lengths[b].sum()) for b in batches]
    # nothing kept: the limit is the two batches (keep.keep_budget leaves room for two)
    ds = Dataset(url, cache_dir=cache, cache_limit=2 * max(sizes), fetch_mode="records")
    failed, one_at_a_time, failures = threading.Event(), threading.Lock(), []
    real = planner_mod.publish_records

    def publish(keeper, session, k, samples, *rest):
        if samples.min() < n - 6:
            return real(keeper, session, k, samples, *rest)
        planner = prefetch._planner
        with planner.cond:  # batch 1 lands once batch 0 is in
            planner.cond.wait_for(lambda: planner.released[0] or
                                  (planner.state[batches[0]] == PRESENT).all())
        with one_at_a_time:
            if not failures:  # the first write of batch 1 finds room for all but a block
                blocks = sum(-(-int(x) // 4096) * 4096 for x in probe._remote.lengths[samples])
                _fill(folder, blocks - 4096)
            try:
                return real(keeper, session, k, samples, *rest)
            except CacheFull as exc:
                failures.append(k)
                full = exc
        failed.set()
        with planner.cond:  # the consumer frees batch 0 before the planner hears of it
            planner.cond.wait_for(lambda: planner.released[0])
        raise full

    planner_mod.publish_records = publish
    prefetch = ds.start_prefetch(batches, mode="records")
    prefetch.wait(0, timeout=120)
    if not failed.wait(timeout=120):
        raise SystemExit("batch 1's first write did not fail")
    prefetch.release(0)
    prefetch.wait(1, timeout=120)
    print(len(failures), "read")
    prefetch.close()


def _fill(folder: str, leave: int) -> None:
    """Another job's file, leaving ``leave`` bytes free."""
    st = os.statvfs(folder)
    with open(os.path.join(folder, "filler"), "wb") as f:
        f.write(b"x" * max(0, st.f_bavail * st.f_frsize - leave))


if __name__ == "__main__":
    main()
