"""Loader over s3:// yields exactly the batches it yields over the same data set on disk."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dlpack_io.reader import Loader, RandomResizedCrop
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.storage import Store
from dlpack_io.tools.synth import make_image_folder

URL = "s3://dlpack-test/loader/base"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    from dlpack_io.packer import convert

    root = tmp_path_factory.mktemp("s3loader")
    make_image_folder(root / "src", 40, 3, seed=11, size=(48, 64))
    convert(root / "src", root / "local", shard_size="30KB", workers=1, progress=False)
    saved = dict(os.environ)
    os.environ.update(s3_server.env())
    try:
        store = Store(URL)
        for name in sorted(os.listdir(root / "local")):
            store.put_file(name, root / "local" / name)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return str(root / "local")


def _epoch(ds, **kw):
    loader = Loader(ds, batch_size=8, seed=3, crop=RandomResizedCrop(24), flip_h=0.5,
                    return_index=True, **kw)
    loader.set_epoch(1)
    return [(idx.copy(), images.clone(), labels.clone()) for images, labels, idx in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("rank", [0, 1])
def test_loader_over_s3_equals_local(s3_env, packed, num_workers, rank):
    local, remote = Dataset(packed), Dataset(URL)
    kw = dict(num_workers=num_workers, worker_kind="thread", rank=rank, world_size=2)
    a, b = _epoch(local, **kw), _epoch(remote, **kw)
    assert len(a) == len(b) == 2
    for (ia, xa, la), (ib, xb, lb) in zip(a, b):
        assert np.array_equal(ia, ib) and torch.equal(la, lb) and torch.equal(xa, xb)
