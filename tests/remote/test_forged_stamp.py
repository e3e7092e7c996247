"""Nothing on disk vouches for a cached file: a same-user job can read every number a stamp
holds (inode, size, mtime, ctime) and write a stamp that matches a file it swapped in. An
assembled shard this process did not write or verify has every record's CRC checked before
its bytes are used, so a swapped shard with a matching forged stamp is discarded and its
records fetched again (real SeaweedFS)."""
from __future__ import annotations

import os

from dlpack_io.reader import Loader, RandomResizedCrop
from dlpack_io.reader.dataset import Dataset

from helpers import pack_and_upload

URL = "s3://dlpack-test/forged/base"


def _read_epoch(ds):
    loader = Loader(ds, batch_size=8, seed=3, transforms=[RandomResizedCrop(24)])
    for _ in loader:
        pass
    loader.close()


def test_a_swapped_shard_with_a_forged_stamp_is_verified_and_discarded(s3_env, tmp_path,
                                                                       caplog):
    local = Dataset(pack_and_upload(tmp_path / "set", URL, s3_env.env(), count=24, classes=2,
                                    seed=5, size=(48, 64)))
    cache = tmp_path / "shared-cache"
    first = Dataset(URL, cache_dir=cache)
    _read_epoch(first)                              # every shard kept and assembled
    path = first._remote.whole.path(1)
    assert first._remote.whole.view(1) is not None
    entry = first.shards[1].index[2]
    at, n = int(entry["offset"]), int(entry["length"])
    swapped = bytearray(open(path, "rb").read())   # another job's pixels, same size
    swapped[at:at + n] = bytes(n)
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(swapped)
    st = os.stat(path)                             # what a forger can read, and write down
    with open(path + ".ok", "w") as f:
        f.write(f"{st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}")
    later = Dataset(URL, cache_dir=cache)          # another run sharing the cache_dir
    with caplog.at_level("WARNING"):
        assert later._remote.whole.view(1) is None
    assert "record 2 fails its checksum" in caplog.text
    assert bytes(later.shards[1].payload(2)) == bytes(local.shards[1].payload(2))
