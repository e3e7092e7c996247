"""Crop box sampling against a plain torchvision-style reference; CPU pixel semantics."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dlpack_io.reader import (CenterCrop, Dataset, Normalize, Output, RandomCrop,
                              RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip)
from dlpack_io.reader.batch.plan import Draws, uniforms

# the ops' own random streams (fixed forever: a sample keeps its draws)
STREAM_CROP = RandomResizedCrop.stream
from dlpack_io.reader.batch.plan import compile_spec
from dlpack_io.reader.transforms.geometry import TransformError


def sample_params(crop, flip_h, flip_v, seed, epoch, indices, heights, widths):
    """The parameters the Loader draws for ``[crop, hflip(flip_h), vflip(flip_v)]``."""
    spec = compile_spec(([crop] if crop is not None else []) +
                        [RandomHorizontalFlip(flip_h), RandomVerticalFlip(flip_v)])
    return spec.draw(seed, epoch, indices, heights, widths)

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def _packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("transforms"), 40, 4, seed=1,
                             shard_size="60KB")


@pytest.fixture
def raw_dataset(_packed):
    return _packed["raw"]


@pytest.fixture
def jpeg_dataset(_packed):
    return _packed["jpeg"]


def _reference_rrc(h, w, u, scale, ratio):
    """torchvision.transforms.RandomResizedCrop.get_params, fed our uniforms."""
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for a in range(10):
        target = area * (scale[0] + u[4 * a] * (scale[1] - scale[0]))
        aspect = math.exp(log_ratio[0] + u[4 * a + 1] * (log_ratio[1] - log_ratio[0]))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return int(u[4 * a + 2] * (h - ch + 1)), int(u[4 * a + 3] * (w - cw + 1)), ch, cw
    in_ratio = w / h
    if in_ratio < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        ch, cw = h, int(round(h * max(ratio)))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 1.0), (0.2, 5.0)),
                                         ((0.9, 1.0), (5.0, 9.0))])  # last: mostly fallback
def test_random_resized_crop_matches_torchvision_algorithm(scale, ratio):
    crop = RandomResizedCrop(32, scale=scale, ratio=ratio)
    gen = np.random.default_rng(0)
    hs, ws = gen.integers(8, 400, 300), gen.integers(8, 400, 300)
    idx = np.arange(1000, 1300)
    boxes = crop.boxes(hs, ws, Draws(4, 1), idx)
    u = uniforms(4, 1, STREAM_CROP, idx, 40)
    for k in range(len(idx)):
        assert tuple(boxes[k]) == _reference_rrc(int(hs[k]), int(ws[k]), u[k], scale, ratio)
    top, left, bh, bw = boxes.T
    assert np.all((top >= 0) & (left >= 0) & (bh >= 1) & (bw >= 1))
    assert np.all((top + bh <= hs) & (left + bw <= ws))


def test_random_and_center_crop_boxes():
    hs, ws = np.array([40, 41, 100]), np.array([40, 64, 33])
    boxes = RandomCrop((20, 30)).boxes(hs, ws, Draws(0, 0), np.arange(3))
    assert np.all(boxes[:, 2] == 20) and np.all(boxes[:, 3] == 30)
    assert np.all(boxes[:, 0] + 20 <= hs) and np.all(boxes[:, 1] + 30 <= ws)
    center = CenterCrop(21).boxes(hs, ws, Draws(0, 0), np.arange(3))
    for (t, l, h, w), H, W in zip(center, hs, ws):  # torchvision: int(round((H - h) / 2))
        assert (t, l, h, w) == (int(round((H - 21) / 2.0)), int(round((W - 21) / 2.0)), 21, 21)
    with pytest.raises(TransformError, match="only 40x40"):
        RandomCrop(41).boxes(hs, ws, Draws(0, 0), np.arange(3))


def test_flip_probabilities_and_purity():
    idx = np.arange(4000)
    hs = ws = np.full(4000, 50)
    never = sample_params(None, 0.0, 1.0, 0, 0, idx, hs, ws)
    assert not never.flip_h.any() and never.flip_v.all()
    half = sample_params(RandomCrop(10), 0.5, 0.25, 0, 0, idx, hs, ws)
    assert abs(half.flip_h.mean() - 0.5) < 0.03 and abs(half.flip_v.mean() - 0.25) < 0.03
    again = sample_params(RandomCrop(10), 0.5, 0.25, 0, 0, idx[::-1], hs, ws)
    assert np.array_equal(again.boxes[::-1], half.boxes)  # per sample, not per position
    assert np.array_equal(again.flip_h[::-1], half.flip_h)


def test_normalize_matches_formula():
    from dlpack_io.kernels import reference

    u8 = torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = reference.epilogue(u8, mean=mean, std=std, out_dtype=torch.float32)
    ref = (u8.double() / 255 - torch.tensor(mean).double().view(1, 3, 1, 1)) / \
        torch.tensor(std).double().view(1, 3, 1, 1)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    half = reference.epilogue(u8, mean=mean, std=std, out_dtype=torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half, out.half())
    plain = reference.epilogue(u8, out_dtype=torch.float32)
    assert torch.allclose(plain, u8.float() / 255)
    assert Normalize(mean, std).mean == mean


def _loader_batches(path, crop, flip_h=0.0, flip_v=0.0, **kw):
    from dlpack_io.reader import Loader

    ds = Dataset(path)
    loader = Loader(ds, batch_size=16, num_workers=0, drop_last=False,
                    output=Output(return_index=True), seed=9, transforms=[crop,
                    RandomHorizontalFlip(flip_h),
                                        RandomVerticalFlip(flip_v)], **kw)
    return ds, [(x.clone(), y, i) for x, y, i in loader]


def test_cpu_random_crop_flip_is_exact(raw_dataset):
    ds, batches = _loader_batches(raw_dataset, RandomCrop(24), flip_h=0.5, flip_v=0.5)
    for images, labels, idx in batches:
        params = sample_params(RandomCrop(24), 0.5, 0.5, 9, 0, idx, [40] * len(idx), [40] * len(idx))
        for k, i in enumerate(idx):
            pixels, label = ds[int(i)]
            t, l, h, w = params.boxes[k]
            ref = pixels[t:t + h, l:l + w]
            ref = ref[:, ::-1] if params.flip_h[k] else ref
            ref = ref[::-1] if params.flip_v[k] else ref
            assert np.array_equal(images[k].numpy(), ref.transpose(2, 0, 1))
            assert labels[k] == label


@pytest.mark.parametrize("which,reduced,tol", [("raw", True, 0.3), ("jpeg", False, 0.3),
                                               ("jpeg", True, 3.0)])
def test_cpu_resized_crop_matches_torch_antialias(which, reduced, tol, raw_dataset, jpeg_dataset):
    path = raw_dataset if which == "raw" else jpeg_dataset
    crop = RandomResizedCrop(20)
    ds, batches = _loader_batches(path, crop, flip_h=0.5, reduced_decode=reduced)
    diffs = []
    for images, _, idx in batches:
        _, _, entries = ds.lookup(idx)
        params = sample_params(crop, 0.5, 0.0, 9, 0, idx, entries["height"], entries["width"])
        for k, i in enumerate(idx):
            t, l, h, w = params.boxes[k]
            box = torch.from_numpy(ds[int(i)][0][t:t + h, l:l + w].copy()).permute(2, 0, 1)
            ref = F.interpolate(box[None].float(), size=(20, 20), mode="bilinear",
                                align_corners=False, antialias=True)[0]
            ref = ref.flip(2) if params.flip_h[k] else ref
            d = (images[k].float() - ref.round().clamp(0, 255)).abs()
            diffs.append(d.mean().item())
            if not reduced or which == "raw":
                assert d.max() <= 1.0  # PIL fixed point vs float: off by one at most
    print(which, reduced, "mean abs diff vs torch antialias reference", np.mean(diffs))
    assert np.mean(diffs) <= tol
