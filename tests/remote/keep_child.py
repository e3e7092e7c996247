"""A training process for tests/remote/test_s3_keep.py (not a test module).

    python keep_child.py URL CACHE_DIR RANK WORLD_SIZE [MY_START_FILE OTHER_START_FILE]

Runs epoch 0 of a Loader over URL with CACHE_DIR and prints one JSON line: the bytes this
process fetched and a digest of the batches. With start files, it creates its own and waits
for the other's before reading (so two ranks really run at the same time).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dlpack_io.reader import Output


def main() -> None:
    url, cache_dir, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    from dlpack_io.reader import Loader, RandomResizedCrop
    from dlpack_io.reader.dataset import Dataset

    ds = Dataset(url, cache_dir=cache_dir)
    if len(sys.argv) > 6:
        open(sys.argv[5], "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(sys.argv[6]):  # the other rank's event: a file appears
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sys.argv[6]} never appeared")
            time.sleep(0.01)
    loader = Loader(ds, batch_size=8, seed=3, rank=rank, world_size=world, num_workers=2,
                    transforms=[RandomResizedCrop(24)], output=Output(return_index=True))
    digest = hashlib.sha256()
    for images, labels, idx in loader:
        digest.update(images.numpy().tobytes() + labels.numpy().tobytes() + idx.tobytes())
    loader.close()
    print(json.dumps({"fetched": ds._remote.bytes_fetched, "digest": digest.hexdigest(),
                      "assembled": ds._remote.whole.assembled}))


if __name__ == "__main__":
    main()
