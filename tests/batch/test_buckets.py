"""Batches of every shape (reader/batch/buckets.py): aspect-ratio buckets and token budgets,
exact over ranks, resume and every worker kind, with boxes and masks that follow."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from dlpack_io.packer import Writer
from dlpack_io.reader import (AspectBuckets, Dataset, Loader, Normalize, Output,
                              RandomHorizontalFlip, RandomResizedCrop, TokenBudget, Workers)
from dlpack_io.reader.batch.buckets import equal_counts

SHAPES = [(30, 60), (60, 30), (40, 40), (36, 70), (64, 32), (44, 48), (50, 50), (33, 66)]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """61 raw images of 8 aspect ratios (a prime count: batches never divide evenly), each
    with one box and a mask of it."""
    dst = tmp_path_factory.mktemp("buckets") / "ds"
    rng = np.random.default_rng(5)
    with Writer(dst, mode="raw", shard_size="40KB", provenance=False) as w:
        for i in range(61):
            h, w_ = SHAPES[i % len(SHAPES)]
            img = rng.integers(0, 256, (h, w_, 3), dtype=np.uint8)
            y0, x0 = h // 4, w_ // 4
            mask = np.zeros((h, w_), np.uint8)
            mask[y0:h - y0, x0:w_ - x0] = 3
            w.write(image=img, label=i % 4, mask=mask,
                    boxes=np.array([[x0, y0, w_ - x0, h - y0]], np.float32))
    return dst


BUCKETS = AspectBuckets(area=48 * 48, multiple=8, max_ratio=2.0)


def _epoch(loader, epoch=None):
    if epoch is not None:
        loader.set_epoch(epoch)
    return [tuple(t.clone() if torch.is_tensor(t) else t for t in b) for b in loader]


def test_the_bucket_list_keeps_the_area_the_multiple_and_the_ratio():
    b = AspectBuckets(area=1024 * 1024, multiple=64, max_ratio=4.0)
    assert (1024, 1024) in b.sizes and len(b.sizes) >= 9
    for h, w in b.sizes:
        assert h % 64 == 0 and w % 64 == 0
        assert abs(h * w - 1024 * 1024) <= 0.1 * 1024 * 1024
        assert max(h / w, w / h) <= 4.0
    ratios = [h / w for h, w in b.sizes]
    assert ratios == sorted(ratios, reverse=True)  # tallest first
    assert AspectBuckets(sizes=[(64, 128), (128, 64)]).sizes == ((64, 128), (128, 64))
    with pytest.raises(ValueError, match="max_ratio"):
        AspectBuckets(max_ratio=0.5)
    with pytest.raises(ValueError, match="bucket height"):
        AspectBuckets(sizes=[(0, 64)])


def test_each_sample_goes_to_the_bucket_nearest_its_aspect_in_log_ratio():
    b = AspectBuckets(sizes=[(64, 128), (96, 96), (128, 64)])
    got = b.bucket_of([100, 100, 100, 100, 50], [200, 141, 142, 60, 100])
    # 100x141: log-ratio -0.343, nearer 0 than -0.693; 100x142 nearer -0.693 (ties: first)
    assert got.tolist() == [0, 1, 0, 2, 0]


def test_every_sample_once_one_bucket_per_batch_and_equal_batches_per_rank(shapes):
    ds = Dataset(shapes)
    seen = []
    counts = []
    for rank in range(3):
        loader = Loader(ds, batch_size=4, buckets=BUCKETS, rank=rank, world_size=3,
                        output=Output(return_index=True), num_workers=1, seed=2)
        batches = _epoch(loader)
        counts.append(len(batches))
        assert len(loader) == len(batches)
        for images, _, idx in batches:
            hs, ws = ds.lookup(idx)[2]["height"], ds.lookup(idx)[2]["width"]
            assert len(set(BUCKETS.bucket_of(hs, ws).tolist())) <= 1
            if len(idx):
                assert tuple(images.shape[-2:]) == BUCKETS.size_for(hs, ws, idx)
            seen += idx.tolist()
    assert len(set(counts)) == 1  # a DDP step never waits for a rank that ran out
    assert sorted(seen) == list(range(61))  # every sample exactly once


def test_epochs_differ_and_workers_do_not_change_a_batch(shapes):
    ds = Dataset(shapes)
    kw = dict(batch_size=5, buckets=BUCKETS, seed=7, transforms=[RandomHorizontalFlip()],
              output=Output(return_index=True), fields=("image", "label", "mask", "boxes"))
    runs = [_epoch(Loader(ds, num_workers=n, workers=Workers(kind=k), **kw), 1)
            for n, k in ((0, "thread"), (2, "thread"), (2, "process"))]
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for a, b in zip(runs[0], other):
            assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
            assert np.array_equal(a[-1], b[-1])
            assert all(torch.equal(x, y) for x, y in zip(a[3], b[3]))
    zero = _epoch(Loader(ds, num_workers=0, **kw), 0)
    assert [b[-1].tolist() for b in zero] != [b[-1].tolist() for b in runs[0]]


def _cover_crop(img: np.ndarray, bucket, corner) -> np.ndarray:
    """The reference: PIL resize to cover the bucket (torchvision's antialiased bilinear),
    then the bucket's crop at ``corner``."""
    bh, bw = bucket
    h, w = img.shape[:2]
    scale = max(bh / h, bw / w)
    rh, rw = max(bh, round(h * scale)), max(bw, round(w * scale))
    resized = np.asarray(Image.fromarray(img).resize((rw, rh), Image.BILINEAR))
    top, left = corner
    return resized[top:top + bh, left:left + bw]


def test_pixels_are_the_cover_resize_then_crop_and_conditioning_says_where(shapes):
    ds = Dataset(shapes)
    loader = Loader(ds, batch_size=4, buckets=BUCKETS, seed=1, num_workers=0,
                    fields=("image", "original_size", "crop_top_left", "target_size"),
                    output=Output(return_index=True))
    worst = 0
    for images, original, corner, target, idx in _epoch(loader):
        for k, i in enumerate(idx.tolist()):
            img = ds[i][0]
            assert original[k].tolist() == list(img.shape[:2])
            ref = _cover_crop(img, tuple(target[k].tolist()), corner[k].tolist())
            ours = images[k].permute(1, 2, 0).numpy()
            worst = max(worst, int(np.abs(ours.astype(int) - ref.astype(int)).max()))
    assert worst <= 1  # the resize straight into the bucket vs PIL's resize then crop


def test_boxes_and_masks_follow_the_cover_resize_and_crop(shapes):
    ds = Dataset(shapes)
    loader = Loader(ds, batch_size=4, buckets=BUCKETS, seed=3, num_workers=1,
                    transforms=[RandomHorizontalFlip()], fields=("image", "mask", "boxes"))
    for images, masks, boxes in _epoch(loader):
        assert masks.shape[-2:] == images.shape[-2:]
        for m, b in zip(masks, boxes):
            ys, xs = np.nonzero(m.numpy() == 3)
            if len(b) and len(ys):  # the box encloses its mask, within a pixel
                x0, y0, x1, y1 = b[0].tolist()
                assert xs.min() >= x0 - 1 and xs.max() + 1 <= x1 + 1
                assert ys.min() >= y0 - 1 and ys.max() + 1 <= y1 + 1


@pytest.mark.parametrize("world_after", [1, 2])
def test_a_state_saved_mid_epoch_resumes_exactly_also_on_another_world_size(shapes,
                                                                           world_after):
    ds = Dataset(shapes)
    kw = dict(batch_size=4, buckets=BUCKETS, seed=4, num_workers=1,
              output=Output(return_index=True))
    full = [b[2].tolist() for b in _epoch(Loader(ds, **kw), 0)]
    first = Loader(ds, **kw)
    it = iter(first)
    head = [next(it)[2].tolist() for _ in range(5)]
    state = first.state_dict()
    del it
    first.close()
    rest = []
    for rank in range(world_after):
        again = Loader(ds, rank=rank, world_size=world_after, **kw)
        again.load_state_dict(state)
        rest.append([b[2].tolist() for b in again])
    if world_after == 1:
        assert head + rest[0] == full  # the same batches an uninterrupted epoch yields
    done = [i for b in head for i in b] + [i for r in rest for b in r for i in b]
    assert sorted(done) == list(range(61))
    assert len({len(r) for r in rest}) == 1


def test_a_state_of_buckets_does_not_continue_fixed_batches(shapes):
    ds = Dataset(shapes)
    bucketed = Loader(ds, batch_size=4, buckets=BUCKETS, num_workers=0)
    it = iter(bucketed)
    next(it)
    state = bucketed.state_dict()
    with pytest.raises(ValueError, match="buckets"):
        Loader(ds, batch_size=4, num_workers=0).load_state_dict(state)


def test_token_budget_sizes_batches_and_padding(shapes):
    ds = Dataset(shapes)
    tb = TokenBudget(tokens=60, patch=8, max_side=48)
    sizes = tb.sizes_of(np.array([30, 60, 400, 20]), np.array([60, 30, 10, 20]))
    # scaled to max_side 48 (never enlarged), sides rounded to the patch, at least one
    assert sizes.tolist() == [[24, 48], [48, 24], [48, 8], [24, 24]]
    loader = Loader(ds, batch_size=64, buckets=tb, seed=2, num_workers=1,
                    transforms=[RandomHorizontalFlip(), Normalize()],
                    output=Output(return_index=True))
    seen, fill = [], []
    for images, _, true, idx in loader:
        tokens = int(((true[:, 0] // 8) * (true[:, 1] // 8)).sum())
        assert tokens <= 60 and images.shape[-2] % 8 == 0 and images.shape[-1] % 8 == 0
        assert tuple(images.shape[-2:]) == tuple(true.max(0).values.tolist())
        for k in range(len(idx)):  # zero outside each sample's true size
            h, w = true[k].tolist()
            assert not images[k, :, h:, :].any() and not images[k, :, :, w:].any()
        seen += idx.tolist()
        fill.append(tokens / 60)
    assert sorted(seen) == list(range(61))
    assert np.mean(fill) >= 0.85, np.mean(fill)


def test_token_budget_fills_realistic_batches():
    rng = np.random.default_rng(0)
    hs, ws = rng.integers(200, 900, 20000), rng.integers(200, 900, 20000)
    tb = TokenBudget(tokens=8192, patch=16, max_side=512)
    batches = tb.batches(hs, ws, 1024, False)
    tokens = tb.tokens_of(hs, ws)
    assert sorted(np.concatenate(batches).tolist()) == list(range(20000))
    assert all(tokens[b].sum() <= 8192 for b in batches)
    assert np.mean([tokens[b].sum() / 8192 for b in batches]) >= 0.95


def test_equal_counts_halves_the_largest_or_drops_the_last():
    batches = [np.arange(4), np.arange(4, 6), np.arange(6, 9)]
    assert [len(b) for b in equal_counts(batches, 2, False)] == [2, 2, 2, 3]
    assert [len(b) for b in equal_counts(batches, 2, True)] == [4, 2]
    assert [len(b) for b in equal_counts([np.arange(1)], 2, False)] == [1, 0]


def test_the_device_path_makes_each_batch_in_one_launch_at_its_bucket(shapes, monkeypatch):
    from dlpack_io import kernels

    launches = []
    real = kernels.resized_crop_packed

    def counted(*args, **kwargs):
        launches.append(tuple(args[2]))
        return real(*args, **kwargs)
    monkeypatch.setattr(kernels, "resized_crop_packed", counted)
    ds = Dataset(shapes)
    loader = Loader(ds, batch_size=4, buckets=BUCKETS, seed=1, num_workers=1,
                    workers=Workers(device_transforms=True), transforms=[Normalize()])
    shapes_seen = [tuple(images.shape[-2:]) for images, _ in loader]
    assert launches == shapes_seen and set(shapes_seen) <= set(BUCKETS.sizes)


def test_a_mixture_is_bucketed_like_one_data_set(shapes):
    from dlpack_io.reader import Mixture

    mix = Mixture([Dataset(shapes), Dataset(shapes)], weights=[0.5, 0.5], samples_per_epoch=80)
    loader = Loader(mix, batch_size=4, buckets=BUCKETS, num_workers=1,
                    output=Output(return_index=True))
    total = 0
    for images, _, idx in loader:
        hs = np.array([SHAPES[i % len(SHAPES)][0] for _, i in idx.tolist()])
        ws = np.array([SHAPES[i % len(SHAPES)][1] for _, i in idx.tolist()])
        assert len(set(BUCKETS.bucket_of(hs, ws).tolist())) == 1
        total += len(idx)
    assert total == 80


def test_buckets_refuse_what_they_cannot_follow(shapes):
    ds = Dataset(shapes)
    with pytest.raises(ValueError, match="leave RandomResizedCrop out"):
        Loader(ds, buckets=BUCKETS, transforms=[RandomResizedCrop(32)])
    with pytest.raises(ValueError, match="sample_transform"):
        Loader(ds, buckets=BUCKETS, sample_transform=lambda x: x)
    with pytest.raises(TypeError, match="AspectBuckets"):
        Loader(ds, buckets=(64, 64))
    with pytest.raises(ValueError, match="cannot hold one image"):
        TokenBudget(tokens=10, patch=16, max_side=512)
