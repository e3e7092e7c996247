"""crop_flip_permute: Triton kernel (run by Triton's CPU interpreter) vs torch reference.

Tolerances (kernel vs reference): uint8 exact; float32 1e-6; float16 / bfloat16 one unit
in the last place at |x| < 4 (2**-9 / 2**-6: the two round the same float32 value, but
Triton's interpreter truncates float32 -> bfloat16 where the GPU rounds to nearest).
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlpack_io.kernels import crop_flip_permute, reference

from helpers import random_images

MEAN = (0.485, 0.456, 0.406, 0.5)
STD = (0.229, 0.224, 0.225, 0.25)
ATOL = {torch.uint8: 0, torch.float32: 1e-6, torch.float16: 2**-9, torch.bfloat16: 2**-6}
FLIPS = [(False, False), (True, False), (False, True), (True, True)]


pytestmark = pytest.mark.usefixtures("triton_interpret")


def _both(images, top, left, h, w, fh, fv, **kw):
    out = crop_flip_permute(images, top, left, h, w, fh, fv, **kw)
    ref = reference.crop_flip_permute(images, top, left, h, w, fh, fv, **kw)
    return out, ref


def _check(out, ref, dtype):
    assert out.dtype == ref.dtype == dtype
    assert out.shape == ref.shape and out.is_contiguous()
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=ATOL[dtype])


def test_kernel_path_is_used():
    from dlpack_io.kernels.launch import use_triton
    assert os.environ["TRITON_INTERPRET"] == "1" and use_triton(torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fh,fv", FLIPS)
def test_dtypes_and_flips(dtype, fh, fv):
    images = random_images(3, 9, 13, 3)
    top, left = torch.tensor([0, 4, 2]), torch.tensor([0, 6, 3])
    norm = {} if dtype == torch.uint8 else {"mean": MEAN[:3], "std": STD[:3]}
    out, ref = _both(images, top, left, 5, 7, fh, fv, out_dtype=dtype, **norm)
    _check(out, ref, dtype)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_channel_counts(channels):
    images = random_images(2, 5, 6, channels, seed=channels)
    top, left = torch.tensor([1, 0]), torch.tensor([0, 2])
    fh, fv = torch.tensor([True, False]), torch.tensor([False, True])
    out, ref = _both(images, top, left, 4, 4, fh, fv)
    _check(out, ref, torch.uint8)
    out, ref = _both(images, top, left, 4, 4, fh, fv, out_dtype=torch.float32,
                     mean=MEAN[:channels], std=STD[:channels])
    _check(out, ref, torch.float32)


@pytest.mark.parametrize("shape,crop", [
    ((1, 1, 1, 3), (1, 1)),      # 1x1 image
    ((2, 7, 1, 3), (3, 1)),      # one column
    ((2, 1, 9, 3), (1, 5)),      # one row
    ((1, 37, 70, 3), (35, 67)),  # several tiles with ragged edges (16x32 tiles)
])
def test_odd_shapes(shape, crop):
    n, h, w, _ = shape
    images = random_images(*shape)
    top = torch.full((n,), h - crop[0], dtype=torch.int32)  # touches the bottom edge
    left = torch.zeros(n, dtype=torch.int32)                # and the left one
    for fh, fv in FLIPS:
        out, ref = _both(images, top, left, *crop, fh, fv)
        _check(out, ref, torch.uint8)


def test_crops_touching_every_edge():
    images = random_images(4, 8, 10, 3)
    top = torch.tensor([0, 0, 5, 5])
    left = torch.tensor([0, 6, 0, 6])
    fh = torch.tensor([True, False, True, False])
    fv = torch.tensor([False, False, True, True], dtype=torch.uint8)
    out, ref = _both(images, top, left, 3, 4, fh, fv)
    _check(out, ref, torch.uint8)
    full, ref = _both(images, top * 0, left * 0, 8, 10, fh, fv, out_dtype=torch.float16)
    _check(full, ref, torch.float16)


def test_large_batch_with_jitter():
    n = 96
    g = torch.Generator().manual_seed(7)
    images = random_images(n, 12, 10, 3, seed=7)
    top = torch.randint(0, 12 - 7 + 1, (n,), generator=g)
    left = torch.randint(0, 10 - 5 + 1, (n,), generator=g)
    fh = torch.rand(n, generator=g) < 0.5
    fv = torch.rand(n, generator=g) < 0.5
    jitter = {"brightness": 0.6 + 0.8 * torch.rand(n, generator=g),
              "contrast": 0.6 + 0.8 * torch.rand(n, generator=g)}
    for dtype in (torch.float32, torch.bfloat16):
        out, ref = _both(images, top, left, 7, 5, fh, fv, out_dtype=dtype, mean=MEAN[:3],
                         std=STD[:3], **jitter)
        _check(out, ref, dtype)
    out, ref = _both(images, top, left, 7, 5, fh, fv, contrast_mean=torch.rand(n, generator=g),
                     **jitter)
    assert (out.int() - ref.int()).abs().max() <= 1  # uint8 with jitter: round-half ties


def test_uint8_copy_is_exact_and_flip_invariant():
    images = random_images(2, 6, 7, 3, seed=9)
    top, left = torch.tensor([1, 0]), torch.tensor([2, 1])
    plain = crop_flip_permute(images, top, left, 5, 5, False, False)
    both = crop_flip_permute(images, top, left, 5, 5, True, True)
    assert torch.equal(both, plain.flip(2, 3))
    assert torch.equal(plain[0], images[0, 1:6, 2:7].permute(2, 0, 1))


def test_empty_batch():
    images = torch.zeros((0, 4, 4, 3), dtype=torch.uint8)
    empty = torch.zeros(0, dtype=torch.int64)
    out = crop_flip_permute(images, empty, empty, 2, 3, False, False, out_dtype=torch.float16)
    assert out.shape == (0, 3, 2, 3) and out.dtype == torch.float16


def test_unvalidated_bad_box_stays_in_memory():
    images = random_images(2, 4, 4, 3)
    top, left = torch.tensor([-3, 2]), torch.tensor([0, 3])
    out, ref = _both(images, top, left, 3, 3, False, True, validate=False)
    _check(out, ref, torch.uint8)  # both clamp reads into the image


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_crops_match_indexing(data):
    n = data.draw(st.integers(1, 3))
    h, w = data.draw(st.integers(1, 20)), data.draw(st.integers(1, 40))
    c = data.draw(st.integers(1, 4))
    ch, cw = data.draw(st.integers(1, h)), data.draw(st.integers(1, w))
    tops = [data.draw(st.integers(0, h - ch)) for _ in range(n)]
    lefts = [data.draw(st.integers(0, w - cw)) for _ in range(n)]
    fh = [data.draw(st.booleans()) for _ in range(n)]
    fv = [data.draw(st.booleans()) for _ in range(n)]
    images = random_images(n, h, w, c, seed=n * h * w)
    out = crop_flip_permute(images, torch.tensor(tops), torch.tensor(lefts), ch, cw,
                            torch.tensor(fh), torch.tensor(fv))
    for i in range(n):
        want = images[i, tops[i]:tops[i] + ch, lefts[i]:lefts[i] + cw].permute(2, 0, 1)
        want = want.flip([d for d, f in ((2, fh[i]), (1, fv[i])) if f])
        assert torch.equal(out[i], want)
