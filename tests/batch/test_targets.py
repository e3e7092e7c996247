"""Boxes and masks follow every crop, resize and flip of their images (issue 25).

The property: each image holds one solid rectangle at a known box, with a mask of it; after
any combination of the geometric transforms the box the Loader returns encloses the
rectangle's pixels in the returned image and the mask agrees with them, allowing one pixel
at the edges (resampling). Checked on the host path and on the kernel path (the image and
mask kernels under TRITON_INTERPRET=1). Boxes also against a plain numpy implementation.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dlpack_io.reader import (CenterCrop, Dataset, Loader, Output, RandomCrop,
                              RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip, Resize,
                              Workers)
from dlpack_io.packer import Writer

N = 10
NAMES = ("image", "boxes", "categories", "mask", "label")


def _sample(i: int):
    """Image i: a (h, w) black image with a white rectangle; the rectangle's box; mask."""
    rng = np.random.default_rng(i)
    h, w = int(rng.integers(40, 72)), int(rng.integers(40, 72))
    x0, y0 = int(rng.integers(0, w - 12)), int(rng.integers(0, h - 12))
    x1, y1 = int(rng.integers(x0 + 8, w + 1)), int(rng.integers(y0 + 8, h + 1))
    image = np.zeros((h, w, 3), np.uint8)
    image[y0:y1, x0:x1] = 255
    mask = np.zeros((h, w), np.uint8)
    mask[y0:y1, x0:x1] = 7
    # a second box far off in a corner, 2x2: crops often remove it (with its category)
    boxes = np.array([[x0, y0, x1, y1], [0, 0, 2, 2]], np.float32)
    return image, boxes, np.array([10 + i, 99], np.int64), mask


@pytest.fixture(scope="module")
def rects(tmp_path_factory):
    dst = tmp_path_factory.mktemp("targets") / "ds"
    with Writer(dst, mode="raw") as w:
        for i in range(N):
            image, boxes, cats, mask = _sample(i)
            w.write(image=image, label=i, boxes=boxes, categories=cats, mask=mask)
    return dst


GEOMETRIES = {
    "rrc": [RandomResizedCrop(32, scale=(0.2, 1.0))],
    "rrc-wide": [RandomResizedCrop((24, 40), scale=(0.5, 1.0))],
    "random-crop": [RandomCrop(36)],
    "center-crop": [CenterCrop((30, 38))],
    "resize-center": [Resize(48), CenterCrop(40)],
    "resize-random": [Resize(44), RandomCrop((36, 40))],
    "resize-fixed": [Resize((33, 47))],
}
FLIPS = [[], [RandomHorizontalFlip()], [RandomVerticalFlip()],
         [RandomHorizontalFlip(), RandomVerticalFlip(0.7)]]


def _near(a: np.ndarray) -> np.ndarray:
    """True where a pixel's 3x3 neighbourhood holds a True (a one-pixel dilation)."""
    p = np.pad(a, 1)
    return np.any([p[dy:dy + a.shape[0], dx:dx + a.shape[1]]
                   for dy in range(3) for dx in range(3)], axis=0)


def _check_sample(image, boxes, cats, mask, label, height=None, width=None):
    h = image.shape[1] if height is None else height
    w = image.shape[2] if width is None else width
    rect = image[0, :h, :w].numpy() >= 128
    ours = mask[:h, :w].numpy()
    assert set(np.unique(ours)) <= {0, 7}
    # the mask agrees with the pixels, except within one pixel of the rectangle's edges
    edge = _near(rect) & _near(~rect)
    assert not np.any(((ours == 7) != rect) & ~edge)
    assert set(cats.tolist()) <= {10 + label, 99}  # each box kept with its own category
    big = [k for k in range(len(cats)) if cats[k].item() == 10 + label]
    if not rect.any() or not big:
        # no box left: at most a resampling sliver of the rectangle shows (< 2 rows/cols)
        assert rect.sum() <= 2 * max(h, w)
        return
    x0, y0, x1, y1 = boxes[big[0]].tolist()
    ys, xs = np.nonzero(rect)
    # encloses the pixels (pixel j spans [j, j + 1)), and tightly: one pixel each way
    assert x0 <= xs.min() + 1 and y0 <= ys.min() + 1
    assert x1 >= xs.max() - 0 and y1 >= ys.max() - 0
    assert abs(x0 - xs.min()) <= 1 and abs(y0 - ys.min()) <= 1
    assert abs(x1 - (xs.max() + 1)) <= 1 and abs(y1 - (ys.max() + 1)) <= 1


def _run(ds, transforms, seeds=(0, 1), batch_size=4, **kw):
    seen = 0
    for seed in seeds:
        loader = Loader(ds, batch_size=batch_size, num_workers=0, fields=NAMES, seed=seed,
                        transforms=transforms, **kw)
        for images, boxes, cats, masks, labels in loader:
            assert masks.shape == (images.shape[0], *images.shape[2:])
            for k in range(len(labels)):
                assert boxes[k].dtype == torch.float32 and boxes[k].shape[1:] == (4,)
                assert len(boxes[k]) == len(cats[k])
                _check_sample(images[k], boxes[k], cats[k], masks[k], int(labels[k]))
                seen += 1
    assert seen == len(seeds) * N


@pytest.mark.parametrize("flips", range(len(FLIPS)))
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
def test_boxes_and_mask_follow_the_pixels_host(rects, geometry, flips):
    _run(Dataset(rects), GEOMETRIES[geometry] + FLIPS[flips], device_transforms=False)


@pytest.mark.parametrize("geometry", ["resize-center"])
def test_boxes_and_mask_follow_the_pixels_kernels(rects, geometry, triton_interpret):
    """The kernels' path (image and mask kernels) on CPU tensors, Triton's interpreter."""
    _run(Dataset(rects), GEOMETRIES[geometry] + FLIPS[3], seeds=(5,), batch_size=N,
         device_transforms=True)


@pytest.mark.parametrize("crop", [RandomResizedCrop(28)])
def test_host_and_kernel_masks_identical(rects, crop, triton_interpret):
    """The same nearest tables drive both paths: without a fractional Resize box the two
    masks and box lists are identical."""
    kw = dict(batch_size=5, num_workers=0, fields=NAMES, seed=4,
              transforms=[crop, RandomHorizontalFlip()])
    host = list(Loader(Dataset(rects), workers=Workers(device_transforms=False), **kw))
    dev = list(Loader(Dataset(rects), workers=Workers(device_transforms=True), **kw))
    assert len(host) == len(dev) == 2
    for a, b in zip(host, dev):
        torch.testing.assert_close(a[0].float(), b[0].float(), rtol=0, atol=1.0)  # pixels
        for k in range(len(a[4])):  # the kernel path also passes the property
            _check_sample(b[0][k], b[1][k], b[2][k], b[3][k], int(b[4][k]))
        assert torch.equal(a[3], b[3])
        assert all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


# ---- against a plain numpy implementation of the same maths -----------------------------
def _numpy_boxes(boxes, src, size, fh, fv):
    """One box at a time, written out: map, clip, flip, drop < 1 px (SanitizeBoundingBoxes)."""
    top, left, bh, bw = src
    oh, ow = size
    out = []
    for x0, y0, x1, y1 in boxes:
        xs = [min(max((x - left) * ow / bw, 0.0), ow) for x in (x0, x1)]
        ys = [min(max((y - top) * oh / bh, 0.0), oh) for y in (y0, y1)]
        if fh:
            xs = [ow - xs[1], ow - xs[0]]
        if fv:
            ys = [oh - ys[1], oh - ys[0]]
        if xs[1] - xs[0] >= 1 and ys[1] - ys[0] >= 1:
            out.append([xs[0], ys[0], xs[1], ys[1]])
    return np.array(out, np.float64).reshape(-1, 4)


def _numpy_mask(mask, src, size, fh, fv):
    """Nearest neighbour by pixel centres, then the flips."""
    top, left, bh, bw = src
    oh, ow = size
    rows = [min(max(int(np.floor(top + (y + 0.5) * bh / oh)), 0), mask.shape[0] - 1)
            for y in range(oh)]
    cols = [min(max(int(np.floor(left + (x + 0.5) * bw / ow)), 0), mask.shape[1] - 1)
            for x in range(ow)]
    out = mask[np.ix_(rows, cols)]
    out = out[:, ::-1] if fh else out
    return out[::-1] if fv else out


@pytest.mark.parametrize("transforms", [
    [RandomResizedCrop((30, 26), scale=(0.1, 1.0)), RandomHorizontalFlip(),
     RandomVerticalFlip()],
    [Resize(50), RandomCrop(44), RandomHorizontalFlip()],
    [Resize((31, 45)), RandomVerticalFlip()],
    [RandomCrop(38), RandomHorizontalFlip(), RandomVerticalFlip()],
])
def test_boxes_and_masks_equal_a_numpy_implementation(rects, transforms):
    ds = Dataset(rects)
    loader = Loader(ds, batch_size=3, num_workers=0, fields=NAMES, seed=11,
                    output=Output(return_index=True), transforms=transforms)
    loader.set_epoch(2)
    for images, boxes, cats, masks, labels, index in loader:
        _, _, entries = ds.lookup(index)
        p = loader.spec.draw(11, 2, index, entries["height"], entries["width"])
        src = p.exact if p.exact is not None else p.boxes
        for k, i in enumerate(np.asarray(index).tolist()):
            image, stored, _, mask = _sample(i)
            fh, fv = bool(p.flip_h[k]), bool(p.flip_v[k])
            want = _numpy_boxes(stored.astype(np.float64), src[k], p.out_size, fh, fv)
            np.testing.assert_allclose(boxes[k].numpy(), want, rtol=0, atol=1e-4)
            want = _numpy_mask(mask, src[k], p.out_size, fh, fv)
            np.testing.assert_array_equal(masks[k].numpy(), want)


def test_boxes_cropped_away_vanish_with_their_categories(tmp_path):
    dst = tmp_path / "ds"
    with Writer(dst, mode="raw") as w:
        image = np.zeros((40, 40, 3), np.uint8)
        # in the middle (kept), in a corner (cropped away), none at all
        w.write(image=image, label=0, boxes=np.array([[18, 18, 22, 22], [0, 0, 5, 5],
                                                      [39.5, 0, 40, 40]], np.float32),
                categories=np.array([1, 2, 3], np.int64), iscrowd=np.array([0, 1, 0], np.uint8))
        w.write(image=image, label=1, boxes=np.array([[0, 0, 5, 5], [35, 35, 40, 40],
                                                      [0, 30, 40, 40]], np.float32),
                categories=np.array([4, 5, 6], np.int64), iscrowd=np.array([1, 1, 1], np.uint8))
    loader = Loader(Dataset(dst), batch_size=2, shuffle=False, num_workers=0,
                    fields=("boxes", "categories", "iscrowd", "label"),
                    transforms=[CenterCrop(20)])
    (boxes, cats, crowd, labels), = list(loader)
    assert boxes[0].tolist() == [[8.0, 8.0, 12.0, 12.0]]
    assert cats[0].tolist() == [1] and crowd[0].tolist() == [0]
    assert boxes[1].shape == (0, 4) and boxes[1].dtype == torch.float32
    assert cats[1].shape == (0,) and cats[1].dtype == torch.int64 and crowd[1].shape == (0,)


def test_samples_without_boxes_give_empty_tensors(tmp_path):
    dst = tmp_path / "ds"
    with Writer(dst, mode="raw") as w:
        for n in (0, 2, 0):
            w.write(image=np.zeros((20, 30, 3), np.uint8), label=n,
                    boxes=np.full((n, 4), 5, np.float32) + [0, 0, 4, 4],
                    categories=np.arange(n, dtype=np.int64))
    loader = Loader(Dataset(dst), batch_size=3, shuffle=False, num_workers=0,
                    fields=("image", "boxes", "categories"), transforms=[RandomHorizontalFlip(1.0)])
    (images, boxes, cats), = list(loader)
    assert [tuple(b.shape) for b in boxes] == [(0, 4), (2, 4), (0, 4)]
    assert boxes[1].tolist() == [[21.0, 5.0, 25.0, 9.0]] * 2  # x -> 30 - x, swapped
    assert [tuple(c.shape) for c in cats] == [(0,), (2,), (0,)]


def test_targets_of_a_mixture_follow_their_own_sets(tmp_path):
    """Indices of a Mixture are virtual: each sample's boxes and categories still come from
    its own set, moved by its own crop and flip."""
    from dlpack_io.reader import Mixture

    for name, first in (("a", 0), ("b", 100)):
        with Writer(tmp_path / name, mode="raw") as w:
            for i in range(4):
                w.write(image=np.zeros((20, 20, 3), np.uint8), label=0,
                        boxes=np.array([[first % 7 + i, 2, 10 + i, 12]], np.float32),
                        categories=np.array([first + i], np.int64))
    loader = Loader(Mixture([Dataset(tmp_path / "a"), Dataset(tmp_path / "b")]), batch_size=8,
                    num_workers=0, fields=("boxes", "categories"),
                    output=Output(return_index=True), seed=2,
                    transforms=[CenterCrop(16), RandomHorizontalFlip()])
    p = loader.spec
    (boxes, cats, where), = list(loader)
    flips = p.draw(2, 0, loader.indices(0), np.full(8, 20), np.full(8, 20)).flip_h
    for k, (s, i) in enumerate(where.tolist()):
        assert cats[k].tolist() == [100 * s + i]
        x0, x1 = max((100 * s) % 7 + i - 2, 0), 10 + i - 2  # clipped at the crop's edge
        want = [16 - x1, 0, 16 - x0, 10] if flips[k] else [x0, 0, x1, 10]
        assert boxes[k].tolist() == [[float(v) for v in want]]
