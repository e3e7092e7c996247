"""The region JPEG decoder (C extension) against PIL, its errors, and the PIL fallback."""
import io
import threading

import numpy as np
import pytest
from PIL import Image

from dlpack_io.reader import jpegdecode, shard
from dlpack_io.tools.synth import photo_like

needs_ext = pytest.mark.skipif(not jpegdecode.have_extension(),
                               reason="C extension dlpack_io.reader._jpeg not built")


def _jpeg(h, w, seed=0, subsampling=2, progressive=False) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo_like(np.random.default_rng(seed), h, w)).save(
        buf, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)
    return buf.getvalue()


@pytest.fixture(scope="module", params=[(2, False), (0, False), (2, True), (1, False)],
                ids=["420", "444", "420-progressive", "422"])
def jpeg(request):
    return _jpeg(75, 101, seed=3, subsampling=request.param[0], progressive=request.param[1])


def _pil_scaled(data, n):
    img = Image.open(io.BytesIO(data))
    if n < 8:
        img.draft("RGB", (img.width // (8 // n), img.height // (8 // n)))
    return np.asarray(img.convert("RGB"))


@needs_ext
def test_full_decode_is_identical_to_pil(jpeg):
    ref = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    scratch = np.empty(ref.size, np.uint8)
    region = jpegdecode.decode_region(jpeg, (0, 0, 75, 101), 8, scratch)
    assert (region.y0, region.x0) == (0, 0) and np.array_equal(region.pixels, ref)


@needs_ext
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_region_pixels_equal_pil_draft_decode(jpeg, n):
    ref = _pil_scaled(jpeg, n)
    scratch = np.empty(75 * 101 * 3, np.uint8)
    gen = np.random.default_rng(n)
    for _ in range(25):
        t, l = int(gen.integers(0, 60)), int(gen.integers(0, 90))
        h, w = int(gen.integers(1, 76 - t)), int(gen.integers(1, 102 - l))
        r = jpegdecode.decode_region(jpeg, (t, l, h, w), n, scratch)
        ys, ye = t * n // 8, -(-(t + h) * n // 8)
        xs, xe = l * n // 8, -(-(l + w) * n // 8)
        got = r.pixels[ys - r.y0:ye - r.y0, xs - r.x0:xe - r.x0]
        assert np.array_equal(got, ref[ys:ye, xs:xe]), (t, l, h, w)


def test_choose_scale():
    assert jpegdecode.choose_scale(448, 448, 224, 224) == 4
    assert jpegdecode.choose_scale(447, 900, 224, 224) == 8
    assert jpegdecode.choose_scale(1800, 1800, 224, 224) == 1
    assert jpegdecode.choose_scale(100, 100, 224, 224) == 8  # upscaling: full scale


@needs_ext
def test_errors_become_value_errors():
    good = _jpeg(40, 40)
    scratch = np.empty(40 * 40 * 3, np.uint8)
    with pytest.raises(ValueError, match="Not a JPEG"):
        jpegdecode.decode_region(b"\0" * 100, (0, 0, 4, 4), 8, scratch)
    with pytest.raises(ValueError, match="truncated|Premature|JPEG"):
        jpegdecode.decode_region(good[:len(good) // 2], (0, 0, 40, 40), 8, scratch)
    with pytest.raises(ValueError, match="not inside"):
        jpegdecode.decode_region(good, (30, 0, 11, 4), 8, scratch)
    with pytest.raises(ValueError, match="smaller than"):
        jpegdecode.decode_region(good, (0, 0, 40, 40), 8, np.empty(100, np.uint8))


@needs_ext
def test_header():
    from dlpack_io.reader import _jpeg as ext

    assert ext.header(_jpeg(30, 50)) == (30, 50, 3)
    with pytest.raises(ValueError, match="header"):
        ext.header(b"garbage")


@pytest.mark.parametrize("flip_h,flip_v", [(False, False), (True, False), (False, True), (True, True)])
def test_to_chw_matches_numpy(flip_h, flip_v, monkeypatch):
    src = np.random.default_rng(0).integers(0, 256, (9, 61, 3), dtype=np.uint8)
    for t, l, h, w in [(2, 3, 5, 8), (1, 5, 7, 37), (0, 0, 9, 61), (3, 20, 2, 16)]:
        block = src[t:t + h, l:l + w]  # widths below, at and above the 16-pixel SIMD step
        ref = block[::-1] if flip_v else block
        ref = ref[:, ::-1] if flip_h else ref
        for ext in ([shard._jpeg, None] if jpegdecode.have_extension() else [None]):
            monkeypatch.setattr(shard, "_jpeg", ext)
            dst = np.zeros(3 * h * w + 7, np.uint8)
            shard.to_chw(src, (t * 61 + l) * 3, 61 * 3, h, w, dst, 7, flip_h, flip_v)
            assert np.array_equal(dst[7:].reshape(3, h, w), ref.transpose(2, 0, 1))
            with pytest.raises(ValueError, match=r"to_chw: .*does not fit"):
                shard.to_chw(src, 0, 61 * 3, 10, 61, dst, 0, False, False)


def test_pil_fallback_gives_the_same_resized_crop(monkeypatch):
    data = _jpeg(120, 160, seed=5)
    scratch = np.empty(jpegdecode.scratch_bytes(120, 160), np.uint8)
    boxes = [(0, 0, 120, 160), (10, 20, 90, 100), (50, 3, 17, 31)]
    ext = [jpegdecode.decode_resized(data, b, (24, 24), scratch) for b in boxes]
    monkeypatch.setattr(jpegdecode, "_jpeg", None)
    pil = [jpegdecode.decode_resized(data, b, (24, 24), scratch) for b in boxes]
    for a, b in zip(ext, pil):  # the C path hands PIL RGBX (shared memory), PIL gives RGB
        assert np.array_equal(a[..., :3], b[..., :3])


def test_reduced_decode_stays_close_to_full_decode():
    data = _jpeg(300, 400, seed=7)
    scratch = np.empty(jpegdecode.scratch_bytes(300, 400), np.uint8)
    diffs = []
    for box in [(0, 0, 300, 400), (20, 30, 200, 240), (100, 100, 120, 130)]:
        full = jpegdecode.decode_resized(data, box, (56, 56), scratch, reduce=False)
        small = jpegdecode.decode_resized(data, box, (56, 56), scratch, reduce=True)
        diffs.append(np.abs(full[..., :3].astype(int) - small[..., :3]).mean())
    assert max(diffs) < 4.0, diffs


@needs_ext
def test_decoder_is_thread_safe():
    data = _jpeg(600, 800, seed=2)
    results = []

    def work():
        scratch = np.empty(600 * 800 * 3, np.uint8)
        for _ in range(3):
            results.append(jpegdecode.decode_region(data, (0, 0, 600, 800), 8, scratch).pixels.sum())

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 6


def test_gather_copies_ranges(monkeypatch):
    src = np.arange(1000, dtype=np.int64).astype(np.uint8)
    for ext in ([shard._jpeg, None] if jpegdecode.have_extension() else [None]):
        monkeypatch.setattr(shard, "_jpeg", ext)
        dst = np.zeros(64, np.uint8)
        shard.gather(memoryview(src), [10, 500, 990], [5, 20, 10], dst, [0, 5, 30])
        assert np.array_equal(dst[:5], src[10:15]) and np.array_equal(dst[5:25], src[500:520])
        assert np.array_equal(dst[30:40], src[990:1000]) and not dst[25:30].any()
        with pytest.raises(ValueError, match=r"gather: .*10 bytes from 995 to 0.* not fit"):
            shard.gather(memoryview(src), [995], [10], dst, [0])
        with pytest.raises(ValueError, match=r"gather: .*10 bytes from 0 to 60.* not fit"):
            shard.gather(memoryview(src), [0], [10], dst, [60])


@needs_ext
def test_one_call_decode_resize_equals_the_composed_path(monkeypatch):
    """decode_resized(into=...) runs decode + resize in one C call (one GIL release): every
    output byte equals the composed Python path's (decode_region, Region.box, _window, the C
    resize) for JPEG and planes records, every EXIF orientation, reduced scales, exact float
    boxes (Resize + crop semantics), flips; its errors name the same problems."""
    from jpegcases import collection, orientation_of

    rng = np.random.default_rng(17)
    payloads = []
    for name, data in collection().items():
        if name.startswith(("bad", "tiny")):
            continue
        o = orientation_of(data)
        payloads.append((name, data, o))
        planes = jpegdecode._jpeg.to_planes(data, 1 << 40)
        if planes is not None:
            payloads.append((name + "-planes", planes, o))
    checked = 0
    for name, payload, o in payloads:
        H, W = _upright_size(payload, o)
        scratch = np.empty(jpegdecode.scratch_bytes(H, W), np.uint8)
        for _ in range(6):
            top, left = int(rng.integers(0, H)), int(rng.integers(0, W))
            h, w = int(rng.integers(1, H - top + 1)), int(rng.integers(1, W - left + 1))
            out = (int(rng.integers(1, 40)), int(rng.integers(1, 40)))
            exact = None
            if rng.random() < 0.4:  # a float box inside the window
                et, el = top + rng.random() * h / 3, left + rng.random() * w / 3
                exact = (et, el, (top + h - et) * rng.uniform(0.5, 1), (left + w - el) * rng.uniform(0.5, 1))
            reduce = not name.endswith("planes") and bool(rng.random() < 0.7)
            flips = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
            got, want = (np.full(3 * out[0] * out[1] + 5, 7, np.uint8) for _ in range(2))
            jpegdecode.decode_resized(payload, (top, left, h, w), out, scratch, reduce,
                                      exact_box=exact, orientation=o, into=(got, 5, *flips))
            with monkeypatch.context() as m:
                m.setattr(jpegdecode, "native_decode_resized", None)
                jpegdecode.decode_resized(payload, (top, left, h, w), out, scratch, reduce,
                                          exact_box=exact, orientation=o,
                                          into=(want, 5, *flips))
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {(top, left, h, w)} "
                                                             f"{exact} {out} {reduce}")
            checked += 1
    assert checked > 200
    with pytest.raises(ValueError, match="crop box .* is not inside the"):
        jpegdecode.decode_resized(payloads[0][1], (0, 0, 9999, 5), (4, 4), scratch,
                                  into=(np.empty(48, np.uint8), 0, False, False))
    with pytest.raises(ValueError, match="does not fit"):
        jpegdecode.decode_resized(payloads[0][1], (0, 0, 5, 5), (4, 4), scratch,
                                  into=(np.empty(47, np.uint8), 0, False, False))


def _upright_size(payload, orientation):
    """(height, width) of a record's upright image, from the decoder itself."""
    *_, height, width = jpegdecode._jpeg.decode_region(
        payload, np.empty(1 << 22, np.uint8), 0, 0, 1, 1, 8, 3, orientation)
    return height, width
