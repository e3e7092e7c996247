"""Detection-sized batches (issue 25): Resize(size, max_size) with torchvision's rule,
Loader(pad=True, pad_multiple) with true sizes, zero image padding after Normalize, the
mask's ignore value; and the refusals of targets that cannot follow the transforms."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from dlpack_io.reader import (ColorJitter, Dataset, Loader, Normalize, Output, RandAugment,
                              RandomHorizontalFlip, RandomResizedCrop, Resize, Workers)
from dlpack_io.packer import Writer
from dlpack_io.reader.batch.options import LoaderOptions

SHAPES = [(40, 60), (61, 30), (50, 50), (33, 90), (70, 41)]


def _torchvision_size(h, w, size, max_size):
    """torchvision's _compute_resized_output_size for an int size, written out."""
    short, long_ = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long_ / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    return (new_long, new_short) if w <= h else (new_short, new_long)


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    dst = tmp_path_factory.mktemp("pad") / "ds"
    with Writer(dst, mode="raw") as w:
        for i, (h, wd) in enumerate(SHAPES):
            image = np.full((h, wd, 3), 200, np.uint8)
            mask = np.full((h, wd), i + 1, np.uint8)
            w.write(image=image, label=i, boxes=np.array([[0, 0, wd, h]], np.float32),
                    categories=np.array([i], np.int64), mask=mask)
    return dst


@pytest.mark.parametrize("size,max_size", [(20, None), (20, 30), (25, 26), (48, 100)])
def test_resize_max_size_is_torchvisions_rule(size, max_size):
    hs, ws = np.array([h for h, _ in SHAPES]), np.array([w for _, w in SHAPES])
    nh, nw = Resize(size, max_size=max_size).resized_shape(hs, ws)
    assert list(zip(nh.tolist(), nw.tolist())) == [_torchvision_size(h, w, size, max_size)
                                                   for h, w in SHAPES]


@pytest.mark.parametrize("kind,workers", [("thread", 0), ("process", 2)])
def test_padded_batches_hold_true_sizes_boxes_and_masks(sized, kind, workers):
    loader = Loader(Dataset(sized), batch_size=5, shuffle=False, num_workers=workers,
                    workers=Workers(kind=kind), output=Output(pad=True, pad_multiple=16),
                    fields=("image", "boxes", "categories", "mask", "label"),
                    transforms=[Resize(20, max_size=30), RandomHorizontalFlip(),
                                Normalize(mean=(0.5,) * 3, std=(0.25,) * 3)],
                    )
    (images, boxes, cats, masks, labels, sizes), = list(loader)
    want = [_torchvision_size(h, w, 20, 30) for h, w in SHAPES]
    assert sizes.dtype == torch.int64 and [tuple(s) for s in sizes.tolist()] == want
    assert images.shape == (5, 3, 32, 32) and masks.shape == (5, 32, 32)  # 30 -> 32
    for k, (h, w) in enumerate(want):
        inside = images[k, :, :h, :w]
        torch.testing.assert_close(inside, torch.full_like(inside, (200 / 255 - 0.5) / 0.25))
        assert images[k, :, h:].abs().sum() == 0 and images[k, :, :, w:].abs().sum() == 0
        assert (masks[k, :h, :w] == k + 1).all()
        assert (masks[k, h:] == 255).all() and (masks[k, :, w:] == 255).all()
        assert boxes[k].tolist() == [[0.0, 0.0, float(w), float(h)]]  # the whole image
        assert cats[k].tolist() == [k]


def test_mask_pad_value_and_multiple_one(sized):
    loader = Loader(Dataset(sized), batch_size=2, shuffle=False, num_workers=0,
                    fields=("mask",), transforms=[Resize(10)], output=Output(pad=True,
                                                                             mask_pad_value=0))
    (masks, sizes), = list(loader)[:1]
    h = max(s[0] for s in sizes.tolist())
    w = max(s[1] for s in sizes.tolist())
    assert masks.shape == (2, h, w)  # the largest image exactly
    assert masks.dtype == torch.uint8 and set(masks.unique().tolist()) == {0, 1, 2}


def test_pad_settings_are_checked():
    with pytest.raises(ValueError, match="pad_multiple=0"):
        LoaderOptions(output=Output(pad=True, pad_multiple=0))
    with pytest.raises(ValueError, match="mask_pad_value=70000"):
        LoaderOptions(output=Output(pad=True, mask_pad_value=70000))
    with pytest.raises(ValueError, match="max_size=20"):
        Resize(20, max_size=20)
    with pytest.raises(ValueError, match="max_size"):
        Resize((20, 30), max_size=40)
    # a pixel count, as torchvision's: not a string (failed at the first batch) nor a
    # fraction (the long side became int(max_size), the short side used the fraction)
    for bad in ("30", 30.7, True):
        with pytest.raises(ValueError, match=f"max_size={bad!r}"):
            Resize(20, max_size=bad)


@pytest.mark.parametrize("pad", [True, False])
def test_mask_pad_value_beyond_the_mask_dtype_is_refused_up_front(sized, pad):
    # uint8 masks cannot hold 300: refused when the Loader is made, naming the option,
    # not at the first batch with numpy's overflow (or the mask kernel's fill check)
    with pytest.raises(ValueError, match=r"mask_pad_value=300: .* uint8 \(0\.\.255\)"):
        Loader(Dataset(sized), batch_size=5, num_workers=0, fields=("image", "mask"),
               transforms=[Resize(10) if pad else RandomResizedCrop(12)], output=Output(pad=pad,
                                                                                        mask_pad_value=300))


def test_resize_alone_without_pad_is_refused(sized):
    with pytest.raises(ValueError, match="pad=True"):
        Loader(Dataset(sized), transforms=[Resize(20)])


def test_pad_on_the_device_path_falls_back_to_the_host(sized, caplog):
    with caplog.at_level(logging.INFO):
        loader = Loader(Dataset(sized), workers=Workers(device_transforms=None),
                        output=Output(pad=True), transforms=[Resize(20)], num_workers=0)
    assert not loader.device_transforms
    with pytest.raises(ValueError, match="pad=True"):
        Loader(Dataset(sized), workers=Workers(device_transforms=True), output=Output(pad=True),
               transforms=[Resize(20)])


def test_targets_that_cannot_follow_are_refused(sized, tmp_path):
    ds = Dataset(sized)
    with pytest.raises(ValueError, match="RandAugment"):
        Loader(ds, fields=("image", "boxes"), transforms=[RandomResizedCrop(16), RandAugment()])
    with pytest.raises(ValueError, match="sample_transform"):
        Loader(ds, fields=("image", "mask"), transforms=[RandomResizedCrop(16)],
               sample_transform=lambda x: x)
    dst = tmp_path / "bad"
    with Writer(dst, mode="raw") as w:
        w.write(image=np.zeros((8, 9, 3), np.uint8), label=0, mask=np.zeros((9, 8), np.uint8))
    loader = Loader(Dataset(dst), fields=("image", "mask"), num_workers=0)
    with pytest.raises(ValueError, match=r"record 0.*mask 9x8 but image 8x9"):
        list(loader)


def test_pad_on_a_data_set_without_fields(tmp_path):
    dst = tmp_path / "plain"
    with Writer(dst, mode="raw") as w:
        for h, wd in SHAPES[:3]:
            w.write(image=np.full((h, wd, 3), 9, np.uint8), label=h)
    ds = Dataset(dst)
    assert ds.fields == {}
    loader = Loader(ds, batch_size=3, shuffle=False, num_workers=0, fields=("label", "image"),
                    transforms=[Resize(12)], output=Output(pad=True, pad_multiple=8))
    (labels, images, sizes), = list(loader)
    assert labels.tolist() == [40, 61, 50]
    assert [tuple(s) for s in sizes.tolist()] == [(12, 18), (24, 12), (12, 12)]
    assert images.shape == (3, 3, 24, 24)
    assert (images[0, :, :12, :18] == 9).all() and images[0, :, 12:].sum() == 0


def test_colour_jitter_on_padded_images_sees_only_their_own_area(tmp_path):
    """Contrast blends towards the image's grayscale mean: a uniform image keeps its value,
    unless the padding were counted in the mean."""
    dst = tmp_path / "uniform"
    with Writer(dst, mode="raw") as w:
        for h, wd in SHAPES[:3]:
            w.write(image=np.full((h, wd, 3), 200, np.uint8), label=0)
    loader = Loader(Dataset(dst), batch_size=3, shuffle=False, num_workers=0,
                    output=Output(pad=True), transforms=[Resize(12), ColorJitter(contrast=(0.5,
                                                                                           0.5))])
    (images, _, sizes), = list(loader)
    for k, (h, w) in enumerate(sizes.tolist()):
        assert (images[k, :, :h, :w] == 200).all()
        assert images[k, :, h:].sum() == 0 and images[k, :, :, w:].sum() == 0


def test_pad_without_geometry_keeps_stored_sizes(sized):
    loader = Loader(Dataset(sized), batch_size=5, shuffle=False, num_workers=0,
                    output=Output(pad=True, pad_multiple=4), fields=("image", "boxes", "mask"))
    (images, boxes, masks, sizes), = list(loader)
    assert [tuple(s) for s in sizes.tolist()] == SHAPES
    assert images.shape == (5, 3, 72, 92) and masks.shape == (5, 72, 92)
    assert [b.tolist() for b in boxes] == [[[0.0, 0.0, float(w), float(h)]] for h, w in SHAPES]
    assert (masks[1, :61, :30] == 2).all() and (masks[1, 61:] == 255).all()
