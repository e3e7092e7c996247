"""Loader(Mixture([...])): the shares per epoch, the right pixels and labels for every
(set, index), the same batches for any worker kind, ranks disjoint and complete, exact and
elastic resume, labels kept or remapped, and the errors at construction."""
from __future__ import annotations

import json
import logging
import pickle
from collections import Counter

import numpy as np
import pytest
import torch

from dlpack_io.reader import (Dataset, Loader, Mixture, Order, Output, RandomHorizontalFlip,
                              RandomResizedCrop, Workers)
from dlpack_io.packer import Writer


def _pack(dst, n, base, classes, *, caption=False):
    """``n`` raw 8x8 images whose every pixel is ``base + i`` (a sample names itself)."""
    with Writer(dst, mode="raw", shard_size="1KB", classes=classes) as w:
        for i in range(n):
            extra = {"caption": f"{base + i}"} if caption else {}
            w.write(image=np.full((8, 8, 3), base + i, np.uint8), label=i % len(classes),
                    **extra)
    return Dataset(dst)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    return (_pack(root / "a", 30, 0, ["cat", "dog", "owl"]),
            _pack(root / "b", 12, 100, ["dog", "emu"]),
            _pack(root / "c", 9, 200, ["cat", "dog", "owl"], caption=True))


def _mix(sets, **kw):
    a, b, _ = sets
    return Mixture([a, b], weights=[0.7, 0.3], samples_per_epoch=kw.pop("n", 50), **kw)


def _epoch(loader, epoch=None):
    if epoch is not None:
        loader.set_epoch(epoch)
    return [(x.clone(), y.clone(), i.copy()) for x, y, i in loader]


def test_each_epoch_draws_the_exact_shares_with_the_right_samples(sets):
    mix = _mix(sets, classes="union")
    assert mix.counts == (35, 15) and mix.weights == (0.7, 0.3) and len(mix) == 50
    assert mix.sizes == [30, 12] and mix.classes == ["cat", "dog", "owl", "emu"]
    mix.counts[0] = 1                                  # a copy: the mixture keeps its shares
    assert mix.counts == [35, 15] and mix.weights == pytest.approx([0.7, 0.3])
    loader = Loader(mix, batch_size=8, output=Output(return_index=True))
    for epoch in range(4):
        batches = _epoch(loader, epoch)
        assert len(batches) == len(loader) == 7
        idx = np.concatenate([i for _, _, i in batches])
        assert idx.shape == (50, 2) and np.bincount(idx[:, 0]).tolist() == [35, 15]
        assert sorted(Counter(idx[idx[:, 0] == 0, 1].tolist()).values()) == [1] * 25 + [2] * 5
        assert sorted(Counter(idx[idx[:, 0] == 1, 1].tolist()).values()) == [1] * 9 + [2] * 3
        for x, y, i in batches:
            assert x[:, 0, 0, 0].tolist() == [100 * s + j for s, j in i.tolist()]
            # set 0 keeps its labels; set 1's dog (0) -> 1, emu (1) -> 3 in the union
            assert y.tolist() == [j % 3 if s == 0 else (1, 3)[j % 2] for s, j in i.tolist()]


def test_labels_are_kept_per_set_by_default(sets, caplog):
    with caplog.at_level(logging.WARNING):
        mix = _mix(sets)
    assert "classes='union'" in caplog.text
    assert mix.classes == ["cat|dog", "dog|emu", "owl"]
    x, y, i = next(iter(Loader(mix, batch_size=50, output=Output(return_index=True))))
    assert y.tolist() == [j % 3 if s == 0 else j % 2 for s, j in i.tolist()]
    with pytest.raises(ValueError, match=r"set 1 .*'emu' is not in classes="):
        _mix(sets, classes=["cat", "dog", "owl"])


@pytest.mark.parametrize("shuffle", ["global", "block"])
def test_the_same_batches_for_any_workers(sets, shuffle):
    mix = _mix(sets, classes="union")
    runs = []
    for workers, kind in [(0, "thread"), (2, "thread"), (2, "process")]:
        loader = Loader(mix, batch_size=8, num_workers=workers, workers=Workers(kind=kind),
                        output=Output(return_index=True), seed=4,
                        shuffle=shuffle, transforms=[RandomResizedCrop(6), RandomHorizontalFlip()])
        runs.append(_epoch(loader, 2))
        loader.close()
    for other in runs[1:]:
        for (xa, ya, ia), (xb, yb, ib) in zip(runs[0], other):
            assert torch.equal(xa, xb) and torch.equal(ya, yb) and np.array_equal(ia, ib)
    # a repeated sample is its own index: its random crop need not be its twin's
    assert len(runs[0]) == 7


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_are_disjoint_complete_and_equal(sets, drop_last):
    mix = _mix(sets, n=53)
    whole = Loader(mix, batch_size=4, seed=1).indices(3)   # the epoch order, virtual
    assert len(whole) == 53
    for world in (2, 3):
        loaders = [Loader(mix, batch_size=4, seed=1, rank=r, world_size=world,
                          drop_last=drop_last,
                          output=Output(return_index=True)) for r in range(world)]
        parts = [ld.indices(3) for ld in loaders]
        seen = np.concatenate(parts)
        assert len(np.unique(seen)) == len(seen)                       # disjoint
        if not drop_last:
            assert sorted(seen.tolist()) == sorted(whole.tolist())       # complete
        counts = {len(_epoch(ld, 3)) for ld in loaders}
        assert len(counts) == 1                                        # the same batches


def _pairs(batches):
    return Counter(map(tuple, np.concatenate([i for _, _, i in batches]).tolist()))


@pytest.mark.parametrize("new_world", [2, 3, 1])
def test_resume_mid_epoch_exact_and_elastic(sets, new_world):
    mix = _mix(sets, n=61)
    opts = dict(batch_size=4, seed=7, return_index=True)
    full = _pairs(_epoch(Loader(mix, **opts), 5))
    done, state = [], None
    for r in range(2):   # two ranks read 3 batches each, then the job stops
        ld = Loader(mix, rank=r, world_size=2, **opts)
        ld.set_epoch(5)
        it = iter(ld)
        done += [next(it)[2] for _ in range(3)]
        state = ld.state_dict()
    later = []
    for r in range(new_world):
        ld = Loader(mix, rank=r, world_size=new_world, **opts)
        ld.load_state_dict(json.loads(json.dumps(state)))  # JSON-friendly
        later += _epoch(ld)
    rest = _pairs(later)
    assert sum(Counter(map(tuple, np.concatenate(done).tolist())).values()) == 24
    assert Counter(map(tuple, np.concatenate(done).tolist())) + rest == full
    if new_world == 2:   # the same world: exactly the batches an unbroken run reads next
        ld = Loader(mix, rank=1, world_size=2, **opts)
        unbroken = _epoch(ld, 5)[3:]
        ld.load_state_dict(state)
        assert [i.tolist() for _, _, i in _epoch(ld)] == [i.tolist() for _, _, i in unbroken]


def test_a_state_of_another_source_is_refused(sets):
    a = sets[0]
    state = Loader(a, batch_size=4).state_dict()
    with pytest.raises(ValueError, match="mixture"):
        Loader(_mix(sets), batch_size=4).load_state_dict(state)
    other = Loader(Mixture([a, sets[1]], weights=[0.5, 0.5], samples_per_epoch=50),
                   batch_size=4).state_dict()
    with pytest.raises(ValueError, match="mixture"):
        Loader(_mix(sets), batch_size=4).load_state_dict(other)


def test_fields_every_set_lacks_are_named_at_construction(sets):
    a, _, c = sets
    with pytest.raises(ValueError, match=r"Mixture set 0: .*/a: no field 'caption'"):
        Loader(Mixture([a, c]), batch_size=4, fields=("image", "caption"))
    x, caption, i = next(iter(Loader(Mixture([c, c.__class__(c.path)]), batch_size=18,
                                     fields=("image", "caption"),
                                     output=Output(return_index=True))))
    assert caption == [str(200 + j) for _, j in i.tolist()]
    assert x[:, 0, 0, 0].tolist() == [200 + j for _, j in i.tolist()]


def test_bad_arguments_are_refused_with_the_fix(sets):
    a, b, _ = sets
    with pytest.raises(ValueError, match="2 weights for 3"):
        Mixture([a, b, sets[2]], weights=[1, 2])
    with pytest.raises(ValueError, match="both given"):
        Mixture([a, b], samples_per_epoch=10, epoch="sum")
    with pytest.raises(ValueError, match="weight -1 of set 1"):
        Mixture([a, b], weights=[1, -1])
    with pytest.raises(ValueError, match="listed twice"):
        Mixture([a, a])
    with pytest.raises(ValueError, match="epoch='most'"):
        Mixture([a, b], epoch="most")
    with pytest.raises(ValueError, match="samples_per_epoch=0|0 samples per epoch"):
        Mixture([a, b], samples_per_epoch=0)
    with pytest.raises(ValueError, match="indices"):
        Loader(Mixture([a, b]), batch_size=4, order=Order(indices=[0, 1]))
    with pytest.raises(TypeError, match="does not nest"):
        Mixture([a, Mixture([b])])
    with pytest.raises(TypeError, match="a list of data sets"):
        Mixture(a.path)
    assert Mixture([a, b]).counts == (30, 12)                  # default: sizes, "sum"
    assert (Mixture([a, b]).epoch_rule, _mix(sets).epoch_rule) == ("sum", None)
    assert Mixture([a.path, b.path], [0.25, 0.75], samples_per_epoch=2).counts == (1, 1)
    assert Mixture([a, b], [1, 2], samples_per_epoch=10).counts == (3, 7)  # 3.33, 6.67
    # decimal weights are taken as written: 0.15 x 10 = 1.5 ties 8.5, the lower set wins
    # (the binary floats 0.1499.. and 0.8499.. would give 1 and 9)
    assert Mixture([a, b], [0.15, 0.85], samples_per_epoch=10).counts == (2, 8)
    assert Mixture([a, b], [1, 1], epoch="largest").counts == (30, 30)
    assert Mixture([a, b], [1, 1], epoch="smallest").counts == (12, 12)


def test_a_mixture_pickles_to_the_same_shares(sets):
    mix = _mix(sets, classes="union")
    back = pickle.loads(pickle.dumps(mix))
    assert (back.counts, back.classes, back.sizes) == (mix.counts, mix.classes, mix.sizes)
    assert "Mixture set 1: " in back.where(int(mix.offsets[1]) + 3 + mix.total)


@pytest.mark.parametrize("workers,kind", [(0, "thread"), (2, "process")])
def test_the_device_path_reads_the_same_samples(sets, workers, kind):
    """device_transforms=True (the kernels' torch reference on the CPU): the gather path
    finds every (set, index) in the mixture's shards as the host path does."""
    mix = _mix(sets, classes="union")
    loader = Loader(mix, batch_size=8, output=Output(return_index=True),
                    workers=Workers(device_transforms=True, kind=kind), num_workers=workers)
    batches = _epoch(loader, 1)
    assert np.bincount(np.concatenate([i for _, _, i in batches])[:, 0]).tolist() == [35, 15]
    for x, y, i in batches:
        assert x[:, 0, 0, 0].tolist() == [100 * s + j for s, j in i.tolist()]
        assert y.tolist() == [j % 3 if s == 0 else (1, 3)[j % 2] for s, j in i.tolist()]


def test_stats_count_the_images_of_each_set(sets):
    mix = _mix(sets)
    loader = Loader(mix, batch_size=8)
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert sum(loader.stats().images_per_set) == 24
    list(it)
    stats = loader.stats()
    assert stats.images_per_set == [35, 15] and "images per set 35, 15" in str(stats)
    list(loader)
    assert loader.stats().run.images_per_set == [70, 30]
    assert loader.stats().as_dict()["images_per_set"] == [35, 15]
    assert "images_per_set" not in Loader(sets[0], batch_size=8).stats().as_dict()
