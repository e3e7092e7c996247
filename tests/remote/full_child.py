"""A process for tests/remote/test_full_cache_dir.py (not a test module): run inside a
mount namespace of its own, with FOLDER a small tmpfs (a real file system that fills up).

    python full_child.py URL FOLDER stream|setup

stream: open the data set with cache_dir FOLDER/c and cache_limit 1.5 MB, fill the file
system up to 400 KB (another job's files), read two epochs; prints the samples of each.
setup: open the data set with cache_dir FOLDER/c on a file system with no room left;
prints the error.
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
    ds = Dataset(url, cache_dir=cache, cache_limit=1_500_000)
    _fill(folder, 400_000)
    counts = []
    for _ in range(2):
        loader = Loader(ds, batch_size=8, seed=0, transforms=[RandomResizedCrop(32)])
        counts.append(sum(len(labels) for _, labels in loader))
    print(*counts)


def _fill(folder: str, leave: int) -> None:
    """Another job's file, leaving ``leave`` bytes free."""
    st = os.statvfs(folder)
    with open(os.path.join(folder, "filler"), "wb") as f:
        f.write(b"x" * max(0, st.f_bavail * st.f_frsize - leave))


if __name__ == "__main__":
    main()
