"""Loader(ds, fields=...): every batch's fields belong to its images, with every worker
kind, ranks, resume, skips and return_index."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dlpack_io.reader import Dataset, Loader, Output, Resize, Workers
from dlpack_io.packer import Writer

N = 23


@pytest.fixture(scope="module")
def fielded(tmp_path_factory):
    dst = tmp_path_factory.mktemp("fields") / "ds"
    with Writer(dst, shard_size="2KB") as w:
        for i in range(N):
            # the image's first pixel is its sample number: fields must travel with it
            image = np.full((6 + i % 3, 7, 3), i, np.uint8)
            w.write(image=image, label=i % 4, caption=f"c{i}", n=10 * i, x=i / 2,
                    emb=np.full(3, i, np.float32), pts=np.full((i % 3, 2), i, np.int64),
                    meta={"i": i})
    return dst


def _check(batch, names):
    out = dict(zip(names, batch))
    idx = out["index"].tolist()
    first = out["image"][:, 0, 0, 0].tolist()
    assert first == idx
    assert out["caption"] == [f"c{i}" for i in idx]
    assert out["n"].dtype == torch.int64 and out["n"].tolist() == [10 * i for i in idx]
    assert out["x"].dtype == torch.float64 and out["x"].tolist() == [i / 2 for i in idx]
    assert out["emb"].shape == (len(idx), 3) and out["emb"][:, 0].tolist() == idx
    assert [tuple(p.shape) for p in out["pts"]] == [(i % 3, 2) for i in idx]
    assert out["meta"] == [{"i": i} for i in idx]
    assert out["label"].tolist() == [i % 4 for i in idx]
    return idx


NAMES = ("image", "caption", "n", "x", "emb", "pts", "meta", "label")


@pytest.mark.parametrize("workers,kind", [(0, "thread"), (2, "thread"), (2, "process")])
def test_fields_travel_with_their_images(fielded, workers, kind):
    loader = Loader(Dataset(fielded), batch_size=5, fields=NAMES,
                    output=Output(return_index=True), workers=Workers(kind=kind),
                    num_workers=workers, transforms=[Resize((4, 4))], seed=3)
    seen = [i for batch in loader for i in _check(batch, NAMES + ("index",))]
    assert sorted(seen) == list(range(N)) and seen != list(range(N))  # shuffled, complete


def test_ranks_and_resume_keep_fields_with_images(fielded):
    ds = Dataset(fielded)
    kw = dict(batch_size=3, fields=NAMES, return_index=True, transforms=[Resize((4, 4))],
              num_workers=0, world_size=2)
    seen = []
    for rank in range(2):
        run = Loader(ds, rank=rank, **kw)
        for k, batch in enumerate(run):
            seen += _check(batch, NAMES + ("index",))
            if k == 1:
                state = run.state_dict()
                break
        resumed = Loader(ds, rank=rank, **kw)
        resumed.load_state_dict(state)
        seen += [i for batch in resumed for i in _check(batch, NAMES + ("index",))]
    assert sorted(seen) == list(range(N))


def test_default_fields_are_image_and_label(fielded):
    batch = next(iter(Loader(Dataset(fielded), batch_size=4, num_workers=0,
                             transforms=[Resize((4, 4))])))
    assert len(batch) == 2 and batch[0].shape == (4, 3, 4, 4) and batch[1].dtype == torch.int64
    only = next(iter(Loader(Dataset(fielded), batch_size=4, num_workers=0, fields=("caption",),
                            shuffle=False, transforms=[Resize((4, 4))])))
    assert only == (["c0", "c1", "c2", "c3"],)


@pytest.mark.parametrize("fields,match", [
    (("image", "nope"), r"no field 'nope'; the data set has \['caption', 'emb'"),
    (("image", "image"), "a field is named twice"),
    ("caption", "expected a non-empty tuple"),
    ((), "expected a non-empty tuple"),
])
def test_unknown_or_repeated_fields_are_refused(fielded, fields, match):
    with pytest.raises(ValueError, match=match):
        Loader(Dataset(fielded), fields=fields)


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_skipped_samples_take_their_fields_with_them(fielded, tmp_path, kind):
    import shutil

    shutil.copytree(fielded, tmp_path / "ds")
    ds = Dataset(tmp_path / "ds")
    k, j = ds.locate(5)
    entry = ds.shards[k].index[j]
    path = ds.shards[k].path
    data = bytearray(open(path, "rb").read())
    data[int(entry["offset"])] ^= 0xFF  # sample 5's first pixel: its image CRC fails
    open(path, "wb").write(bytes(data))
    loader = Loader(Dataset(tmp_path / "ds", verify_checksums=True), batch_size=4,
                    fields=NAMES, output=Output(return_index=True),
                    workers=Workers(on_error="skip", kind=kind), num_workers=2,
                    transforms=[Resize((4, 4))])
    seen = [i for batch in loader for i in _check(batch, NAMES + ("index",))]
    assert sorted(seen) == [i for i in range(N) if i != 5]
    assert [s.sample for s in loader.skipped.samples] == [5]
    assert "checksum mismatch" in loader.skipped.samples[0].reason
