"""The torch references against independent per-pixel Python formulas (tiny cases).

The kernel tests compare Triton against ``dlpack_io.kernels.reference``; these tests make
sure a bug shared by both would still be caught, by re-deriving every documented formula
(docs/kernels.md) pixel by pixel in float64 Python.
"""

import math

import numpy as np
import pytest
import torch

from dlpack_io.kernels import reference

from helpers import random_images

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _bilinear_taps(o, out_len, length):
    src = max((o + 0.5) * length / out_len - 0.5, 0.0)
    i0 = min(int(math.floor(src)), length - 1)
    return [(i0, 1.0 - (src - i0)), (min(i0 + 1, length - 1), src - i0)]


def _aa_taps(o, out_len, length):
    scale = length / out_len
    support = max(scale, 1.0)
    center = scale * (o + 0.5)
    lo = max(int(center - support + 0.5), 0)
    hi = min(int(center + support + 0.5), length)
    w = [max(0.0, 1.0 - abs((j - center + 0.5) / support)) for j in range(lo, hi)]
    return [(j, wj / sum(w)) for j, wj in zip(range(lo, hi), w)]


def _resample_py(img, box, out_h, out_w, flip_h, flip_v, taps):
    """Per-pixel separable resampling of one HWC uint8 numpy image, in float64."""
    top, left, bh, bw = box
    c = img.shape[2]
    out = np.zeros((c, out_h, out_w))
    for y in range(out_h):
        for x in range(out_w):
            ys = taps(out_h - 1 - y if flip_v else y, out_h, bh)
            xs = taps(out_w - 1 - x if flip_h else x, out_w, bw)
            for ch in range(c):
                out[ch, y, x] = sum(wy * wx * float(img[top + j, left + i, ch])
                                    for j, wy in ys for i, wx in xs)
    return out


def test_crop_reference_matches_per_pixel_formula():
    images = random_images(3, 5, 7, 3)
    top, left = torch.tensor([0, 2, 1]), torch.tensor([0, 1, 4])
    fh, fv = torch.tensor([False, True, True]), torch.tensor([True, False, True])
    out = reference.crop_flip_permute(images, top, left, 3, 3, fh, fv)
    img = images.numpy()
    for n in range(3):
        for c in range(3):
            for y in range(3):
                for x in range(3):
                    sy = int(top[n]) + (2 - y if fv[n] else y)
                    sx = int(left[n]) + (2 - x if fh[n] else x)
                    assert out[n, c, y, x] == img[n, sy, sx, c]


def test_normalize_matches_torchvision_formula():
    images = random_images(2, 4, 4, 3)
    zeros = torch.zeros(2, dtype=torch.int64)
    out = reference.crop_flip_permute(images, zeros, zeros, 4, 4, False, False, mean=MEAN,
                                      std=STD, out_dtype=torch.float32)
    chw = images.permute(0, 3, 1, 2).double() / 255.0
    want = (chw - torch.tensor(MEAN).double().view(1, 3, 1, 1)) / torch.tensor(STD).double().view(1, 3, 1, 1)
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)


def test_jitter_matches_documented_formula():
    """Brightness then contrast (the default order) with a given contrast mean."""
    images = random_images(3, 3, 4, 3)
    zeros = torch.zeros(3, dtype=torch.int64)
    b = torch.tensor([0.5, 1.0, 1.7])
    ct = torch.tensor([1.3, 0.0, 0.6])
    m = torch.tensor([0.2, 0.5, 0.9])
    out = reference.crop_flip_permute(images, zeros, zeros, 3, 4, False, False, mean=MEAN,
                                      std=STD, out_dtype=torch.float32, brightness=b,
                                      contrast=ct, contrast_mean=m)
    u = images.permute(0, 3, 1, 2).double() / 255.0
    u = torch.clamp(u * b.double().view(-1, 1, 1, 1), 0, 1)
    u = torch.clamp(ct.double().view(-1, 1, 1, 1) * u + (1 - ct.double().view(-1, 1, 1, 1))
                    * m.double().view(-1, 1, 1, 1), 0, 1)
    want = (u - torch.tensor(MEAN).double().view(1, 3, 1, 1)) / torch.tensor(STD).double().view(1, 3, 1, 1)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_contrast_zero_gives_the_sample_mean():
    """Without contrast_mean, contrast blends towards the sample's own mean: 0.2989 R +
    0.587 G + 0.114 B averaged over the image for RGB, the plain mean for 1 channel."""
    rgb = random_images(2, 3, 5, 3, seed=1)
    zeros = torch.zeros(2, dtype=torch.int64)
    out = reference.crop_flip_permute(rgb, zeros, zeros, 3, 5, False, False,
                                      out_dtype=torch.float32, contrast=torch.zeros(2))
    u = rgb.double() / 255.0
    gray = (0.2989 * u[..., 0] + 0.587 * u[..., 1] + 0.114 * u[..., 2]).mean(dim=(1, 2))
    torch.testing.assert_close(out.double(), gray.view(2, 1, 1, 1).expand(2, 3, 3, 5),
                               rtol=0, atol=1e-6)
    one = random_images(1, 2, 2, 1)
    out = reference.crop_flip_permute(one, zeros[:1], zeros[:1], 2, 2, False, False,
                                      out_dtype=torch.float32, contrast=torch.tensor([0.0]))
    torch.testing.assert_close(out, torch.full_like(out, float(one.double().mean() / 255)))


def test_uint8_rounding_is_half_up():
    # a 1x2 image (10, 11) resized to width 4: taps at 0.25 steps -> 10, 10.25, 10.75, 11
    images = torch.tensor([[[[10], [11]]]], dtype=torch.uint8)
    boxes = torch.tensor([[0, 0, 1, 2]])
    f = reference.resized_crop(images, boxes, (1, 4), False, False, out_dtype=torch.float32)
    u = reference.resized_crop(images, boxes, (1, 4), False, False)
    torch.testing.assert_close(f * 255, torch.tensor([[[[10.0, 10.25, 10.75, 11.0]]]]))
    assert u.flatten().tolist() == [10, 10, 11, 11]


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("box,out_size", [
    ((1, 2, 3, 4), (7, 9)),    # upscale, odd sizes
    ((0, 0, 9, 11), (4, 3)),   # downscale, whole image
    ((2, 3, 5, 5), (5, 5)),    # identity scale
    ((0, 5, 9, 6), (1, 1)),    # to 1x1, box touching right and bottom edges
    ((4, 0, 1, 1), (3, 2)),    # 1x1 box
    ((0, 3, 9, 1), (4, 1)),    # width 1 -> 1 (torch's antialias CPU path gets this wrong)
    ((3, 3, 1, 1), (1, 1)),    # 1x1 -> 1x1
])
def test_resize_reference_matches_per_pixel_formula(box, out_size, antialias):
    images = random_images(1, 9, 11, 3, seed=3)
    taps = _aa_taps if antialias else _bilinear_taps
    for fh, fv in [(False, False), (True, False), (False, True), (True, True)]:
        out = reference.resized_crop(images, torch.tensor([box]), out_size, fh, fv,
                                     out_dtype=torch.float32, antialias=antialias)
        want = _resample_py(images[0].numpy(), box, *out_size, fh, fv, taps) / 255.0
        np.testing.assert_allclose(out[0].numpy(), want, rtol=0, atol=2e-6)


def test_ragged_reference_matches_dense():
    images = random_images(2, 6, 5, 3, seed=4)
    boxes = torch.tensor([[1, 0, 4, 5], [0, 2, 6, 3]])
    dense = reference.resized_crop(images, boxes, (4, 3), True, False, out_dtype=torch.float32)
    flat = torch.cat([torch.zeros(7, dtype=torch.uint8), images[1].flatten(),
                      images[0].flatten()])
    ragged = reference.resized_crop(flat, boxes, (4, 3), True, False, out_dtype=torch.float32,
                                    offsets=torch.tensor([7 + 90, 7]),
                                    heights=torch.tensor([6, 6]), widths=torch.tensor([5, 5]))
    torch.testing.assert_close(ragged, dense, rtol=0, atol=0)


@pytest.mark.parametrize("h,w", [(6, 1), (1, 5), (1, 1)])
def test_ragged_one_pixel_wide_or_high_images_are_read(h, w):
    """A 1-pixel side is a valid record (only 0 is refused): ragged reads it as dense does."""
    images = random_images(2, h, w, 3, seed=h * 7 + w)
    boxes = torch.tensor([[0, 0, h, w], [0, 0, h, w]])
    dense = reference.resized_crop(images, boxes, (3, 2), True, False, out_dtype=torch.float32)
    flat = torch.cat([torch.zeros(5, dtype=torch.uint8), images[0].flatten(),
                      images[1].flatten()])
    ragged = reference.resized_crop(flat, boxes, (3, 2), True, False, out_dtype=torch.float32,
                                    offsets=torch.tensor([5, 5 + h * w * 3]),
                                    heights=torch.tensor([h, h]), widths=torch.tensor([w, w]))
    torch.testing.assert_close(ragged, dense, rtol=0, atol=0)
    assert not torch.equal(ragged[0], ragged[1])  # two different images, not byte 0 twice
