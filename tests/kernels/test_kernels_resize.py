"""resized_crop: Triton kernels (Triton's CPU interpreter) vs the torch reference.

Tolerances (kernel vs reference): float32 1e-5 after normalisation (the kernel and
``F.interpolate`` sum the same float32 taps in a different order); float16 / bfloat16 one
unit in the last place at |x| < 4 (2**-9 / 2**-6); uint8 at most 1 (a resampled value
within float rounding of .5 can round either way), on at most 2 % of the pixels.
"""

import pytest
import torch

from dlpack_io.kernels import crop_flip_permute, reference, resized_crop

from helpers import random_images

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
ATOL = {torch.float32: 1e-5, torch.float16: 2**-9, torch.bfloat16: 2**-6}
FLIPS = [(False, False), (True, False), (False, True), (True, True)]


pytestmark = pytest.mark.usefixtures("triton_interpret")


def _check(out, ref, dtype):
    assert out.dtype == ref.dtype == dtype
    assert out.shape == ref.shape and out.is_contiguous()
    if dtype == torch.uint8:
        diff = (out.int() - ref.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() <= 0.02
    else:
        torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=ATOL[dtype])


def _both(images, boxes, size, fh, fv, **kw):
    out = resized_crop(images, boxes, size, fh, fv, **kw)
    ref = reference.resized_crop(images, boxes, size, fh, fv, **kw)
    return out, ref


BOXES = torch.tensor([
    [0, 0, 11, 13],  # whole image: downscale
    [2, 3, 3, 4],    # small box: upscale
    [8, 9, 3, 4],    # touching bottom-right
    [0, 12, 11, 1],  # one column touching the right edge
])


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.bfloat16, torch.float32])
def test_dtypes(dtype, antialias):
    images = random_images(4, 11, 13, 3)
    fh = torch.tensor([False, True, False, True])
    fv = torch.tensor([False, False, True, True])
    norm = {} if dtype == torch.uint8 else {"mean": MEAN, "std": STD}
    out, ref = _both(images, BOXES, (5, 7), fh, fv, out_dtype=dtype, antialias=antialias,
                     **norm)
    _check(out, ref, dtype)


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("fh,fv", FLIPS)
def test_flips_match_reference_and_mirror(fh, fv, antialias):
    images = random_images(4, 11, 13, 3, seed=1)
    kw = {"out_dtype": torch.float32, "antialias": antialias}
    out, ref = _both(images, BOXES, (6, 5), fh, fv, **kw)
    _check(out, ref, torch.float32)
    plain = resized_crop(images, BOXES, (6, 5), False, False, **kw)
    dims = [d for d, f in ((3, fh), (2, fv)) if f]
    torch.testing.assert_close(out, plain.flip(dims) if dims else plain, rtol=0, atol=1e-6)


@pytest.mark.parametrize("channels", [1, 2, 4])
def test_channel_counts(channels):
    images = random_images(2, 7, 6, channels, seed=channels)
    boxes = torch.tensor([[0, 0, 7, 6], [1, 2, 5, 3]])
    for antialias in (False, True):
        out, ref = _both(images, boxes, (4, 9), True, False, out_dtype=torch.float32,
                         antialias=antialias)
        _check(out, ref, torch.float32)


@pytest.mark.parametrize("shape,box,size", [
    ((1, 1, 1, 3), (0, 0, 1, 1), (3, 2)),         # 1x1 image upscaled
    ((1, 1, 1, 3), (0, 0, 1, 1), (1, 1)),         # 1x1 -> 1x1
    ((2, 9, 1, 3), (0, 0, 9, 1), (4, 1)),         # one column
    ((1, 23, 41, 3), (1, 2, 21, 38), (19, 35)),   # odd, multi-tile, ~1x
    ((1, 40, 70, 3), (0, 0, 40, 70), (17, 33)),   # ~2x downscale, ragged tile edges
])
def test_odd_shapes(shape, box, size):
    images = random_images(*shape)
    boxes = torch.tensor([box] * shape[0])
    for antialias in (False, True):
        out, ref = _both(images, boxes, size, True, True, out_dtype=torch.float32,
                         antialias=antialias)
        _check(out, ref, torch.float32)


def test_identity_scale_equals_crop():
    images = random_images(3, 9, 8, 3, seed=2)
    boxes = torch.tensor([[0, 0, 5, 4], [4, 4, 5, 4], [2, 1, 5, 4]])
    fh, fv = torch.tensor([True, False, True]), torch.tensor([False, True, True])
    want = crop_flip_permute(images, boxes[:, 0], boxes[:, 1], 5, 4, fh, fv)
    for antialias in (False, True):
        got = resized_crop(images, boxes, (5, 4), fh, fv, antialias=antialias)
        assert torch.equal(got, want)


def _ragged(samples, gap=5):
    """Pack HWC uint8 images into one flat buffer in reverse order, with gaps."""
    parts, offsets, pos = [], [0] * len(samples), 0
    for i in reversed(range(len(samples))):
        parts += [torch.full((gap,), 255, dtype=torch.uint8), samples[i].flatten()]
        offsets[i] = pos + gap
        pos += gap + samples[i].numel()
    return (torch.cat(parts), torch.tensor(offsets), torch.tensor([s.shape[0] for s in samples]),
            torch.tensor([s.shape[1] for s in samples], dtype=torch.int32))


@pytest.mark.parametrize("antialias", [False, True])
def test_ragged_batch(antialias):
    g = torch.Generator().manual_seed(5)
    sizes = [(9, 14), (1, 1), (17, 5), (6, 6), (12, 30)]
    samples = [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g) for h, w in sizes]
    flat, offsets, heights, widths = _ragged(samples)
    boxes = torch.tensor([[1, 2, 8, 11], [0, 0, 1, 1], [3, 0, 14, 5], [0, 0, 6, 6], [2, 1, 9, 29]])
    fh = torch.tensor([True, False, True, False, True])
    for dtype in (torch.float16, torch.uint8):
        norm = {"mean": MEAN, "std": STD} if dtype != torch.uint8 else {}
        out, ref = _both(flat, boxes, (7, 8), fh, ~fh, offsets=offsets, heights=heights,
                         widths=widths, out_dtype=dtype, antialias=antialias, **norm)
        _check(out, ref, dtype)
    dense = resized_crop(samples[3][None], boxes[3:4], (7, 8), True, False, antialias=antialias)
    sparse = resized_crop(flat, boxes, (7, 8), fh, ~fh, offsets=offsets, heights=heights,
                          widths=widths, antialias=antialias)
    assert torch.equal(sparse[3], dense[0].flip(2).flip(1))


def test_ragged_single_channel():
    samples = [random_images(1, 5, 7, 1, seed=s)[0] for s in range(3)]
    flat, offsets, heights, widths = _ragged(samples, gap=0)
    boxes = torch.tensor([[0, 0, 5, 7], [1, 1, 3, 3], [4, 6, 1, 1]])
    out, ref = _both(flat, boxes, 4, False, True, offsets=offsets, heights=heights,
                     widths=widths, channels=1, out_dtype=torch.float32)
    _check(out, ref, torch.float32)


def test_large_batch_with_jitter():
    n = 64
    g = torch.Generator().manual_seed(8)
    images = random_images(n, 10, 12, 3, seed=8)
    bh = torch.randint(1, 11, (n,), generator=g)
    bw = torch.randint(1, 13, (n,), generator=g)
    top = (torch.rand(n, generator=g) * (11 - bh)).long()
    left = (torch.rand(n, generator=g) * (13 - bw)).long()
    boxes = torch.stack([top, left, bh, bw], 1).int()
    fh, fv = torch.rand(n, generator=g) < 0.5, torch.rand(n, generator=g) < 0.5
    jitter = {"brightness": 0.6 + 0.8 * torch.rand(n, generator=g),
              "contrast": 0.6 + 0.8 * torch.rand(n, generator=g),
              "contrast_mean": torch.rand(n, generator=g).double()}
    out, ref = _both(images, boxes, (6, 5), fh, fv, out_dtype=torch.float32, mean=MEAN,
                     std=STD, **jitter)
    _check(out, ref, torch.float32)
    k = 16  # the antialias kernel loops over taps: a slice keeps the interpreter quick
    out, ref = _both(images[:k], boxes[:k], (6, 5), fh[:k], fv[:k], antialias=True,
                     **{name: t[:k] for name, t in jitter.items()})
    _check(out, ref, torch.uint8)


def test_empty_batch():
    images = torch.zeros((0, 4, 4, 3), dtype=torch.uint8)
    boxes = torch.zeros((0, 4), dtype=torch.int64)
    out = resized_crop(images, boxes, (2, 3), False, False, out_dtype=torch.bfloat16)
    assert out.shape == (0, 3, 2, 3) and out.dtype == torch.bfloat16


def test_unvalidated_bad_box_stays_in_memory():
    images = random_images(2, 4, 4, 3)
    boxes = torch.tensor([[-2, 1, 9, 2], [3, 3, 0, 5]])
    out = resized_crop(images, boxes, 3, False, False, validate=False, antialias=True)
    assert out.shape == (2, 3, 3, 3)  # values unspecified; no crash, no stray reads
    flat = images.flatten()
    out = resized_crop(flat, boxes, 3, False, False, validate=False, offsets=torch.tensor([0, 90]),
                       heights=torch.tensor([4, 4]), widths=torch.tensor([4, 4]))
    assert out.shape == (2, 3, 3, 3)
