"""Colour jitter in the shared epilogue: torchvision's ColorJitter meaning, every order.

The torch reference (``reference.epilogue``, also the Loader's CPU path) is checked against
torchvision's tensor formulas, copied out below (torchvision is not installed here); the
Triton kernels (Triton's CPU interpreter) are checked against the reference.
Tolerances: reference vs torchvision 2e-6 in [0, 1] units (float32 rounding: summation
order of the contrast mean, ``add(alpha=)``, the HSV->RGB form); kernel vs reference as in
docs/kernels.md (float32 1e-5 after normalisation, uint8 +-1 on <= 2 % of the pixels).
"""

import itertools

import pytest
import torch

from dlpack_io.kernels import crop_flip_permute, reference, resized_crop
from dlpack_io.kernels.records import encode_order

from helpers import random_images

PERMS = list(itertools.permutations(range(4)))  # all 24 orders of torchvision's fn_idx
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


# --- torchvision.transforms.v2.functional, float images (copied formulas) -------------

def tv_gray(img):
    r, g, b = img.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(dim=-3)


def tv_blend(img1, img2, ratio):
    return img1.mul(ratio).add_(img2, alpha=1.0 - ratio).clamp_(0, 1.0)


def tv_brightness(img, f):
    return img.mul(f).clamp_(0, 1.0)


def tv_contrast(img, f):
    gray = tv_gray(img) if img.shape[-3] == 3 else img
    return tv_blend(img, torch.mean(gray, dim=(-3, -2, -1), keepdim=True), f)


def tv_saturation(img, f):
    return img if img.shape[-3] == 1 else tv_blend(img, tv_gray(img), f)


def tv_rgb_to_hsv(image):
    r, g, _ = image.unbind(dim=-3)
    minc, maxc = torch.aminmax(image, dim=-3)
    eqc = maxc == minc
    channels_range = maxc - minc
    ones = torch.ones_like(maxc)
    s = channels_range / torch.where(eqc, ones, maxc)
    divisor = torch.where(eqc, ones, channels_range).unsqueeze_(dim=-3)
    rc, gc, bc = ((maxc.unsqueeze(dim=-3) - image) / divisor).unbind(dim=-3)
    neq_r, eq_g = maxc != r, maxc == g
    hg = rc.add(2.0).sub_(bc).mul_(eq_g & neq_r)
    hr = bc.sub_(gc).mul_(~neq_r)
    hb = gc.add_(4.0).sub_(rc).mul_(neq_r.logical_and_(eq_g.logical_not_()))
    h = hr.add_(hg).add_(hb).mul_(1.0 / 6.0).add_(1.0).fmod_(1.0)
    return torch.stack((h, s, maxc), dim=-3)


def tv_hsv_to_rgb(img):
    h, s, v = img.unbind(dim=-3)
    h6 = h.mul(6)
    i = torch.floor(h6)
    f = h6.sub_(i)
    i = i.to(dtype=torch.int32)
    sxf = s * f
    one_minus_s = 1.0 - s
    q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0)
    t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0)
    p = one_minus_s.mul_(v).clamp_(0.0, 1.0)
    i.remainder_(6)
    vpqt = torch.stack((v, p, q, t), dim=-3)
    select = torch.tensor([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]])
    return vpqt.gather(-3, select[:, i])


def tv_hue(img, f):
    if img.shape[-3] == 1:
        return img
    h, s, v = tv_rgb_to_hsv(img).unbind(dim=-3)
    h.add_(f).remainder_(1.0)
    return tv_hsv_to_rgb(torch.stack((h, s, v), dim=-3))


def tv_color_jitter(img, fn_idx, b=None, c=None, s=None, h=None):
    """ColorJitter._transform for one CHW float image, given its drawn parameters."""
    for fn_id in fn_idx:
        if fn_id == 0 and b is not None:
            img = tv_brightness(img, b)
        elif fn_id == 1 and c is not None:
            img = tv_contrast(img, c)
        elif fn_id == 2 and s is not None:
            img = tv_saturation(img, s)
        elif fn_id == 3 and h is not None:
            img = tv_hue(img, h)
    return img


# --- helpers ---------------------------------------------------------------------------

def _factors(n, seed, ops=("brightness", "contrast", "saturation", "hue")):
    """ColorJitter(0.4, 0.4, 0.4, 0.1)-like per-sample factors (float32)."""
    g = torch.Generator().manual_seed(seed)
    out = {name: 0.6 + 0.8 * torch.rand(n, generator=g) for name in ops if name != "hue"}
    if "hue" in ops:
        out["hue"] = 0.2 * torch.rand(n, generator=g) - 0.1
    return out


def _tv_batch(chw_u8, perms, factors):
    """torchvision, sample by sample, on the [0, 1] float image."""
    want = []
    for i, img in enumerate(chw_u8.float() * (1.0 / 255)):
        kw = {k[0]: float(v[i]) for k, v in factors.items()}
        want.append(tv_color_jitter(img, perms[i], **kw))
    return torch.stack(want)


def _ours(chw_u8, perms, factors, **kw):
    """reference.epilogue, by default in [0, 1] units (float32 output, no normalisation)."""
    kw.setdefault("out_dtype", torch.float32)
    return reference.epilogue(chw_u8, order=encode_order(torch.tensor(perms)), **factors, **kw)


# --- reference vs torchvision ----------------------------------------------------------

def test_every_order_of_all_four_ops_matches_torchvision():
    chw = random_images(24, 9, 11, 3, seed=1).permute(0, 3, 1, 2).contiguous()
    factors = _factors(24, seed=2)
    got = _ours(chw, PERMS, factors)
    want = _tv_batch(chw, PERMS, factors)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("op", ["brightness", "contrast", "saturation", "hue"])
def test_each_op_alone_matches_torchvision(op):
    chw = random_images(6, 7, 5, 3, seed=3).permute(0, 3, 1, 2).contiguous()
    factors = _factors(6, seed=4, ops=(op,))
    perms = [PERMS[i * 4] for i in range(6)]
    torch.testing.assert_close(_ours(chw, perms, factors), _tv_batch(chw, perms, factors),
                               rtol=0, atol=2e-6)


def test_extremes_match_torchvision():
    chw = random_images(8, 6, 6, 3, seed=5).permute(0, 3, 1, 2).contiguous()
    chw[0, :, :3] = chw[0, 0:1, :3]  # gray pixels (hue undefined, s = 0)
    chw[1, 1] = chw[1, 0]  # R == G ties for the HSV branch
    zero, one = torch.zeros(8), torch.ones(8)
    cases = [
        dict(brightness=zero),  # black
        dict(brightness=torch.full((8,), 3.0)),  # clamps at 1
        dict(contrast=zero),  # flat grey at the mean
        dict(contrast=torch.full((8,), 4.0)),  # clamps both ways
        dict(saturation=zero),  # grayscale
        dict(saturation=torch.full((8,), 5.0)),
        dict(hue=torch.linspace(-0.5, 0.5, 8)),
        dict(brightness=one, contrast=one, saturation=one, hue=torch.zeros(8)),  # ~identity
    ]
    perms = [PERMS[i * 3] for i in range(8)]
    for factors in cases:
        torch.testing.assert_close(_ours(chw, perms, factors), _tv_batch(chw, perms, factors),
                                   rtol=0, atol=2e-6)
    ident = _ours(chw, perms, cases[-1])
    torch.testing.assert_close(ident, chw.float() / 255, rtol=0, atol=1e-6)


def test_contrast_uses_the_image_as_it_is_at_its_step():
    """Brightness 3 before contrast clamps first; contrast then blends towards the mean of
    the clamped image, not of the input (and the two orders differ)."""
    chw = random_images(2, 8, 8, 3, seed=6).permute(0, 3, 1, 2).contiguous()
    factors = {"brightness": torch.full((2,), 3.0), "contrast": torch.full((2,), 0.0)}
    b_first = _ours(chw, [(0, 1, 2, 3), (0, 1, 2, 3)], factors)
    c_first = _ours(chw, [(1, 0, 2, 3), (1, 0, 2, 3)], factors)
    u = chw.float() / 255
    clamped_mean = tv_gray(torch.clamp(u * 3.0, 0, 1)).mean(dim=(1, 2, 3))
    torch.testing.assert_close(b_first, clamped_mean.view(2, 1, 1, 1).expand_as(u), rtol=0,
                               atol=1e-6)
    input_mean = tv_gray(u).mean(dim=(1, 2, 3))
    torch.testing.assert_close(c_first, torch.clamp(input_mean * 3.0, 0, 1).view(2, 1, 1, 1)
                               .expand_as(u), rtol=0, atol=1e-6)


def test_given_contrast_mean_is_used_as_is():
    chw = random_images(2, 4, 4, 3, seed=7).permute(0, 3, 1, 2).contiguous()
    got = reference.epilogue(chw, out_dtype=torch.float32, contrast=torch.zeros(2),
                             contrast_mean=torch.tensor([0.25, 0.75]))
    want = torch.tensor([0.25, 0.75]).view(2, 1, 1, 1).expand_as(got)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)


def test_one_channel_saturation_and_hue_are_no_ops_like_torchvision():
    chw = random_images(3, 5, 4, 1, seed=8).permute(0, 3, 1, 2).contiguous()
    factors = _factors(3, seed=9)
    perms = [PERMS[5], PERMS[11], PERMS[17]]
    got = _ours(chw, perms, factors)
    torch.testing.assert_close(got, _tv_batch(chw, perms, factors), rtol=0, atol=2e-6)
    only_bc = {k: v for k, v in factors.items() if k in ("brightness", "contrast")}
    torch.testing.assert_close(got, _ours(chw, perms, only_bc), rtol=0, atol=0)


def test_epilogue_normalises_casts_and_writes_into_out():
    chw = random_images(5, 6, 7, 3, seed=10).permute(0, 3, 1, 2).contiguous()
    factors = _factors(5, seed=11)
    perms = PERMS[:5]
    u = _ours(chw, perms, factors)
    out = torch.empty((5, 3, 6, 7), dtype=torch.float16)
    got = _ours(chw, perms, factors, mean=MEAN, std=STD, out_dtype=torch.float16, out=out)
    assert got is out
    want = (u - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    torch.testing.assert_close(got.float(), want, rtol=0, atol=2**-9)
    u8 = _ours(chw, perms, factors, out_dtype=torch.uint8)
    assert u8.dtype == torch.uint8
    assert (u8.int() - torch.floor(u * 255 + 0.5).int()).abs().max() <= 1
    plain = reference.epilogue(chw, out_dtype=torch.uint8)
    assert torch.equal(plain, chw)  # no jitter, uint8: an exact copy


def test_epilogue_equals_crop_reference_of_the_whole_image():
    images = random_images(4, 5, 6, 3, seed=12)
    factors = _factors(4, seed=13)
    order = encode_order(torch.tensor(PERMS[7:11]))
    zeros = torch.zeros(4, dtype=torch.int64)
    via_crop = reference.crop_flip_permute(images, zeros, zeros, 5, 6, False, False, mean=MEAN,
                                           std=STD, out_dtype=torch.float32, order=order,
                                           **factors)
    direct = reference.epilogue(images.permute(0, 3, 1, 2).contiguous(), mean=MEAN, std=STD,
                                out_dtype=torch.float32, order=order, **factors)
    assert torch.equal(via_crop, direct)


# --- kernels (Triton interpreter) vs reference ---------------------------------------

@pytest.mark.usefixtures("triton_interpret")
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_crop_kernel_every_order_matches_reference(dtype):
    n = 24
    images = random_images(n, 9, 13, 3, seed=14)
    g = torch.Generator().manual_seed(15)
    top = torch.randint(0, 3, (n,), generator=g)
    left = torch.randint(0, 4, (n,), generator=g)
    fh = torch.rand(n, generator=g) < 0.5
    kw = dict(order=encode_order(torch.tensor(PERMS)), out_dtype=dtype, **_factors(n, seed=16))
    if dtype != torch.uint8:
        kw.update(mean=MEAN, std=STD)
    out = crop_flip_permute(images, top, left, 7, 10, fh, False, **kw)
    ref = reference.crop_flip_permute(images, top, left, 7, 10, fh, False, **kw)
    _close(out, ref, dtype)


@pytest.mark.usefixtures("triton_interpret")
@pytest.mark.parametrize("antialias", [False, True])
def test_resize_kernel_jitter_matches_reference(antialias):
    n = 6
    images = random_images(n, 23, 37, 3, seed=17)  # several 32x32 tiles: partial sums
    boxes = torch.tensor([[0, 0, 23, 37], [2, 3, 15, 20], [5, 1, 9, 30], [0, 10, 23, 27],
                          [1, 1, 1, 1], [3, 4, 18, 33]])
    kw = dict(order=encode_order(torch.tensor(PERMS[::4])), antialias=antialias,
              out_dtype=torch.float32, mean=MEAN, std=STD, **_factors(n, seed=18))
    out = resized_crop(images, boxes, (33, 40), True, False, **kw)
    ref = reference.resized_crop(images, boxes, (33, 40), True, False, **kw)
    _close(out, ref, torch.float32)


@pytest.mark.usefixtures("triton_interpret")
def test_kernel_each_op_alone_and_given_mean():
    images = random_images(4, 6, 5, 3, seed=19)
    zeros = torch.zeros(4, dtype=torch.int64)
    for op in ("brightness", "contrast", "saturation", "hue"):
        kw = dict(out_dtype=torch.float32, **_factors(4, seed=20, ops=(op,)))
        out = crop_flip_permute(images, zeros, zeros, 6, 5, True, True, **kw)
        ref = reference.crop_flip_permute(images, zeros, zeros, 6, 5, True, True, **kw)
        _close(out, ref, torch.float32)
    kw = dict(out_dtype=torch.float32, contrast=torch.tensor([0.0, 0.5, 1.0, 2.0]),
              contrast_mean=torch.tensor([0.1, 0.2, 0.3, 0.4]))
    out = crop_flip_permute(images, zeros, zeros, 6, 5, False, False, **kw)
    _close(out, reference.crop_flip_permute(images, zeros, zeros, 6, 5, False, False, **kw),
           torch.float32)
    torch.testing.assert_close(out[0], torch.full_like(out[0], 0.1), rtol=0, atol=1e-6)


@pytest.mark.usefixtures("triton_interpret")
def test_kernel_odd_shapes_and_other_channel_counts():
    for n, h, w, c, oh, ow in ((1, 1, 1, 3, 1, 1), (2, 40, 3, 1, 33, 2), (3, 5, 70, 4, 4, 65)):
        images = random_images(n, h, w, c, seed=h * w)
        ops = ("brightness", "contrast") if c != 3 else ("brightness", "contrast", "hue")
        kw = dict(out_dtype=torch.float32, **_factors(n, seed=c, ops=ops))
        boxes = torch.tensor([[0, 0, h, w]] * n)
        out = resized_crop(images, boxes, (oh, ow), False, True, antialias=True, **kw)
        _close(out, reference.resized_crop(images, boxes, (oh, ow), False, True,
                                           antialias=True, **kw), torch.float32)


def _close(out, ref, dtype):
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
    if dtype == torch.uint8:
        diff = (out.int() - ref.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() <= 0.02
    else:
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_order_as_permutations_equals_order_codes():
    """``order`` also takes the (N, 4) permutations (torchvision's fn_idx per sample)."""
    chw = random_images(24, 5, 6, 3, seed=21).permute(0, 3, 1, 2).contiguous()
    factors = _factors(24, seed=22)
    perms = torch.tensor(PERMS, dtype=torch.int8)
    by_perm = reference.epilogue(chw, out_dtype=torch.float32, order=perms, **factors)
    torch.testing.assert_close(by_perm, _ours(chw, PERMS, factors), rtol=0, atol=0)
    for bad in ([0, 1, 2, 5], [0, 0, 1, 2], [-1, 1, 2, 3]):
        perms[3] = torch.tensor(bad, dtype=torch.int8)
        with pytest.raises(ValueError, match=r"^epilogue: order\[3\] = -?\d+ is not an order"):
            reference.epilogue(chw, out_dtype=torch.float32, order=perms, **factors)
    with pytest.raises(ValueError, match=r"order must have shape \(24,\) \(codes\) or "
                                         r"\(24, 4\)"):
        reference.epilogue(chw, out_dtype=torch.float32, order=perms[:, :3], **factors)


# --- the contrast-mean pass (launch.contrast_means) -------------------------------------

def test_contrast_statistics_pass_runs_only_for_contrast_without_a_given_mean():
    """The statistics pass reads every pixel once more: it runs only when contrast is on and
    the caller gave no means; its partial sums (tile order) become per-sample means."""
    from dlpack_io.kernels.colour import BRIGHTNESS, CONTRAST
    from dlpack_io.kernels.epilogue import Epilogue
    from dlpack_io.kernels.launch import contrast_means

    launched = []

    def run_stats(partials):  # what the kernel's statistics mode stores: one sum per tile
        launched.append(partials.numel())
        partials.copy_(torch.arange(1.0, partials.numel() + 1))

    one = torch.ones(3)
    kw = dict(n=2, tiles=3, pixels=4, channels=3, run_stats=run_stats)
    assert contrast_means(Epilogue(torch.float32, one, one, ops=0), **kw) is None
    assert contrast_means(Epilogue(torch.float32, one, one, ops=BRIGHTNESS), **kw) is None
    given = torch.tensor([0.25, 0.5])
    assert contrast_means(Epilogue(torch.float32, one, one, CONTRAST, given), **kw) is given
    assert launched == []
    means = contrast_means(Epilogue(torch.float32, one, one, ops=CONTRAST | BRIGHTNESS), **kw)
    assert launched == [6] and means.tolist() == [(1 + 2 + 3) / 4, (4 + 5 + 6) / 4]
    grey = contrast_means(Epilogue(torch.float32, one, one, ops=CONTRAST), **dict(kw, channels=1))
    assert grey.tolist() == [6 / 4, 15 / 4]  # one channel: over pixels x channels = 4
    two = contrast_means(Epilogue(torch.float32, one, one, ops=CONTRAST), **dict(kw, channels=2))
    assert two.tolist() == [6 / 8, 15 / 8]
