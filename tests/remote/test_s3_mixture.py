"""A Mixture of a local and an s3:// set yields exactly the batches of the same mixture read
from local disk, with every worker kind, and its prefetch ends with the epoch."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from dlpack_io.reader import Dataset, Loader, Mixture, Output, RandomResizedCrop, Workers
from dlpack_io.packer import Writer

from helpers import upload_folder

URL = "s3://dlpack-test/mixture/b"


def _pack(dst, n, base):
    with Writer(dst, mode="raw", shard_size="1KB") as w:
        for i in range(n):
            w.write(image=np.full((8, 8, 3), base + i, np.uint8), label=i % 2)
    return str(dst)


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    root = tmp_path_factory.mktemp("s3mixture")
    a, b = _pack(root / "a", 20, 0), _pack(root / "b", 9, 100)
    upload_folder(b, URL, s3_server.env())
    return a, b


def _epoch(mix, **kw):
    loader = Loader(mix, batch_size=6, seed=2, transforms=[RandomResizedCrop(6)],
                    output=Output(return_index=True), **kw)
    loader.set_epoch(1)
    out = [(i.copy(), x.clone(), y.clone()) for x, y, i in loader]
    loader.close()
    return out


@pytest.mark.parametrize("kind,num_workers", [("thread", 0), ("thread", 2), ("process", 2)])
def test_local_and_s3_sets_mix_as_on_disk(s3_env, packed, kind, num_workers):
    a, b = packed
    remote = Dataset(URL, cache_limit=4000)   # less than the remote set (9 x 192 bytes + ...)
    on_disk = Mixture([Dataset(a), Dataset(b)], weights=[0.6, 0.4], samples_per_epoch=35)
    mixed = Mixture([Dataset(a), remote], weights=[0.6, 0.4], samples_per_epoch=35)
    assert mixed.is_remote and mixed.counts == (21, 14)   # set 1 repeated: 14 of 9
    kw = dict(num_workers=num_workers, workers=Workers(kind=kind))
    want, got = _epoch(on_disk, **kw), _epoch(mixed, **kw)
    assert len(want) == len(got) == 6
    for (ia, xa, la), (ib, xb, lb) in zip(want, got):
        assert np.array_equal(ia, ib) and torch.equal(xa, xb) and torch.equal(la, lb)
    assert sum(int((i[:, 0] == 1).sum()) for i, _, _ in got) == 14
    session = remote._remote.session.dir  # the prefetch was closed with the epoch
    assert [f for _, _, fs in os.walk(session) for f in fs if f != ".lock"] == []


def test_batches_without_a_sample_of_the_s3_set(s3_env, packed):
    """A small share leaves most batches with nothing of the remote set: its prefetch gets
    empty batches there and the epoch still reads every batch."""
    a, b = packed
    on_disk = Mixture([Dataset(a), Dataset(b)], weights=[0.95, 0.05], samples_per_epoch=60)
    mixed = Mixture([Dataset(a), Dataset(URL)], weights=[0.95, 0.05], samples_per_epoch=60)
    want, got = _epoch(on_disk, num_workers=2), _epoch(mixed, num_workers=2)
    assert sum(1 for i, _, _ in got if not (i[:, 0] == 1).any()) >= 6   # empty for set 1
    for (ia, xa, _), (ib, xb, _) in zip(want, got):
        assert np.array_equal(ia, ib) and torch.equal(xa, xb)
    assert sum(int((i[:, 0] == 1).sum()) for i, _, _ in got) == 3
