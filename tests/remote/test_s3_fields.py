"""Fields of a data set in object storage (format 3) against a real SeaweedFS server: a
record's field block comes in the same range requests as its image, checked by the same
per-record checksums, so ds.sample(i) and Loader(fields=...) give what the local copy gives."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

from dlpack_io.packer import Writer
from dlpack_io.reader import Loader, Output, Resize, Workers
from dlpack_io.reader import format as fmt
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.remote.storage import Store

from helpers import upload_folder

URL = "s3://dlpack-test/fields/base"
N = 30
NAMES = ("image", "caption", "meta", "n", "x", "emb", "pts", "label")


@pytest.fixture(scope="module")
def fielded(tmp_path_factory, s3_server):
    """A Writer data set with str, json, int, float, fixed and ragged array fields in
    several shards, on disk and uploaded to URL."""
    dst = tmp_path_factory.mktemp("s3fields") / "ds"
    with Writer(dst, shard_size="3KB") as w:
        for i in range(N):
            # the image's first pixel is its sample number: fields must travel with it
            w.write(image=np.full((5 + i % 4, 6, 3), i, np.uint8), label=i % 3,
                    caption=f"caption {i} " + "é" * (i % 5), meta={"i": i, "tags": ["a"] * (i % 3)},
                    n=-7 * i, x=i / 4, emb=np.arange(4, dtype=np.float32) + i,
                    pts=np.full((i % 3, 2), i, np.int16))
    upload_folder(dst, URL, s3_server.env())
    return str(dst)


def _same_sample(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name, value in a.items():
        if isinstance(value, np.ndarray):
            assert value.dtype == b[name].dtype and np.array_equal(value, b[name]), name
        else:
            assert type(value) is type(b[name]) and value == b[name], name


def _spy(monkeypatch) -> list:
    """The ranges every synchronous Store.get_range asks for (on-demand fetches: those
    outside the planner's count), the manifest's aside; the real call is made."""
    calls, real = [], Store.get_range

    def counted(self, name, *args, **kw):
        if name != fmt.MANIFEST_NAME:
            calls.append((name, *args))
        return real(self, name, *args, **kw)
    monkeypatch.setattr(Store, "get_range", counted)
    return calls


def test_remote_samples_equal_local_ones_with_every_field(s3_env, fielded, monkeypatch):
    local, remote = Dataset(fielded), Dataset(URL)
    assert remote.fields == local.fields and len(remote.shards) >= 3
    calls = _spy(monkeypatch)
    for i in range(N):  # on demand: image and fields from one request
        _same_sample(local.sample(i), remote.sample(i))
        assert len(calls) == i + 1
    assert remote.sample(7)["caption"] == "caption 7 éé"


def _epoch(ds, names, **kw):
    loader = Loader(ds, batch_size=4, seed=5, fields=names, output=Output(return_index=True),
                    transforms=[Resize((4, 4))], **kw)
    out = []
    for batch in loader:
        out.append(batch)
        if ds.is_remote:  # every request of the epoch is made once the last batch is due
            stats = ds._remote.active_prefetch().stats
    loader.close()
    return out, (stats if ds.is_remote else None)


def _same_batch(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y)
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y)
        else:  # lists: str, json values, or ragged arrays as tensors
            assert len(x) == len(y)
            for u, v in zip(x, y):
                assert torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v


@pytest.mark.parametrize("kind,workers", [("thread", 0), ("thread", 2), ("process", 2)])
def test_loader_fields_over_s3_equal_local_and_add_no_requests(s3_env, fielded, kind, workers,
                                                               monkeypatch, tmp_path):
    calls = _spy(monkeypatch)
    kw = dict(num_workers=workers, workers=Workers(kind=kind))
    local, _ = _epoch(Dataset(fielded), NAMES, **kw)
    remote, stats = _epoch(Dataset(URL, cache_limit=6_000, cache_dir=tmp_path / "a"), NAMES,
                           **kw)  # both runs cold: what the first keeps is not the second's
    assert len(local) == len(remote) == 8
    for a, b in zip(local, remote):
        _same_batch(a, b)
        out = dict(zip(NAMES + ("index",), b))
        assert out["image"][:, 0, 0, 0].tolist() == out["index"].tolist()
        assert out["caption"][0].startswith(f"caption {int(out['index'][0])} ")
    plain, plain_stats = _epoch(Dataset(URL, cache_limit=6_000, cache_dir=tmp_path / "b"),
                                ("image", "label"), **kw)
    assert stats["requests"] == plain_stats["requests"] > 0
    assert calls == []  # nothing fetched on demand: fields came with the planned requests
    assert [torch.equal(p[0], r[0]) for p, r in zip(plain, remote)] == [True] * 8


def test_a_record_span_is_its_image_and_field_block_in_one_range():
    from dlpack_io.reader.remote.fetchplan import extents, mismatch, range_requests

    entries = np.zeros(3, dtype=fmt.FIELDS_INDEX_DTYPE)
    entries["offset"], entries["length"] = [4096, 4224, 9000], [100, 60, 10]
    entries["fields_length"] = [20, 2**32 - 1, 0]  # summed in 64 bits: no wrap
    assert extents(entries).tolist() == [120, 2**32 + 59, 10]
    entries["fields_length"][1] = 30
    lookup = (np.zeros(3, np.int64), np.arange(3), entries)
    got = [r[2:4] for r in range_requests(np.arange(3), np.arange(3), lookup, gap=8,
                                          max_bytes=2**20)]
    assert got == [(4096, 4314), (9000, 9010)]  # 4096+120 is 8 short of 4224: one request
    image, block = b"x" * 10, b"yz"
    entry = np.zeros(1, dtype=fmt.FIELDS_INDEX_DTYPE)[0]
    entry["length"], entry["crc"] = 10, fmt.crc32(image)
    entry["fields_length"], entry["fields_crc"] = 2, fmt.crc32(block)
    assert mismatch(image + block, entry) is None
    assert mismatch(image + b"yZ", entry) == "field block"
    assert mismatch(b"X" + image[1:] + block, entry) == "image"
    assert mismatch(image + block[:1], entry) == "span"


def _tampered(fielded: str, tmp_path, url: str) -> tuple[int, str]:
    """Upload a copy of ``fielded`` whose record 1 of shard 0 has one field byte flipped
    (header, index and metadata stay valid); returns (that sample, the shard's name)."""
    copy = tmp_path / "tampered"
    shutil.copytree(fielded, copy)
    ds = Dataset(str(copy))
    shard = ds.shards[0]
    entry, (flen, _) = shard.index[1], shard.fields_entry(1)
    assert flen > 8
    with open(shard.path, "r+b") as f:
        at = int(entry["offset"]) + int(entry["length"]) + flen - 1  # the last field byte
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x20]))
    store = Store(url)
    for name in os.listdir(copy):
        store.put_file(name, os.path.join(copy, name))
    return 1, os.path.basename(shard.path)


@pytest.mark.parametrize("mode", ["records", "shards"])
def test_a_tampered_field_byte_on_the_server_is_caught(s3_env, fielded, tmp_path, mode):
    url = f"s3://dlpack-test/fields/tampered-{mode}"
    sample, name = _tampered(fielded, tmp_path, url)
    remote = Dataset(url, cache_dir=tmp_path / "cache")
    assert remote.sample(0)["n"] == 0  # the records around it are fine
    with pytest.raises(fmt.FormatError, match=rf"{name} record 1 .*field block checksum mismatch"):
        remote.sample(sample)
    prefetch = remote.start_prefetch([np.array([sample, 0])], mode=mode)
    if mode == "records":  # the planner checks the whole span before it is cached
        with pytest.raises(fmt.FormatError, match=rf"{name} record 1 .*field block checksum"):
            prefetch.wait(0, timeout=60)
    else:  # a whole shard is checked at download; the field block when it is read
        prefetch.wait(0, timeout=60)
        with pytest.raises(fmt.FormatError, match=rf"{name} record 1 .*field block checksum"):
            remote.sample(sample)
    prefetch.close()
    loader = Loader(remote, batch_size=N, shuffle=False, fields=("image", "caption"),
                    transforms=[Resize((4, 4))], num_workers=0)
    with pytest.raises(fmt.FormatError, match=rf"{name} record 1 .*checksum"):
        next(iter(loader))


def test_kept_records_bring_their_fields_to_the_next_epoch(s3_env, fielded):
    remote = Dataset(URL)  # the default cache_limit keeps the whole (small) data set
    local = Dataset(fielded)
    first, _ = _epoch(remote, NAMES)
    fetched = remote._remote.bytes_fetched
    assert fetched >= int(remote._remote.lengths.sum())  # spans: images and field blocks
    whole = remote._remote.whole  # every shard assembled: later epochs read one mapped file
    assert all(whole.view(k) is not None for k in range(len(remote.shards)))
    again, _ = _epoch(remote, NAMES)  # the same epoch (seed) from the kept records
    assert remote._remote.bytes_fetched == fetched
    reopened = Dataset(URL)  # another run: each kept span read back and checked (both CRCs)
    third, _ = _epoch(reopened, NAMES)
    assert reopened._remote.bytes_fetched == 0
    for a, b, c, d in zip(_epoch(local, NAMES)[0], first, again, third):
        _same_batch(a, b)
        _same_batch(a, c)
        _same_batch(a, d)
