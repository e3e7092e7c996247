"""AutoAugment / RandAugment / TrivialAugmentWide: each op against a plain numpy version of
what torchvision's PIL path computes, the op tables against torchvision's, and the Loader's
output against the drawn ops applied by hand."""
import math

import numpy as np
import pytest
from PIL import Image

from dlpack_io.reader import (AutoAugment, Dataset, Loader, Output, RandAugment, RandomCrop,
                              RandomHorizontalFlip, TrivialAugmentWide, Workers)
from dlpack_io.reader.batch.plan import Draws, uniforms
from dlpack_io.reader.transforms.autoaugment import apply_op
from dlpack_io.reader.transforms.autoaugment import space
from dlpack_io.reader.batch.plan import compile_spec

from helpers import pack_jpeg_and_raw

RNG = np.random.RandomState(7)
IMG = RNG.randint(0, 256, (23, 31, 3)).astype(np.uint8)
IMG[:5] = 200  # some flat area: ties and a non-uniform histogram


def _run_op(name, mag, fill=(0, 0, 0)):
    return np.asarray(apply_op(Image.fromarray(IMG), name, mag, Image.NEAREST, fill))


# ---- numpy references -------------------------------------------------------------------
def _fix(v):
    """Pillow's FIX: 16.16 fixed point, rounded."""
    v = v * 65536.0 + 0.5
    return int(math.floor(v)) if v < 0 else int(v)


def warp_nearest(img, m, fill):
    """Pillow's AFFINE transform, NEAREST: output pixel (x, y) reads the input at m applied
    to its centre, in 16.16 fixed point (Pillow's fast path for shears and rotations:
    integer steps per column and row, then >> 16); pure translations (m[1] = m[3] = 0) in
    floating point. Outside the image: fill."""
    h, w = img.shape[:2]
    out = np.empty_like(img)
    out[:] = np.array(fill, np.uint8)
    if m[1] == 0 and m[3] == 0:
        y, x = np.mgrid[0:h, 0:w] + 0.5
        xin, yin = np.floor(m[0] * x + m[2]), np.floor(m[4] * y + m[5])
        inside = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
        out[inside] = img[yin[inside].astype(int), xin[inside].astype(int)]
        return out
    a0, a1, a3, a4 = _fix(m[0]), _fix(m[1]), _fix(m[3]), _fix(m[4])
    xo, yo = _fix(m[2] + m[1] * 0.5 + m[0] * 0.5), _fix(m[5] + m[4] * 0.5 + m[3] * 0.5)
    for y in range(h):
        xx, yy = xo, yo
        for x in range(w):
            xin, yin = xx >> 16, yy >> 16
            if 0 <= xin < w and 0 <= yin < h:
                out[y, x] = img[yin, xin]
            xx, yy = xx + a0, yy + a3
        xo, yo = xo + a1, yo + a4
    return out


def rotate_matrix(angle, w, h):
    a = -math.radians(angle)
    m = [round(math.cos(a), 15), round(math.sin(a), 15), 0.0,
         round(-math.sin(a), 15), round(math.cos(a), 15), 0.0]
    cx, cy = w / 2.0, h / 2.0
    m[2], m[5] = m[0] * -cx + m[1] * -cy + m[2] + cx, m[3] * -cx + m[4] * -cy + m[5] + cy
    return m


def blend(degenerate, img, f):
    """PIL's Image.blend in float32, truncated (interpolation) or clipped (extrapolation)."""
    diff = (img.astype(np.int32) - degenerate.astype(np.int32)).astype(np.float32)
    t = degenerate.astype(np.float32) + np.float32(f) * diff  # float32 throughout, as in C
    return np.clip(t, 0, 255).astype(np.uint8)


def luma(img):
    r, g, b = (img[..., k].astype(np.int64) for k in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)


def equalize(img):
    out = np.empty_like(img)
    for c in range(3):
        h = np.bincount(img[..., c].ravel(), minlength=256)
        nz = h[h > 0]
        step = (nz.sum() - nz[-1]) // 255 if len(nz) > 1 else 0
        if not step:
            out[..., c] = img[..., c]
            continue
        lut = (step // 2 + np.concatenate([[0], np.cumsum(h)[:-1]])) // step
        out[..., c] = np.clip(lut, 0, 255)[img[..., c]]
    return out


def autocontrast(img):
    out = img.copy()
    for c in range(3):
        lo, hi = int(img[..., c].min()), int(img[..., c].max())
        if hi > lo:
            scale = 255.0 / (hi - lo)
            lut = np.clip([int(i * scale - lo * scale) for i in range(256)], 0, 255)
            out[..., c] = np.asarray(lut, np.uint8)[img[..., c]]
    return out


def smooth(img):
    """PIL's ImageFilter.SMOOTH (1 1 1 / 1 5 1 / 1 1 1, / 13), border pixels kept."""
    k = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / np.float32(13)
    f = img.astype(np.float32)
    out = img.copy()
    acc = sum(k[dy, dx] * f[dy:dy + img.shape[0] - 2, dx:dx + img.shape[1] - 2]
              for dy in range(3) for dx in range(3))
    out[1:-1, 1:-1] = np.clip(np.floor(acc + 0.5), 0, 255)
    return out


REFERENCES = {
    "Identity": lambda m: IMG,
    "Posterize": lambda m: IMG & np.uint8(~(2 ** (8 - int(m)) - 1) & 0xFF),
    "Solarize": lambda m: np.where(IMG < m, IMG, 255 - IMG).astype(np.uint8),
    "Invert": lambda m: 255 - IMG,
    "ShearX": lambda m: warp_nearest(IMG, [1, m, 0, 0, 1, 0], (0, 0, 0)),
    "ShearY": lambda m: warp_nearest(IMG, [1, 0, 0, m, 1, 0], (0, 0, 0)),
    "TranslateX": lambda m: warp_nearest(IMG, [1, 0, -int(m), 0, 1, 0], (0, 0, 0)),
    "TranslateY": lambda m: warp_nearest(IMG, [1, 0, 0, 0, 1, -int(m)], (0, 0, 0)),
    "Rotate": lambda m: warp_nearest(IMG, rotate_matrix(m, 31, 23), (0, 0, 0)),
    "Brightness": lambda m: blend(np.zeros_like(IMG), IMG, 1 + m),
    "Color": lambda m: blend(np.repeat(luma(IMG)[..., None], 3, 2), IMG, 1 + m),
    "Contrast": lambda m: blend(np.full_like(IMG, int(luma(IMG).mean() + 0.5)), IMG, 1 + m),
    "Sharpness": lambda m: blend(smooth(IMG), IMG, 1 + m),
    "AutoContrast": lambda m: autocontrast(IMG),
    "Equalize": lambda m: equalize(IMG),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_each_op_matches_the_numpy_definition(name):
    wide = space(31, 31, 23, wide=True)[name][0] or [0.0]
    narrow = space(10, 31, 23)[name][0] or [0.0]
    tol = 1 if name == "Sharpness" else 0  # float32 ties of PIL's 3x3 filter
    for mag in sorted(set(wide[::5] + narrow[::3])):
        for sign in ((1, -1) if space(31, 31, 23)[name][1] else (1,)):
            got = _run_op(name, sign * mag).astype(int)
            ref = REFERENCES[name](sign * mag).astype(int)
            assert np.abs(got - ref).max() <= tol, (name, sign * mag)


def test_fill_is_used_outside_the_image():
    out = _run_op("TranslateX", 10.0, fill=(1, 2, 3))
    assert np.array_equal(out[:, :10], np.broadcast_to(np.array([1, 2, 3], np.uint8), (23, 10, 3)))


def test_op_tables_are_torchvisions():
    wide, narrow = space(31, 40, 30, wide=True), space(10, 40, 30)
    assert sorted(narrow) == sorted(wide)
    assert np.allclose(wide["ShearX"][0], np.linspace(0, 0.99, 31), atol=1e-6)
    assert np.allclose(wide["Rotate"][0], np.linspace(0, 135, 31), atol=1e-4)
    assert wide["Posterize"][0] == [8 - int(math.floor(k / 5 + 0.5)) for k in range(31)]
    assert narrow["Posterize"][0] == [8, 8, 7, 7, 6, 6, 5, 5, 4, 4]  # round half to even
    assert np.allclose(narrow["TranslateX"][0], np.linspace(0, 150 / 331 * 40, 10), atol=1e-4)
    assert np.allclose(narrow["TranslateY"][0], np.linspace(0, 150 / 331 * 30, 10), atol=1e-4)
    assert np.allclose(narrow["Solarize"][0], np.linspace(255, 0, 10), atol=1e-4)
    assert [narrow[n][1] for n in ("ShearX", "Rotate", "Color", "Posterize", "Solarize")] == \
        [True, True, True, False, False]


def test_draws_follow_torchvisions_forward():
    idx = np.arange(400)
    u = uniforms(2, 1, AutoAugment.stream, idx, 5)
    auto = AutoAugment().draw(Draws(2, 1), idx, (30, 40))
    table = space(10, 40, 30)
    from dlpack_io.reader.transforms.autoaugment import _IMAGENET
    for row, ops in zip(u, auto):
        policy = _IMAGENET[int(row[0] * 25)]
        want = [(n, (-1 if table[n][1] and row[3 + i] < 0.5 else 1) *
                 (0.0 if b is None else table[n][0][b]))
                for i, (n, p, b) in enumerate(policy) if row[1 + i] <= p]
        assert ops == want
    trivial = TrivialAugmentWide().draw(Draws(2, 1), idx, (30, 40))
    names = {ops[0][0] for ops in trivial}
    assert len(names) == 14 and "Invert" not in names  # torchvision's wide space
    ra = RandAugment(num_ops=3, magnitude=5).draw(Draws(2, 1), idx, (30, 40))
    assert all(len(ops) == 3 for ops in ra)
    mags = {abs(m) for ops in ra for n, m in ops if n == "Rotate"}
    assert mags == {space(31, 40, 30)["Rotate"][0][5]}
    assert trivial == TrivialAugmentWide().draw(Draws(2, 1), idx, (30, 40))
    assert trivial != TrivialAugmentWide().draw(Draws(2, 2), idx, (30, 40))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("autoaug"), 16, 2, seed=8,
                             shard_size="60KB")


@pytest.mark.parametrize("aug", [AutoAugment(), RandAugment(), TrivialAugmentWide()])
@pytest.mark.parametrize("worker_kind", ["thread", "process"])
def test_loader_applies_the_drawn_ops_after_crop_and_flip(packed, aug, worker_kind):
    ds = Dataset(packed["raw"])
    tr = [RandomCrop(24), RandomHorizontalFlip(), aug]
    loader = Loader(ds, batch_size=8, num_workers=2, workers=Workers(kind=worker_kind),
                    output=Output(return_index=True), seed=5,
                    transforms=tr)
    spec = compile_spec(tr)
    changed = 0
    for images, _, idx in loader:
        p = spec.draw(5, 0, idx, [40] * len(idx), [40] * len(idx))
        plans = aug.draw(Draws(5, 0), idx, (24, 24))
        for k, i in enumerate(idx):
            t, l, h, w = p.boxes[k]
            crop = ds[int(i)][0][t:t + h, l:l + w]
            crop = np.ascontiguousarray(crop[:, ::-1] if p.flip_h[k] else crop)
            ref = aug.apply(crop, plans[k])
            assert np.array_equal(images[k].permute(1, 2, 0).numpy(), ref)
            changed += not np.array_equal(ref, crop)
    assert changed >= 6


def test_order_and_device_refusals(packed):
    ds = Dataset(packed["raw"])
    with pytest.raises(ValueError, match="goes after the flips and before ColorJitter"):
        compile_spec([RandomCrop(8), TrivialAugmentWide(), RandomHorizontalFlip()])
    with pytest.raises(ValueError, match="TrivialAugmentWide runs per sample on the host"):
        Loader(ds, transforms=[RandomCrop(8), TrivialAugmentWide()],
               workers=Workers(device_transforms=True))
    with pytest.raises(ValueError, match="only the ImageNet policy"):
        AutoAugment(policy="cifar10")
    with pytest.raises(ValueError, match="magnitude=31 in"):
        RandAugment(magnitude=31)
