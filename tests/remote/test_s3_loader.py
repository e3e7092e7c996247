"""Loader over s3:// yields exactly the batches it yields over the same data set on disk."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dlpack_io.reader import Loader, Output, RandomHorizontalFlip, RandomResizedCrop, Workers
from dlpack_io.reader.dataset import Dataset
from dlpack_io.tools.synth import make_image_folder

from helpers import upload_folder

URL = "s3://dlpack-test/loader/base"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    from dlpack_io.packer import convert

    root = tmp_path_factory.mktemp("s3loader")
    make_image_folder(root / "src", 40, 3, seed=11, size=(48, 64))
    convert(root / "src", root / "local", shard_size="30KB", workers=1, progress=False)
    upload_folder(root / "local", URL, s3_server.env())
    return str(root / "local")


def _epoch(ds, **kw):
    loader = Loader(ds, batch_size=8, seed=3, transforms=[RandomResizedCrop(24),
                                                          RandomHorizontalFlip()],
                    output=Output(return_index=True), **kw)
    loader.set_epoch(1)
    out = [(idx.copy(), images.clone(), labels.clone()) for images, labels, idx in loader]
    loader.close()
    return out


@pytest.mark.parametrize("kind,num_workers", [("thread", 0), ("thread", 2), ("process", 2)])
@pytest.mark.parametrize("rank,world_size", [(0, 1), (1, 2)])
def test_loader_over_s3_equals_local(s3_env, packed, kind, num_workers, rank, world_size):
    local = Dataset(packed)
    remote = Dataset(URL, cache_limit=200_000)  # a fraction of the data set
    kw = dict(num_workers=num_workers, workers=Workers(kind=kind), rank=rank, world_size=world_size)
    a, b = _epoch(local, **kw), _epoch(remote, **kw)
    assert len(a) == len(b) == (5 if world_size == 1 else 3)
    for (ia, xa, la), (ib, xb, lb) in zip(a, b):
        assert np.array_equal(ia, ib) and torch.equal(la, lb) and torch.equal(xa, xb)
    session = remote._remote.session.dir  # the prefetch was closed with the epoch
    assert [f for _, _, fs in os.walk(session) for f in fs if f != ".lock"] == []


def test_loader_with_a_cache_limit_of_one_batch_does_not_deadlock(s3_env, packed, caplog):
    local, remote = Dataset(packed), Dataset(URL)
    need = max(int(remote._remote.lengths[b].sum()) for b in np.array_split(np.arange(40), 5))
    remote = Dataset(URL, cache_limit=need + 3000)   # about one batch; 4 batches in flight
    kw = dict(num_workers=2, workers=Workers(kind="process", prefetch=4))
    with caplog.at_level("WARNING"):
        a, b = _epoch(local, **kw), _epoch(remote, **kw)
    assert all(np.array_equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert "smaller than the" in caplog.text and "holding them anyway" in caplog.text
