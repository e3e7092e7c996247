"""The Triton kernels compiled for a real GPU, against the torch reference run on the CPU.

The interpreter tests (test_kernels_*.py, TRITON_INTERPRET=1) prove the maths; these prove
the compiled code: every variant the public ops can launch (shapes with 1-pixel and odd
sizes, 1-4 channels, every output dtype, each colour-jitter op alone and all four in a
random per-sample order, dense, ragged and packed records), unchecked bad boxes and
records (clamped, never out of memory: run this file's small tests under
compute-sanitizer, docs/gpu.md), offsets past 2**31 bytes (dense and ragged; skipped with
the reason when the GPU lacks the memory), the one-sync validation, and compiled variants
that do not grow with per-batch geometry. Tolerances (docs/kernels.md): uint8 exact for
plain crops, else +-1 on at most 2 % of the pixels; float32 1e-5, float16 2**-9,
bfloat16 2**-6 after normalisation. Skipped without CUDA.
"""
import pytest

from helpers import compiled_variants  # noqa: E402
import torch

from dlpack_io.kernels import (crop_flip_permute, crop_flip_permute_packed, records as R,
                               reference, resized_crop, resized_crop_packed)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (docs/gpu.md)")]

MEAN, STD = (0.485, 0.456, 0.406, 0.5), (0.229, 0.224, 0.225, 0.25)
ATOL = {torch.float32: 1e-5, torch.float16: 2**-9, torch.bfloat16: 2**-6}
OPS = ("crop", "resize", "resize_aa")
# (n, h, w, out_h, out_w): ImageNet's case, odd sizes, 1-pixel sides (Triton specialises 1)
SHAPES = [(64, 256, 256, 224, 224), (7, 37, 53, 23, 31), (3, 1, 9, 1, 3), (2, 40, 1, 7, 1),
          (9, 300, 301, 299, 17)]
GIB = 2**30


def _close(out, ref, dtype, exact: bool) -> None:
    out = out.cpu()
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape and out.is_contiguous()
    d = (out.float() - ref.float()).abs()
    if dtype == torch.uint8 and exact:
        assert d.max() == 0
    elif dtype == torch.uint8:
        assert d.max() <= 1 and (d > 0).float().mean() <= 0.02, (d.max(), (d > 0).float().mean())
    else:
        assert d.max() <= ATOL[dtype], float(d.max())


def _on(kw: dict, dev) -> dict:
    return {k: v.to(dev) if torch.is_tensor(v) else v for k, v in kw.items()}


def _inputs(g, n, h, w, oh, ow, c=3):
    """Random images, crop corners, boxes and flips (CPU tensors)."""
    images = torch.randint(0, 256, (n, h, w, c), dtype=torch.uint8, generator=g)
    top = torch.randint(0, h - oh + 1, (n,), generator=g)
    left = torch.randint(0, w - ow + 1, (n,), generator=g)
    bh, bw = torch.randint(1, h + 1, (n,), generator=g), torch.randint(1, w + 1, (n,), generator=g)
    bt = (torch.rand(n, generator=g) * (h - bh + 1)).long()
    bl = (torch.rand(n, generator=g) * (w - bw + 1)).long()
    fh, fv = torch.rand(n, generator=g) < 0.5, torch.rand(n, generator=g) < 0.5
    return images, top, left, torch.stack([bt, bl, bh, bw], 1), fh, fv


def _jitter(g, n, ops) -> dict:
    """Per-sample factors of ``ops`` and a random order of the four ops per sample."""
    kw = {name: 0.6 + 0.8 * torch.rand(n, generator=g) for name in ops if name != "hue"}
    if "hue" in ops:
        kw["hue"] = torch.rand(n, generator=g) - 0.5
    if ops:
        kw["order"] = torch.stack([torch.randperm(4, generator=g) for _ in range(n)])
    return kw


def _run(op, images, top, left, boxes, fh, fv, oh, ow, dev, **kw):
    """``op`` on ``dev`` (Triton on CUDA) and its torch reference on the CPU."""
    if op == "crop":
        args = (images, top, left, oh, ow, fh, fv)
        fn, ref = crop_flip_permute, reference.crop_flip_permute
    else:
        args = (images, boxes, (oh, ow), fh, fv)
        kw = dict(kw, antialias=op == "resize_aa")
        fn, ref = resized_crop, reference.resized_crop
    out = fn(*(a.to(dev) if torch.is_tensor(a) else a for a in args), **_on(kw, dev))
    return out, ref(*args, **kw)


def _check(op, shape, c, dtype, ops=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    n, h, w, oh, ow = shape
    images, top, left, boxes, fh, fv = _inputs(g, n, h, w, oh, ow, c)
    kw = dict(out_dtype=dtype, **_jitter(g, n, ops))
    if dtype != torch.uint8:
        kw.update(mean=MEAN[:c], std=STD[:c])
    out, ref = _run(op, images, top, left, boxes, fh, fv, oh, ow, "cuda", **kw)
    _close(out, ref, dtype, exact=op == "crop" and not ops)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_shapes(op, shape):
    _check(op, shape, 3, torch.float16)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_channels(op, channels):
    _check(op, (5, 37, 53, 28, 20), channels, torch.float16)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32])
def test_dtypes(op, dtype):
    _check(op, (5, 37, 53, 28, 20), 3, dtype)


JITTERS = [("brightness",), ("contrast",), ("saturation",), ("hue",), R.JITTER_OPS]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("ops", JITTERS, ids=["+".join(j) for j in JITTERS])
def test_jitter_each_op_and_all_in_random_order(op, ops):
    if op == "resize" and len(ops) == 1:
        pytest.skip("single ops: crop and antialiased resize cover the epilogue variants")
    _check(op, (6, 37, 53, 28, 20), 3, torch.float16, ops, seed=len(ops))


@pytest.mark.parametrize("op", OPS)
def test_jitter_to_uint8_and_single_channel(op):
    _check(op, (5, 37, 53, 28, 20), 3, torch.uint8, R.JITTER_OPS, seed=7)
    _check(op, (5, 37, 53, 28, 20), 1, torch.float32, ("brightness", "contrast"), seed=8)


def _int(g, lo: int, hi: int) -> int:
    """A random int in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def _box(g, h: int, w: int, max_top: int = 2**31, max_left: int = 2**31) -> list:
    """A random (top, left, height, width) box inside an h x w image."""
    bh, bw = _int(g, 1, h), _int(g, 1, w)
    return [_int(g, 0, min(h - bh, max_top)), _int(g, 0, min(w - bw, max_left)), bh, bw]


def _ragged(g, n, c=3):
    """Images of different sizes shuffled into one flat buffer with gaps, exactly sized
    (no slack after the last byte); (flat, images, geometry, boxes, flips)."""
    sizes = [(_int(g, 1, 39), _int(g, 1, 49)) for _ in range(n)]
    imgs = [torch.randint(0, 256, (h, w, c), dtype=torch.uint8, generator=g) for h, w in sizes]
    offsets, pos = [0] * n, 5
    for i in torch.randperm(n, generator=g).tolist():
        offsets[i], pos = pos, pos + imgs[i].numel() + 3
    flat = torch.zeros(pos - 3, dtype=torch.uint8)
    for i, img in enumerate(imgs):
        flat[offsets[i]:offsets[i] + img.numel()] = img.reshape(-1)
    geo = dict(offsets=torch.tensor(offsets, dtype=torch.int32),
               heights=torch.tensor([h for h, _ in sizes], dtype=torch.int32),
               widths=torch.tensor([w for _, w in sizes], dtype=torch.int32), channels=c)
    boxes = torch.tensor([_box(g, h, w) for h, w in sizes])
    flips = torch.rand(n, generator=g) < 0.5, torch.rand(n, generator=g) < 0.5
    return flat, imgs, geo, boxes, flips


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("ops", [(), R.JITTER_OPS], ids=["plain", "jitter"])
def test_ragged(antialias, ops):
    g = torch.Generator().manual_seed(3)
    flat, _, geo, boxes, (fh, fv) = _ragged(g, 11)
    kw = dict(geo, out_dtype=torch.float16, mean=MEAN[:3], std=STD[:3], antialias=antialias,
              **_jitter(g, 11, ops))
    out = resized_crop(flat.cuda(), boxes.cuda(), (13, 17), fh.cuda(), fv.cuda(), **_on(kw, "cuda"))
    _close(out, reference.resized_crop(flat, boxes, (13, 17), fh, fv, **kw), torch.float16, False)


def _packed_slot(g, n, dense: bool):
    """A host slot (pixels, then one 64-byte record per sample), like the Loader's; dense:
    (n, 21, 26, 3) images whose boxes' corners also fit an 11 x 13 crop."""
    if dense:
        images = torch.randint(0, 256, (n, 21, 26, 3), dtype=torch.uint8, generator=g)
        pixels, hw = images.reshape(-1), [(21, 26)] * n
        offsets = [i * 21 * 26 * 3 for i in range(n)]
    else:
        pixels, imgs, geo, _, _ = _ragged(g, n)
        hw = [tuple(i.shape[:2]) for i in imgs]
        offsets = geo["offsets"].tolist()
    at = -(-pixels.numel() // R.RECORD_ALIGN) * R.RECORD_ALIGN
    slot = torch.zeros(at + n * R.RECORD_BYTES, dtype=torch.uint8)
    slot[:pixels.numel()] = pixels
    rec = R.host_records(slot, at, n)
    boxes = [_box(g, h, w, *((10, 13) if dense else ())) for h, w in hw]
    for j, name in enumerate(("top", "left", "box_height", "box_width")):
        rec[name] = [b[j] for b in boxes]
    rec["height"], rec["width"] = [h for h, _ in hw], [w for _, w in hw]
    rec["offset"] = offsets
    rec["flags"] = torch.randint(0, 4, (n,), generator=g).numpy()
    rec["label"] = torch.arange(n).numpy() * 7
    jit = _jitter(g, n, R.JITTER_OPS)
    for name in R.JITTER_OPS:
        rec[name] = jit[name].numpy()
    rec["order"] = R.encode_order(jit["order"]).numpy()
    return slot, at


@pytest.mark.parametrize("layout", ["dense", "ragged"])
def test_packed_records_from_one_pinned_copy(layout):
    g = torch.Generator().manual_seed(4)
    n = 9
    slot, at = _packed_slot(g, n, layout == "dense")
    device_slot = slot.pin_memory().to("cuda", non_blocking=True)  # the Loader's one copy
    rec, rec_cpu = R.records_view(device_slot, at, n), R.records_view(slot, at, n)
    kw = dict(out_dtype=torch.float16, mean=MEAN[:3], std=STD[:3], jitter=R.JITTER_OPS)
    images, src = device_slot, slot
    if layout == "dense":
        images, src = (t[:n * 21 * 26 * 3].view(n, 21, 26, 3) for t in (device_slot, slot))
        out = crop_flip_permute_packed(images, rec, 11, 13, **kw)
        _close(out, reference.crop_flip_permute_packed(src, rec_cpu, 11, 13, **kw),
               torch.float16, False)
    for aa in (False, True):
        out = resized_crop_packed(images, rec, (12, 10), antialias=aa, **kw)
        _close(out, reference.resized_crop_packed(src, rec_cpu, (12, 10), antialias=aa, **kw),
               torch.float16, False)
    assert torch.equal(R.labels_of(rec).cpu(), torch.arange(n) * 7)


# ---- unchecked bad input: clamped, in bounds (the compute-sanitizer subset) ---------------------
def test_unvalidated_bad_crop_corners_are_clamped():
    g = torch.Generator().manual_seed(5)
    images = torch.randint(0, 256, (4, 9, 11, 3), dtype=torch.uint8, generator=g)
    top, left = torch.tensor([-3, 5, 0, 8]), torch.tensor([0, -2, 9, 7])
    for dtype in (torch.uint8, torch.float16):
        kw = dict(out_dtype=dtype, validate=False)
        out = crop_flip_permute(images.cuda(), top.cuda(), left.cuda(), 5, 6, True, False, **kw)
        ref = reference.crop_flip_permute(images, top, left, 5, 6, True, False, **kw)
        _close(out, ref, dtype, exact=True)  # both clamp every read into the image


def test_unvalidated_bad_boxes_and_records_stay_in_bounds():
    g = torch.Generator().manual_seed(6)
    n, h, w = 4, 9, 11
    flat = torch.randint(0, 256, (n * h * w * 3,), dtype=torch.uint8, generator=g).cuda()
    geo = dict(offsets=torch.arange(n) * (h * w * 3), heights=torch.full((n,), h),
               widths=torch.full((n,), w))
    boxes = torch.tensor([[-5, -7, 40, 3], [8, 10, 9, 9], [0, 0, 1, 1], [3, 4, 100, 200]])
    for aa in (False, True):
        for form in ({}, geo):
            images = flat.view(n, h, w, 3) if not form else flat
            out = resized_crop(images, boxes.cuda(), (13, 17), True, True, antialias=aa,
                               out_dtype=torch.float32, validate=False, **_on(form, "cuda"))
            torch.cuda.synchronize()
            assert out.shape == (n, 3, 13, 17)  # weighted means of pixels in the image:
            assert bool(((out >= -1e-3) & (out <= 255 + 1e-3)).all())
    slot, at = _packed_slot(g, 5, dense=False)
    rec = R.host_records(slot, at, 5)
    rec["offset"][0], rec["offset"][2] = 2**40, -5  # far past the buffer / before it
    rec["height"][1], rec["width"][1] = 2**30, 2**30  # overflows int32 sizes
    rec["order"][3], rec["box_height"][4] = 77, -3  # not a permutation / an empty box
    device_slot = slot.cuda()
    rec_gpu, rec_cpu = R.records_view(device_slot, at, 5), R.records_view(slot, at, 5)
    for aa in (False, True):
        for jitter in (R.JITTER_OPS, ()):  # with jitter: the bad order code is read too
            kw = dict(antialias=aa, jitter=jitter, validate=False)
            out = resized_crop_packed(device_slot, rec_gpu, (4, 5), **kw)
            torch.cuda.synchronize()
        ref = reference.resized_crop_packed(slot, rec_cpu, (4, 5), **kw)
        assert torch.equal(out[:3].cpu(), ref[:3])  # bad records read byte 0 as a 1x1 image


def test_validation_on_cuda_names_the_bad_sample():
    images = torch.zeros((3, 8, 8, 3), dtype=torch.uint8, device="cuda")
    top = torch.tensor([0, 5, 0], device="cuda")
    with pytest.raises(ValueError, match=r"sample 1: crop top=5, left=0, height=4"):
        crop_flip_permute(images, top, top * 0, 4, 4, False, False)
    boxes = torch.tensor([[0, 0, 8, 8], [0, 0, 8, 8], [2, 2, 7, 1]], device="cuda")
    with pytest.raises(ValueError, match=r"boxes\[2\] = \(top=2, left=2, height=7, width=1\)"):
        resized_crop(images, boxes, 4, False, False)


# ---- offsets past 2**31 ------------------------------------------------------------------------
def _need(gib: float) -> None:
    free, total = torch.cuda.mem_get_info()
    if free < gib * GIB:
        pytest.skip(f"needs {gib:.0f} GiB of free GPU memory, {free / GIB:.1f} of "
                    f"{total / GIB:.1f} GiB free")


@pytest.fixture(scope="module")
def huge():
    """2800 x 512 x 512 x 3 uint8 (2.2 GB: past 2**31 bytes) on the GPU."""
    _need(12)
    g = torch.Generator(device="cuda").manual_seed(1)
    images = torch.randint(0, 256, (2800, 512, 512, 3), dtype=torch.uint8, device="cuda",
                           generator=g)
    yield images
    del images
    torch.cuda.empty_cache()


def test_dense_offsets_past_2_31(huge):
    n, s = huge.shape[0], huge.shape[1]
    z = torch.zeros(n, dtype=torch.int64, device="cuda")
    fh = torch.zeros(n, dtype=torch.bool, device="cuda")
    fh[-1] = True
    out = crop_flip_permute(huge, z, z, s, s, fh, False, validate=False)  # 2.2 GB out too
    want = huge[-3:].permute(0, 3, 1, 2).clone()
    want[-1] = want[-1].flip(2)
    assert torch.equal(out[-3:], want)
    del out
    boxes = torch.tensor([[0, 0, s, s]] * n, device="cuda")
    kw = dict(antialias=True, out_dtype=torch.float16, mean=MEAN[:3], std=STD[:3])
    out = resized_crop(huge, boxes, 224, False, False, validate=False, **kw)
    ref = reference.resized_crop(huge[-2:].cpu(), boxes[-2:].cpu(), 224, False, False, **kw)
    _close(out[-2:], ref, torch.float16, False)
    del out
    kw = dict(out_dtype=torch.float32, mean=MEAN[:3], std=STD[:3])
    out = crop_flip_permute(huge[:1024], z[:1024], z[:1024], s, s, False, False,
                            validate=False, **kw)  # 3.2 GB of float32 output
    ref = reference.crop_flip_permute(huge[1020:1024].cpu(), z[:4].cpu(), z[:4].cpu(), s, s,
                                      False, False, **kw)
    _close(out[1020:], ref, torch.float32, False)


def test_ragged_offsets_past_2_31(huge):
    flat = huge.reshape(-1)
    total = flat.numel()
    samples = [(0, 511, 509), (total - 511 * 509 * 3 - 1, 511, 509),
               (total - 37 * 1000 * 3 - 5, 37, 1000), (total - 9, 1, 3)]
    boxes = torch.tensor([[0, 0, h, w] for _, h, w in samples])
    geo = {k: torch.tensor(v) for k, v in zip(("offsets", "heights", "widths"), zip(*samples))}
    for packed in (False, True):
        for aa in (False, True):
            kw = dict(antialias=aa, out_dtype=torch.float32)
            if packed:
                rec = R.records_view(_records_for(geo, boxes).cuda().view(torch.uint8), 0, 4)
                out = resized_crop_packed(flat, rec, (64, 48), channels=3, **kw)
            else:
                out = resized_crop(flat, boxes.cuda(), (64, 48), True, False, channels=3,
                                   **_on(geo, "cuda"), **kw)
            for i, (o, h, w) in enumerate(samples):
                img = flat[o:o + h * w * 3].view(1, h, w, 3).cpu()
                ref = reference.resized_crop(img, boxes[i:i + 1], (64, 48), not packed, False,
                                             **kw)
                _close(out[i:i + 1], ref, torch.float32, False)


def _records_for(geo, boxes) -> torch.Tensor:
    """(N, 16) int32 records: boxes and ragged geometry, no flips (int64 offsets)."""
    n = boxes.shape[0]
    rec = torch.zeros((n, R.RECORD_WORDS), dtype=torch.int32)
    rec[:, :4] = boxes
    rec[:, R.WORD["height"]], rec[:, R.WORD["width"]] = geo["heights"], geo["widths"]
    rec.view(torch.int64)[:, R.WORD["offset"] // 2] = geo["offsets"]
    return rec.reshape(-1)


# ---- compiled variants -----------------------------------------------------------------------


def test_batch_geometry_never_recompiles():
    """Ragged batches of new sizes (n, every H and W, the buffer length) reuse one compiled
    kernel when the records sit at 16-byte aligned addresses; dense batches of new image
    sizes likewise (H and W are not specialised)."""
    from dlpack_io.kernels import crop, resize

    g = torch.Generator().manual_seed(9)
    kw = dict(out_dtype=torch.bfloat16, mean=MEAN[:3], std=STD[:3], antialias=True)
    counts = []
    for step in range(8):
        n = 3 + step
        flat, _, geo, boxes, (fh, fv) = _ragged(g, n)
        rec = _records_for({"offsets": geo["offsets"].long(), "heights": geo["heights"],
                            "widths": geo["widths"]}, boxes)
        at = -(-flat.numel() // 16) * 16
        slot = torch.zeros(at + rec.numel() * 4, dtype=torch.uint8)
        slot[:flat.numel()] = flat
        slot[at:] = rec.view(torch.uint8)
        slot = slot.cuda()
        resized_crop_packed(slot, R.records_view(slot, at, n), (24, 24), **kw)
        h, w = 30 + step, 41 + 3 * step
        images = torch.zeros((n, h, w, 3), dtype=torch.uint8, device="cuda")
        zero = torch.zeros(n, dtype=torch.int32, device="cuda")
        crop_flip_permute(images, zero, zero, 30, 41, False, False, out_dtype=torch.bfloat16)
        counts.append((compiled_variants(resize._resized_crop_aa_kernel),
                       compiled_variants(crop._crop_flip_permute_kernel)))
    assert counts[-1] == counts[0], counts
