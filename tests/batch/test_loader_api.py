"""The Loader's user-facing API: transform lists, sample_transform, Resize for evaluation,
subsets, DLPack hand-off, defaults, close(), timeouts."""
import logging
import threading
import time

import numpy as np
import pytest
import torch

from dlpack_io.reader import (CenterCrop, ColorJitter, Dataset, Loader, LoaderTimeout, Normalize,
                              Order, Output, RandomCrop, RandomHorizontalFlip, RandomResizedCrop,
                              RandomVerticalFlip, Resize, SampleError, Workers)
from dlpack_io.reader.batch.plan import compile_spec

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("api"), 40, 4, seed=5, shard_size="60KB")


@pytest.fixture(scope="module")
def small_photos(tmp_path_factory):
    """JPEGs around 140x180 (smaller than a 224 crop), packed as jpeg records."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("small")
    make_image_folder(root / "src", 12, 2, seed=3, size=(140, 180))
    convert(root / "src", root / "ds", workers=1, progress=False)
    return str(root / "ds")


def _epoch(loader):
    return [(x.clone(), y.clone(), i.copy()) for x, y, i in loader]


# ---- the transforms list ---------------------------------------------------------------
@pytest.mark.parametrize("bad,match", [
    ([RandomHorizontalFlip(), RandomResizedCrop(24)], r"in this order.*got \[RandomHorizontalFlip, RandomResizedCrop\]"),
    ([Normalize(), RandomHorizontalFlip()], r"Normalize last"),
    ([RandomCrop(8), CenterCrop(8)], r"at most once|in this order"),
    ([Resize(32), RandomResizedCrop(24)], r"drop the Resize"),
    ([RandomHorizontalFlip(), RandomHorizontalFlip()], r"each at most once"),
    ([Resize(32)], r"Resize\(32\) alone"),
])
def test_unfusable_orders_are_refused_with_the_orders_that_work(packed, bad, match):
    with pytest.raises(ValueError, match=match) as info:
        Loader(Dataset(packed["jpeg"]), transforms=bad)
    assert "[Resize] [RandomResizedCrop | RandomCrop | CenterCrop]" in str(info.value)


def test_foreign_transforms_point_to_sample_transform(packed):
    with pytest.raises(TypeError, match="sample_transform=fn"):
        Loader(Dataset(packed["jpeg"]), transforms=[lambda x: x])


def test_flips_and_jitter_commute_in_any_order():
    a = compile_spec([RandomCrop(8), ColorJitter(brightness=0.2), RandomVerticalFlip(0.3),
                      RandomHorizontalFlip(0.7)])
    b = compile_spec([RandomCrop(8), RandomHorizontalFlip(0.7), RandomVerticalFlip(0.3),
                      ColorJitter(brightness=0.2)])
    assert a == b and (a.flip_h, a.flip_v) == (0.7, 0.3)


def test_dtype_defaults_follow_normalize():
    assert compile_spec([RandomCrop(8)]).dtype == torch.uint8
    assert compile_spec([RandomCrop(8), Normalize()]).dtype == torch.float32
    with pytest.raises(ValueError, match="float dtype"):
        compile_spec([Normalize()], dtype=torch.uint8)


def test_color_jitter_ranges_follow_torchvision():
    cj = ColorJitter(brightness=0.4, contrast=(0.5, 1.5), saturation=2.0, hue=0.1)
    assert cj.ranges == ((0.6, 1.4), (0.5, 1.5), (0.0, 3.0), (-0.1, 0.1))
    assert ColorJitter().ranges == (None, None, None, None)
    with pytest.raises(ValueError, match="hue"):
        ColorJitter(hue=0.6)
    with pytest.raises(ValueError, match="non-negative"):
        ColorJitter(brightness=-1)


# ---- evaluation: Resize + CenterCrop on photos smaller than the crop --------------------
def _torchvision_resize_center_crop(pixels, size, crop):
    """torchvision's Resize(size) then CenterCrop(crop), written out with PIL."""
    from PIL import Image

    h, w = pixels.shape[:2]
    short, long_ = min(h, w), max(h, w)
    new_long = int(size * long_ / short)
    nh, nw = (size, new_long) if h <= w else (new_long, size)
    img = Image.fromarray(pixels).resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - crop) / 2.0)), int(round((nw - crop) / 2.0))
    return np.asarray(img)[top:top + crop, left:left + crop]


def test_resize_then_center_crop_on_small_photos(small_photos):
    ds = Dataset(small_photos)
    with pytest.raises(SampleError, match="crops do not pad: put Resize before it"):
        next(iter(Loader(ds, batch_size=4, transforms=[CenterCrop(224)], num_workers=0)))
    loader = Loader(ds, batch_size=4, transforms=[Resize(256), CenterCrop(224)], num_workers=2,
                    shuffle=False, output=Output(return_index=True))
    diffs = []
    for images, _, idx in loader:
        assert images.shape[1:] == (3, 224, 224)
        for k, i in enumerate(idx):
            ref = _torchvision_resize_center_crop(ds[int(i)][0], 256, 224)
            diffs.append(np.abs(images[k].numpy().transpose(1, 2, 0).astype(int) - ref))
    # one fused resample of the fractional box = resize the whole image, then crop (PIL
    # rounds its fixed-point filter per call: off by one grey level on a few pixels)
    assert len(diffs) == 12 and max(d.max() for d in diffs) <= 1
    assert np.mean([d.mean() for d in diffs]) < 0.01


def test_resize_to_a_fixed_size(packed):
    ds = Dataset(packed["jpeg"])
    images, _ = next(iter(Loader(ds, batch_size=5, transforms=[Resize((20, 30))])))
    assert images.shape == (5, 3, 20, 30)


# ---- sample_transform -----------------------------------------------------------------
def rotate_quarter(pixels):
    """A user's own augmentation: a quarter turn (changes the image's size)."""
    return np.ascontiguousarray(np.rot90(pixels))


def half_size(pixels):
    return np.ascontiguousarray(pixels[::2, ::2])


def bad_output(pixels):
    return pixels.astype(np.float32)


def fails_on_odd_sizes(pixels):
    if pixels.shape[1] % 2:
        raise RuntimeError("user code failed")
    return pixels


@pytest.mark.parametrize("kind,workers", [("thread", 0), ("thread", 2), ("process", 2)])
def test_sample_transform_runs_before_the_fused_transforms(packed, kind, workers):
    ds = Dataset(packed["raw"])
    loader = Loader(ds, batch_size=8, num_workers=workers, workers=Workers(kind=kind),
                    output=Output(return_index=True), seed=1,
                    sample_transform=rotate_quarter, transforms=[RandomCrop(24), RandomHorizontalFlip()])
    spec = compile_spec([RandomCrop(24), RandomHorizontalFlip()])
    batches = _epoch(loader)
    assert sum(len(i) for _, _, i in batches) == 40
    for images, _, idx in batches:
        for k, i in enumerate(idx):
            turned = rotate_quarter(ds[int(i)][0])
            p = spec.draw(1, 0, [i], [turned.shape[0]], [turned.shape[1]])
            t, l, h, w = p.boxes[0]
            ref = turned[t:t + h, l:l + w]
            ref = ref[:, ::-1] if p.flip_h[0] else ref
            assert np.array_equal(images[k].numpy(), ref.transpose(2, 0, 1))


def test_sample_transform_on_the_device_path_matches_the_host(packed):
    ds = Dataset(packed["jpeg"])
    kw = dict(batch_size=8, seed=2, sample_transform=half_size, return_index=True,
              transforms=[RandomResizedCrop(16), RandomVerticalFlip()])
    host = _epoch(Loader(ds, **kw))
    dev = _epoch(Loader(ds, workers=Workers(device_transforms=True),
                        **kw))  # runs on the host: see docs
    for (a, _, i1), (b, _, i2) in zip(host, dev):
        assert np.array_equal(i1, i2) and torch.equal(a, b)


@pytest.mark.parametrize("fn,match", [(bad_output, r"\(H, W, 3\) uint8 ndarray, got ndarray float32"),
                                      (fails_on_odd_sizes, "RuntimeError: user code failed")])
def test_sample_transform_errors_name_the_sample(packed, fn, match):
    loader = Loader(Dataset(packed["jpeg"]), batch_size=8, sample_transform=fn,
                    transforms=[RandomResizedCrop(16)], num_workers=2)
    with pytest.raises(SampleError, match=rf"shard-\d+\.rec record \d+ \(sample \d+\).*{match}"):
        list(loader)


def test_albumentations_as_a_sample_transform(packed):
    A = pytest.importorskip("albumentations")
    aug = A.Compose([A.RandomBrightnessContrast(p=1.0), A.Rotate(limit=10, p=1.0)])

    def albumentations_fn(pixels):
        return aug(image=pixels)["image"]

    loader = Loader(Dataset(packed["jpeg"]), batch_size=8, sample_transform=albumentations_fn,
                    transforms=[RandomResizedCrop(24), Normalize()], num_workers=2)
    images = torch.cat([x for x, _ in loader])
    assert images.shape == (40, 3, 24, 24) and images.dtype == torch.float32


# ---- batches for other frameworks -------------------------------------------------------
def test_batches_go_to_numpy_through_dlpack_without_a_copy(packed):
    images, labels = next(iter(Loader(Dataset(packed["raw"]), batch_size=8,
                                      transforms=[RandomCrop(24)])))
    array = np.from_dlpack(images)
    assert array.shape == (8, 3, 24, 24) and array.dtype == np.uint8
    assert array.__array_interface__["data"][0] == images.data_ptr()  # same memory
    assert np.array_equal(np.from_dlpack(labels), labels.numpy())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_batches_go_to_cupy_or_jax_through_dlpack(packed):
    images, _ = next(iter(Loader(Dataset(packed["raw"]), batch_size=8, device="cuda",
                                 transforms=[RandomCrop(24), Normalize()])))
    try:
        import cupy
        assert cupy.from_dlpack(images).data.ptr == images.data_ptr()
    except ImportError:
        jax = pytest.importorskip("jax")
        assert jax.dlpack.from_dlpack(images).shape == images.shape


# ---- subsets and splits ------------------------------------------------------------------
def test_indices_read_exactly_the_subset(packed):
    ds = Dataset(packed["raw"])
    split = np.arange(3, 40, 3)
    got = _epoch(Loader(ds, batch_size=4, order=Order(indices=split),
                        output=Output(return_index=True), transforms=[RandomCrop(20)]))
    seen = np.concatenate([i for _, _, i in got])
    assert sorted(seen) == sorted(split)
    ref = dict(zip(*[np.concatenate(a) for a in zip(*[(i, y.numpy()) for _, y, i in got])]))
    assert all(ref[i] == ds[int(i)][1] for i in split)


def test_torch_subset_is_the_same_as_indices(packed):
    ds = Dataset(packed["raw"])
    split = np.array([5, 1, 30, 22, 9, 17, 33, 2, 11])
    kw = dict(batch_size=4, return_index=True, transforms=[RandomCrop(20)], seed=4)
    a = _epoch(Loader(ds, order=Order(indices=split), **kw))
    b = _epoch(Loader(torch.utils.data.Subset(ds, split), **kw))
    nested = torch.utils.data.Subset(torch.utils.data.Subset(ds, split), [0, 1, 2, 3, 4, 5, 6, 7, 8])
    c = _epoch(Loader(nested, **kw))
    for x, y, z in zip(a, b, c):
        assert np.array_equal(x[2], y[2]) and np.array_equal(x[2], z[2])
        assert torch.equal(x[0], y[0]) and torch.equal(x[0], z[0])


def test_subset_ranks_and_resume(packed):
    ds = Dataset(packed["raw"])
    split = np.arange(0, 40, 2)
    kw = dict(batch_size=3, indices=split, return_index=True, transforms=[RandomCrop(20)])
    parts = [np.concatenate([i for _, _, i in _epoch(Loader(ds, rank=r, world_size=2, **kw))])
             for r in range(2)]
    assert sorted(np.concatenate(parts)) == sorted(split)
    full = _epoch(Loader(ds, **kw))
    first = Loader(ds, **kw)
    head = []
    for k, b in enumerate(first):
        head.append(b[2].copy())
        if k == 2:
            break
    rest = Loader(ds, **kw)
    rest.load_state_dict(first.state_dict())
    tail = [i for _, _, i in _epoch(rest)]
    assert np.array_equal(np.concatenate(head + tail), np.concatenate([i for _, _, i in full]))
    other = Loader(ds, **dict(kw, indices=split[:-1]))
    with pytest.raises(ValueError, match="subset"):
        other.load_state_dict(first.state_dict())


def test_bad_indices_are_refused(packed):
    ds = Dataset(packed["raw"])
    with pytest.raises(IndexError, match="sample 40 is out of range"):
        Loader(ds, order=Order(indices=[1, 40]))
    with pytest.raises(ValueError, match="listed twice"):
        Loader(ds, order=Order(indices=[1, 1]))
    with pytest.raises(TypeError, match="reads a dlpack_io.reader.Dataset"):
        Loader([1, 2, 3])


# ---- defaults and resources ---------------------------------------------------------------
def test_defaults_read_every_sample(packed):
    loader = Loader(Dataset(packed["raw"]), batch_size=16, transforms=[RandomCrop(20)])
    assert loader.options.drop_last is False
    assert sum(len(y) for _, y in loader) == 40 and len(loader) == 3


def test_cuda_without_cuda_is_refused_at_construction(packed):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        Loader(Dataset(packed["raw"]), device="cuda")


def _loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("dlpack-loader")]


def test_context_manager_stops_the_workers(packed):
    with Loader(Dataset(packed["jpeg"]), transforms=[RandomResizedCrop(16)], batch_size=8,
                num_workers=2) as loader:
        for epoch in range(2):  # workers are kept from one epoch to the next
            loader.set_epoch(epoch)
            assert sum(len(y) for _, y in loader) == 40
        assert len(_loader_threads()) >= 2
    assert not _loader_threads()  # close() joined them
    with Loader(Dataset(packed["jpeg"]), transforms=[RandomResizedCrop(16)], batch_size=8,
                num_workers=2, workers=Workers(kind="process")) as loader:
        list(loader)
        pids = loader.worker_pids()
        assert len(pids) == 2
    assert loader.worker_pids() == []


# ---- a worker that never returns -----------------------------------------------------------
RELEASE = threading.Event()


def never_returns(pixels):
    """A sample_transform that hangs (a deadlock in user code, a stuck network read) until
    the test releases it (so abandoned threads end with the test)."""
    RELEASE.wait(120)
    return pixels


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_timeout_names_the_batch_and_the_sample(packed, kind, hang_deadline):
    loader = Loader(Dataset(packed["raw"]), batch_size=8, num_workers=2,
                    workers=Workers(kind=kind, timeout=1.0), sample_transform=never_returns,
                    transforms=[RandomCrop(20)])
    RELEASE.clear()
    try:
        with pytest.raises(LoaderTimeout, match=r"batch \d+ .*not built after timeout=1 s: "
                                                r".*shard-\d+\.rec record \d+ \(sample \d+\)"):
            next(iter(loader))
        assert loader.worker_pids() == []  # processes killed and reaped; threads abandoned
        loader.close()  # returns at once: abandoned threads are not waited for
    finally:
        RELEASE.set()
    deadline = time.monotonic() + 30  # hang guard only: released threads exit promptly
    while _loader_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _loader_threads()


def test_a_share_smaller_than_one_batch_warns(packed, caplog):
    loader = Loader(Dataset(packed["raw"]), batch_size=32, rank=0, world_size=2,
                    drop_last=True, transforms=[RandomCrop(20)])
    with caplog.at_level(logging.WARNING, logger="dlpack_io.reader.batch.loader"):
        assert list(loader) == [] and len(loader) == 0
    assert "fewer than one batch of 32 with drop_last=True" in caplog.text


def test_cuda_without_triton_asks_for_it_or_an_explicit_fallback(monkeypatch):
    import importlib.util

    from dlpack_io.reader.batch.options import use_device_transforms

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    cuda = torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match=r"pip install 'dlpack-io\[gpu\]'.*device_transforms=False"):
        use_device_transforms(None, cuda)
    assert use_device_transforms(False, cuda) is False  # the explicit host fallback
    assert use_device_transforms(None, torch.device("cpu")) is False


# ---- the signature: every option visible to help(), IDEs and inspect -----------------------
def test_signature_lists_every_option_keyword_only_with_its_default():
    """Loader's signature is LoaderOptions' fields (at most 16), each keyword-only with the
    same default (None for the three groups, which default to Order() / Workers() /
    Output()), and help(Loader) describes each, the groups' fields too."""
    import dataclasses
    import inspect

    from dlpack_io.reader import LoaderOptions
    from dlpack_io.reader.batch.options import GROUPS

    params = inspect.signature(Loader).parameters
    option_fields = dataclasses.fields(LoaderOptions)
    # the trailing **compat maps DataLoader's names and earlier releases' keywords and
    # refuses the rest: see tests/batch/test_dataloader_habits.py
    assert list(params) == ["dataset"] + [f.name for f in option_fields] + ["compat"]
    assert len(option_fields) <= 16
    assert params["compat"].kind is inspect.Parameter.VAR_KEYWORD
    doc = inspect.getdoc(Loader)
    for f in option_fields:
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY, f.name
        default = None if f.name in GROUPS else f.default
        assert params[f.name].default == default, f.name
        assert f"{f.name}" in doc and f.metadata["doc"].split(";")[0][:40] in " ".join(
            doc.split()), f"help(Loader) does not describe {f.name}"
    for group, cls in GROUPS.items():
        assert LoaderOptions().__getattribute__(group) == cls()
        for f in dataclasses.fields(cls):
            assert f"{cls.__name__}.{f.name} = {f.default!r}" in doc, f.name


def test_each_setting_has_one_name_and_earlier_names_map_to_it(packed):
    """Every keyword of earlier releases maps to exactly one field of a group (with a
    DeprecationWarning naming it), DataLoader's names too (silently); None for shuffle is
    storage order, as it always was."""
    import dataclasses

    from dlpack_io.reader.batch.options import DATALOADER_NAMES, GROUPS, LEGACY_NAMES

    for name, (group, field) in {**LEGACY_NAMES, **DATALOADER_NAMES}.items():
        assert field in {f.name for f in dataclasses.fields(GROUPS[group])}, name
    ds = Dataset(packed["raw"])
    assert Loader(ds, shuffle=None).options.shuffle is None
    with pytest.warns(DeprecationWarning, match=r"Loader\(worker_kind=...\) is deprecated: "
                                                r"use Loader\(workers=Workers\(kind=...\)\)"):
        loader = Loader(ds, worker_kind="process", prefetch=3, num_workers=1)
    assert loader.options.workers == Workers(kind="process", prefetch=3)
    with pytest.warns(DeprecationWarning):  # a group and an older keyword for another field
        both = Loader(ds, workers=Workers(kind="process"), reduced_decode=False)
    assert both.options.workers == Workers(kind="process", reduced_decode=False)
    with pytest.raises(TypeError, match="pass each setting once"), \
            pytest.warns(DeprecationWarning):
        Loader(ds, workers=Workers(kind="process"), worker_kind="thread")
    with pytest.raises(TypeError, match=r"workers=\{'kind': 'process'\}: expected a Workers"):
        Loader(ds, workers={"kind": "process"})


def test_options_object_or_keywords_but_not_both(packed):
    from dlpack_io.reader import LoaderOptions

    ds = Dataset(packed["raw"])
    with pytest.warns(DeprecationWarning, match="options=LoaderOptions"):
        assert Loader(ds, options=LoaderOptions(batch_size=3, seed=5)).options.batch_size == 3
    assert Loader(ds, batch_size=3, seed=5).options == LoaderOptions(batch_size=3, seed=5)
    with pytest.raises(TypeError, match="not both"), pytest.warns(DeprecationWarning):
        Loader(ds, options=LoaderOptions(batch_size=3), batch_size=4)
