"""interpolation / antialias, RandomErasing, MixUp / CutMix against plain PIL / numpy versions
of torchvision's definitions (torchvision itself does not install beside the CPU torch)."""
import math
from importlib import metadata

import numpy as np
import pytest
import torch
from PIL import Image

from dlpack_io.reader import (CenterCrop, Dataset, Loader, Normalize, Output, RandomCrop,
                              RandomResizedCrop, Resize, Workers)
from dlpack_io.reader.batch.plan import Draws, uniforms
from dlpack_io.reader.batch.plan import compile_spec
from dlpack_io.reader.transforms import CutMix, MixUp, RandomErasing

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("recipes"), 24, 3, seed=4,
                             shard_size="60KB")


# ---- plain references of torchvision's definitions --------------------------------------
def _weights_plain(in_size, out_size, cubic):
    """torch interpolate(align_corners=False, antialias=False) along one axis: (out, in)."""
    scale = in_size / out_size
    mat = np.zeros((out_size, in_size))
    for d in range(out_size):
        src = (d + 0.5) * scale - 0.5
        if not cubic:
            src = max(src, 0.0)
            i0 = int(math.floor(src))
            i1, t = min(i0 + 1, in_size - 1), src - i0
            mat[d, i0] += 1 - t
            mat[d, i1] += t
        else:
            i0, t, a = int(math.floor(src)), src - math.floor(src), -0.75
            for k, x in zip(range(-1, 3), (1 + t, t, 1 - t, 2 - t)):
                w = ((a + 2) * x - (a + 3)) * x * x + 1 if x <= 1 else \
                    ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
                mat[d, min(max(i0 + k, 0), in_size - 1)] += w
    return mat


def plain_resize(hwc, out_h, out_w, cubic=False):
    """(oh, ow, 3) float64 of torch's non-antialiased bilinear / bicubic resize."""
    wy, wx = _weights_plain(hwc.shape[0], out_h, cubic), _weights_plain(hwc.shape[1], out_w, cubic)
    return np.einsum("yi,ijc,xj->yxc", wy, hwc.astype(np.float64), wx)


def pil_crop_resize(hwc, box, size, resample):
    """torchvision's PIL path: img.crop(box).resize(size, filter)."""
    t, l, h, w = (int(v) for v in box)
    img = Image.fromarray(np.ascontiguousarray(hwc)).crop((l, t, l + w, t + h))
    return np.asarray(img.resize((size[1], size[0]), resample))


def _run(path, transforms, **kw):
    ds = Dataset(path)
    loader = Loader(ds, batch_size=8, num_workers=0, seed=3, output=Output(return_index=True),
                    transforms=transforms, **kw)
    return ds, [(x.clone(), y.clone(), i) for x, y, i in loader]


def _boxes(ds, spec, idx):
    _, _, entries = ds.lookup(idx)
    return spec.draw(3, 0, idx, entries["height"], entries["width"]).boxes


# ---- interpolation / antialias -----------------------------------------------------------
def _bilinear_tolerance() -> int:
    """Grey levels between our bilinear (the C extension: plain Pillow 13's arithmetic) and
    the PIL installed: 0 for plain Pillow >= 13, up to 2 for Pillow-SIMD / Pillow <= 12."""
    try:
        metadata.version("pillow-simd")
        return 2
    except metadata.PackageNotFoundError:
        return 0 if int(Image.__version__.split(".")[0]) >= 13 else 2


@pytest.mark.parametrize("mode,pil", [("bicubic", Image.BICUBIC), ("nearest", Image.NEAREST),
                                      ("bilinear", Image.BILINEAR)])
def test_antialiased_modes_equal_torchvision_pil_path(packed, mode, pil):
    crop = RandomResizedCrop(17, interpolation=mode)
    ds, batches = _run(packed["raw"], [crop])
    spec = compile_spec([crop])
    tolerance = _bilinear_tolerance() if mode == "bilinear" else 0  # PIL does the others
    for images, _, idx in batches:
        for k, (i, box) in enumerate(zip(idx, _boxes(ds, spec, idx))):
            ref = pil_crop_resize(ds[int(i)][0], box, (17, 17), pil)
            diff = np.abs(images[k].permute(1, 2, 0).numpy().astype(int) - ref)
            assert diff.max() <= tolerance, (mode, int(i), diff.max())


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_plain_interpolation_equals_torch_definition(packed, mode):
    crop = RandomResizedCrop(13, interpolation=mode, antialias=False)
    ds, batches = _run(packed["raw"], [crop])
    spec = compile_spec([crop])
    assert spec.reduced_decode is False  # the DCT downscale would be a low-pass filter
    for images, _, idx in batches:
        for k, (i, (t, l, h, w)) in enumerate(zip(idx, _boxes(ds, spec, idx))):
            ref = plain_resize(ds[int(i)][0][t:t + h, l:l + w], 13, 13, mode == "bicubic")
            ref = np.clip(np.rint(ref), 0, 255)
            got = images[k].permute(1, 2, 0).numpy().astype(np.float64)
            assert np.abs(got - ref).max() <= 1.0, (mode, int(i))
            assert np.mean(got == ref) > 0.9  # the rest: ties (x.5) rounded after fp noise


def test_plain_resize_then_crop_equals_resizing_the_whole_image(packed):
    ds, batches = _run(packed["raw"], [Resize(29, antialias=False), CenterCrop(21)])
    for images, _, idx in batches:
        for k, i in enumerate(idx):
            whole = np.clip(np.rint(plain_resize(ds[int(i)][0], 29, 29)), 0, 255)
            t = l = int(round((29 - 21) / 2))
            got = images[k].permute(1, 2, 0).numpy().astype(np.float64)
            assert np.abs(got - whole[t:t + 21, l:l + 21]).max() <= 1.0


@pytest.mark.parametrize("which", ["raw", "jpeg"])
def test_plain_bilinear_host_and_device_paths_agree(packed, which):
    tr = [RandomResizedCrop(15, antialias=False)]
    _, host = _run(packed[which], tr)
    _, dev = _run(packed[which], tr, device_transforms=True)
    for (a, la, ia), (b, lb, ib) in zip(host, dev, strict=True):
        assert np.array_equal(ia, ib) and torch.equal(la, lb)
        assert (a.int() - b.int()).abs().max() <= 1


def test_kernel_lacks_bicubic_so_host_transforms_or_a_clear_error(packed):
    ds = Dataset(packed["raw"])
    tr = [RandomResizedCrop(15, interpolation="bicubic")]
    with pytest.raises(ValueError, match="interpolation='bicubic'.*device_transforms=None"):
        Loader(ds, transforms=tr, workers=Workers(device_transforms=True))
    assert Loader(ds, transforms=[RandomResizedCrop(15)],
                  workers=Workers(device_transforms=True)).device_transforms


def test_interpolation_arguments_checked():
    with pytest.raises(ValueError, match="interpolation 'lanczos'.*bilinear"):
        RandomResizedCrop(8, interpolation="lanczos")
    with pytest.raises(TypeError, match="antialias='yes'"):
        Resize(8, antialias="yes")

    class Mode:  # torchvision's InterpolationMode carries the name in .value
        value = "bicubic"
    assert Resize(8, interpolation=Mode()).interpolation == "bicubic"
    assert Resize(8, antialias=None).antialias is True


# ---- RandomErasing -----------------------------------------------------------------------
def erasing_reference(p, scale, ratio, img_h, img_w, u):
    """torchvision's RandomErasing.get_params driven by the given uniforms (one row)."""
    if not u[0] < p:
        return None
    for t in range(10):
        a, r, ut, ul = u[1 + 4 * t:5 + 4 * t]
        erase_area = img_h * img_w * (scale[0] + a * (scale[1] - scale[0]))
        aspect = math.exp(math.log(ratio[0]) + r * (math.log(ratio[1]) - math.log(ratio[0])))
        h = int(round(math.sqrt(erase_area * aspect)))
        w = int(round(math.sqrt(erase_area / aspect)))
        if not (h < img_h and w < img_w):
            continue
        return int(ut * (img_h - h + 1)), int(ul * (img_w - w + 1)), h, w
    return None


def test_erasing_boxes_follow_torchvision():
    er = RandomErasing(p=0.7, scale=(0.02, 0.6), ratio=(0.3, 3.3))
    idx = np.arange(300)
    boxes = er.boxes(Draws(5, 2), idx, (20, 24))
    u = uniforms(5, 2, RandomErasing.stream, idx, 41)
    erased = 0
    for k in idx:
        ref = erasing_reference(0.7, (0.02, 0.6), (0.3, 3.3), 20, 24, u[k])
        assert tuple(boxes[k]) == (ref if ref is not None else (0, 0, 0, 0))
        erased += ref is not None
    assert 150 < erased < 230
    assert np.array_equal(boxes, er.boxes(Draws(5, 2), idx, (20, 24)))
    assert not np.array_equal(boxes, er.boxes(Draws(5, 3), idx, (20, 24)))


@pytest.mark.parametrize("value", [0, (1.0, -2.0, 0.5), "random"])
def test_erasing_after_normalize_same_on_both_paths(packed, value):
    tr = [RandomCrop(16), Normalize(), RandomErasing(p=0.8, value=value)]  # exact geometry
    plain = [RandomCrop(16), Normalize()]
    ds, host = _run(packed["raw"], tr)
    _, dev = _run(packed["raw"], tr, device_transforms=True)
    _, before = _run(packed["raw"], plain)
    er = tr[-1]
    for (a, _, idx), (b, _, _), (c, _, _) in zip(host, dev, before, strict=True):
        assert torch.equal(a, b)  # the same function on the same rows: exact
        boxes = er.boxes(Draws(3, 0), idx, (16, 16))
        for k, (t, l, h, w) in enumerate(boxes):
            mask = torch.zeros(16, 16, dtype=torch.bool)
            mask[t:t + h, l:l + w] = True
            assert torch.equal(a[k][:, ~mask], c[k][:, ~mask])  # outside: untouched
            if h and value != "random":
                fill = torch.tensor(er.value, dtype=torch.float32).expand(3).view(3, 1)
                assert torch.equal(a[k][:, mask], fill.expand(3, int(mask.sum())))
            elif h:
                noise = a[k][:, mask]
                assert abs(float(noise.mean())) < 0.5 and 0.5 < float(noise.std()) < 1.5


def test_erasing_arguments_checked():
    with pytest.raises(ValueError, match=r"RandomErasing\(p=2"):
        RandomErasing(p=2)
    with pytest.raises(ValueError, match="value 'noise'"):
        RandomErasing(value="noise")
    with pytest.raises(ValueError, match="transforms must come in this order"):
        compile_spec([RandomErasing(), Normalize()])


# ---- MixUp / CutMix ----------------------------------------------------------------------
def test_beta_draws_have_the_beta_moments():
    from dlpack_io.reader.transforms.mixing import beta

    for alpha in (0.2, 1.0, 3.0):
        u = uniforms(1, 0, MixUp.stream, np.arange(4000), 2 * 97)
        lams = np.array([beta(alpha, row) for row in u])
        assert np.all((lams >= 0) & (lams <= 1))
        var = 1.0 / (4 * (2 * alpha + 1))  # Beta(a, a): mean 1/2, variance 1/(4(2a+1))
        assert abs(lams.mean() - 0.5) < 0.03 and abs(lams.var() - var) < 0.15 * var


def _mix_reference(images, labels, num_classes, chosen, lam, centre):
    """torchvision.transforms.v2 MixUp / CutMix._transform with the given draws."""
    onehot = np.eye(num_classes, dtype=np.float32)[labels]
    rolled, rolled_y = np.roll(images, 1, 0), np.roll(onehot, 1, 0)
    if isinstance(chosen, MixUp):
        out = rolled * (1.0 - lam) + images * lam
    else:
        H, W = images.shape[-2:]
        r_x, r_y = int(centre[1] * W), int(centre[0] * H)
        r = 0.5 * math.sqrt(1.0 - lam)
        x1, y1 = max(r_x - int(r * W), 0), max(r_y - int(r * H), 0)
        x2, y2 = min(r_x + int(r * W), W), min(r_y + int(r * H), H)
        out = images.copy()
        out[..., y1:y2, x1:x2] = rolled[..., y1:y2, x1:x2]
        lam = 1.0 - (x2 - x1) * (y2 - y1) / (W * H)
    return out, rolled_y * (1.0 - lam) + onehot * lam


@pytest.mark.parametrize("mixes", [[MixUp(0.2)], [CutMix(1.0)], [MixUp(0.2), CutMix(1.0)]])
def test_mixing_matches_torchvision_and_is_pure(packed, mixes):
    from dlpack_io.reader.transforms.mixing import draw

    base = [RandomCrop(12), Normalize()]  # exact on both paths: the mix must be too
    ds, plain = _run(packed["raw"], base)
    _, mixed = _run(packed["raw"], base + mixes)
    _, again = _run(packed["raw"], base + mixes, device_transforms=True)
    kinds = set()
    for (x, y, idx), (mx, my, _), (ax, ay, _) in zip(plain, mixed, again, strict=True):
        chosen, lam, centre = draw(tuple(mixes), Draws(3, 0), int(idx[0]))
        kinds.add(type(chosen))
        ref_x, ref_y = _mix_reference(x.numpy(), y.numpy(), 3, chosen, lam, centre)
        assert my.shape == (len(idx), 3) and my.dtype == torch.float32
        assert np.allclose(mx.numpy(), ref_x, atol=1e-6) and np.allclose(my.numpy(), ref_y)
        assert torch.allclose(my.sum(1), torch.ones(len(idx)))
        assert torch.equal(mx, ax) and torch.equal(my, ay)
    assert len(kinds) == len(mixes) or len(plain) < 4


def test_mixing_refusals(packed):
    ds = Dataset(packed["raw"])
    with pytest.raises(TypeError, match="MixUp blends pixels: it needs a float dtype"):
        next(iter(Loader(ds, batch_size=4, num_workers=0, transforms=[
            RandomResizedCrop(8), MixUp(1.0)])))
    with pytest.raises(ValueError, match="outside num_classes=2"):
        next(iter(Loader(ds, batch_size=24, num_workers=0, transforms=[
            RandomResizedCrop(8), CutMix(1.0, num_classes=2)])))
    with pytest.raises(ValueError, match="alpha=0.0 must be a positive"):
        MixUp(0.0)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("shape,out", [((37, 53), (16, 20)), ((9, 7), (24, 31)), ((30, 30), (30, 30))])
def test_interpolate_box_is_torchs_interpolate(mode, shape, out):
    import torch.nn.functional as F

    from dlpack_io.reader.resample import interpolate_box

    img = np.random.RandomState(sum(shape)).randint(0, 256, (*shape, 3)).astype(np.uint8)
    got = interpolate_box(img, (0, 0, shape[1], shape[0]), out, mode).astype(float)
    ref = F.interpolate(torch.from_numpy(img).permute(2, 0, 1)[None].double(), size=out,
                        mode=mode, align_corners=False, antialias=False)[0]
    ref = ref.round().clamp(0, 255).permute(1, 2, 0).numpy()
    assert np.abs(got - ref).max() <= 1 and np.mean(got == ref) > 0.99
    ref2 = np.clip(plain_resize(img, *out, cubic=mode == "bicubic"), 0, 255)  # cubic overshoots
    assert np.abs(got - ref2).max() <= 0.5 + 1e-9


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (docs/gpu.md)")
@pytest.mark.parametrize("device_transforms", [None, False])
def test_cuda_erasing_and_mixing_happen_on_the_device_and_match_the_cpu(packed,
                                                                       device_transforms):
    tr = [RandomCrop(16), Normalize(), RandomErasing(p=0.8, value="random"), MixUp(0.2),
          CutMix(1.0)]
    _, cpu = _run(packed["raw"], tr)
    _, gpu = _run(packed["raw"], tr, device="cuda", device_transforms=device_transforms)
    for (a, la, ia), (b, lb, ib) in zip(cpu, gpu, strict=True):
        assert b.is_cuda and lb.is_cuda and lb.dtype == torch.float32
        assert np.array_equal(ia, ib.cpu().numpy() if torch.is_tensor(ib) else ib)
        assert torch.allclose(a, b.cpu(), atol=1e-6) and torch.allclose(la, lb.cpu())
