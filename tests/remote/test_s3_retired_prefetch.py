"""An s3:// data set with retired records (reader/format/schema.py): a records-mode
prefetch of every sample fetches the live records, not the retired one, and the samples
it serves are the local data set's."""
from __future__ import annotations

import os
import shutil

import numpy as np

from dlpack_io.packer import convert
from dlpack_io.reader import Dataset
from dlpack_io.tools.synth import make_image_folder

OPTS = dict(shard_size="16KB", workers=1, progress=False, mode="raw", size=16)


def test_a_records_prefetch_skips_the_retired_record(s3_env, tmp_path):
    src, url = tmp_path / "src", "s3://dlpack-test/retired-prefetch/ds"
    make_image_folder(src, 16, 2, seed=4, size=(24, 32))
    convert(src, url, **OPTS)
    make_image_folder(tmp_path / "other", 1, 1, seed=9, size=(24, 32))
    (other,) = os.listdir(tmp_path / "other" / "class_00")
    name = sorted(os.listdir(src / "class_00"))[3]
    shutil.copy(tmp_path / "other" / "class_00" / other, src / "class_00" / name)
    convert(src, url, append=True, replace_changed=True, **OPTS)
    convert(src, tmp_path / "here", **OPTS)  # the same inputs packed in one go
    remote, here = Dataset(url, cache_dir=tmp_path / "cache"), Dataset(tmp_path / "here")
    try:
        ((old, new),) = remote.manifest["retired"]
        live = np.delete(np.arange(remote.manifest["num_samples"]), old)
        lengths = np.concatenate([s.index["length"] for s in remote.shards]).astype(np.int64)
        prefetch = remote.start_prefetch([np.arange(len(remote))], mode="records")
        prefetch.wait(0, timeout=60)
        fetched = prefetch.stats["bytes_fetched"]
        assert int(lengths[live].sum()) <= fetched < int(lengths.sum())
        got = sorted(remote[i][0].tobytes() for i in range(len(remote)))
        assert got == sorted(here[i][0].tobytes() for i in range(len(here)))
        prefetch.close()
    finally:
        remote.close()
