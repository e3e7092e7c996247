"""The C antialiased bilinear resize (reader/_resize.c, reached through
``jpegdecode.resize_region(..., into=...)``) against a numpy transcription of plain Pillow
13's arithmetic (exact) and against the PIL installed (exact with plain Pillow >= 13; within
TOLERANCE grey levels with Pillow-SIMD or Pillow <= 12, which round their own way)."""
import io
import math
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dlpack_io.reader import jpegdecode
from dlpack_io.reader.format.spec import native_jpeg

needs_ext = pytest.mark.skipif(native_jpeg() is None, reason="C extension not built")
TOLERANCE = 2  # grey levels between Pillow 13 and Pillow-SIMD / Pillow <= 12, at most
P = 22


def _plain_pillow_13() -> bool:
    try:
        metadata.version("pillow-simd")
        return False
    except metadata.PackageNotFoundError:
        return int(Image.__version__.split(".")[0]) >= 13


def _taps(size, a, b, out):
    """Pillow's precompute_coeffs + normalize_coeffs_8bpc (BILINEAR) as a dense matrix."""
    a, b = np.float32(a), np.float32(b)
    scale = float(np.float32(b - a)) / out
    fs = max(scale, 1.0)
    m = np.zeros((out, size), np.int64)
    for o in range(out):
        c = float(a) + (o + 0.5) * scale
        lo = max(int(c - fs + 0.5), 0)
        w = [max(0.0, 1 - abs((x - c + 0.5) / fs)) for x in range(lo, min(int(c + fs + 0.5), size))]
        for j, v in enumerate(w):
            m[o, lo + j] = int(0.5 + v / (sum(w) or 1) * (1 << P))
    return m


def reference(img, box, oh, ow):
    """Plain Pillow 13's Image.resize((ow, oh), BILINEAR, box=box) of (h, w, c) uint8."""
    h, w = img.shape[:2]
    kh, kv = _taps(w, box[0], box[2], ow), _taps(h, box[1], box[3], oh)
    half = 1 << (P - 1)

    def clip(a):
        return np.clip(a >> P, 0, 255)
    if h - oh > 0 and h - oh > 2 * (w - ow):  # rows first (Pillow 13's order rule)
        t = clip(np.einsum("py,yxc->pxc", kv, img.astype(np.int64)) + half)
        return clip(np.einsum("ox,pxc->poc", kh, t) + half).astype(np.uint8)
    t = clip(np.einsum("ox,yxc->yoc", kh, img.astype(np.int64)) + half)
    return clip(np.einsum("py,yoc->poc", kv, t) + half).astype(np.uint8)


def _native(img, box, oh, ow, flip_h=False, flip_v=False):
    out = np.full(3 * oh * ow + 3, 7, np.uint8)
    region = jpegdecode.Region(np.ascontiguousarray(img), 0, 0, 8)
    jpegdecode.resize_region(region, box, (oh, ow), into=(out, 3, flip_h, flip_v))
    assert np.all(out[:3] == 7)  # nothing written before the offset
    return out[3:].reshape(3, oh, ow).transpose(1, 2, 0)


CASES = [  # (h, w, channels, box or None (whole), oh, ow)
    (37, 53, 4, None, 11, 17), (53, 37, 3, None, 11, 29),  # both pass orders
    (29, 31, 4, (2.3, 1.7, 30.1, 27.9), 13, 7), (1, 1, 4, None, 1, 1), (1, 1, 3, None, 5, 3),
    (40, 40, 4, (10.25, 20.5, 10.75, 21.0), 3, 3), (9, 13, 3, None, 31, 23),  # sub-pixel, up
    (64, 3, 4, (0.0, 0.5, 3.0, 63.5), 1, 2), (17, 19, 3, (3, 4, 16, 15), 13, 12),  # integer box
    # 7 taps a side (shrinking 2-3x; the AVX2 passes unroll 3, 5 and 7), odd widths, and
    # rows wide enough for the vertical pass's 32-byte steps, rows first and columns first
    (60, 70, 4, None, 20, 25), (45, 90, 4, (1.5, 2.5, 88.0, 44.0), 17, 33),
    (90, 30, 4, None, 20, 27), (41, 200, 4, None, 15, 71),
    # hundreds of taps a pixel (the AVX2 pass's loop of any length), white so the sums are
    # as large as they get
    (3, 1200, 4, None, 2, 3), (2, 3000, 3, (0.5, 0.0, 2999.5, 2.0), 1, 2),
]


@needs_ext
@pytest.mark.parametrize("case", CASES)
def test_native_resize_equals_pillow_13_arithmetic(case):
    h, w, c, box, oh, ow = case
    img = np.random.default_rng(h * w).integers(0, 256, (h, w, c), dtype=np.uint8)
    if w >= 1000:
        img[:] = 255
        img[:, ::7] = 254  # not all one value: a sum off by a little still shows
    box = box or (0.0, 0.0, float(w), float(h))
    x0, y0, x1, y1 = (math.floor(box[0]), math.floor(box[1]), math.ceil(box[2]),
                      math.ceil(box[3]))
    ref = reference(img[y0:y1, x0:x1], (box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0),
                    oh, ow)[..., :3]
    assert np.array_equal(_native(img, box, oh, ow), ref)
    assert np.array_equal(_native(img, box, oh, ow, True, False), ref[:, ::-1])
    assert np.array_equal(_native(img, box, oh, ow, True, True), ref[::-1, ::-1])
    pil = Image.frombuffer("RGBX" if c == 4 else "RGB", (x1 - x0, y1 - y0),
                           np.ascontiguousarray(img[y0:y1, x0:x1]).tobytes(), "raw",
                           "RGBX" if c == 4 else "RGB", 0, 1)
    got = np.asarray(pil.resize((ow, oh), Image.BILINEAR, box=(box[0] - x0, box[1] - y0,
                                                                box[2] - x0, box[3] - y0)))
    diff = np.abs(got[..., :3].astype(int) - ref)
    assert diff.max() <= (0 if _plain_pillow_13() else TOLERANCE), diff.max()


def _jpeg(mode, h, w, seed=0):
    rng = np.random.default_rng(seed)
    bands = {"L": 1, "RGB": 3, "CMYK": 4}[mode]
    px = np.cumsum(rng.integers(0, 9, (h, w, bands)), axis=1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(px[..., 0] if bands == 1 else px, mode).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@needs_ext
@pytest.mark.parametrize("mode", ["L", "RGB", "CMYK"])
def test_decode_resized_into_chw_matches_the_pil_resize(mode):
    data = _jpeg(mode, 61, 83, seed=len(mode))
    scratch = np.empty(jpegdecode.scratch_bytes(61, 83), np.uint8)
    for box, exact in [((0, 0, 61, 83), None), ((5, 9, 40, 51), None),
                       ((0, 0, 61, 83), (3.5, 7.25, 50.0, 60.5))]:
        for out in [(24, 24), (7, 13), (70, 90)]:
            pil = jpegdecode.decode_resized(data, box, out, scratch, exact_box=exact)[..., :3]
            dst = np.empty(3 * out[0] * out[1], np.uint8)
            jpegdecode.decode_resized(data, box, out, scratch, exact_box=exact,
                                      into=(dst, 0, True, False))
            chw = dst.reshape(3, *out).transpose(1, 2, 0)[:, ::-1]
            diff = np.abs(chw.astype(int) - pil)
            assert diff.max() <= (0 if _plain_pillow_13() else TOLERANCE), (box, out, exact)


def test_into_without_the_extension_is_the_pil_resize_copied_to_chw(monkeypatch):
    img = np.random.default_rng(3).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    box = (1.5, 2.0, 28.0, 19.5)
    want = jpegdecode.resize_box(img, box, (9, 11))
    monkeypatch.setattr(jpegdecode, "native_resize", None)
    dst = np.empty(3 * 9 * 11, np.uint8)
    jpegdecode.resize_box(img, box, (9, 11), into=(dst, 0, False, True))
    assert np.array_equal(dst.reshape(3, 9, 11).transpose(1, 2, 0), want[::-1])


@needs_ext
def test_bad_boxes_and_buffers_are_refused_with_the_values():
    ext = native_jpeg()
    src, dst = np.zeros(10 * 10 * 4, np.uint8), np.zeros(3 * 4 * 4, np.uint8)
    with pytest.raises(ValueError, match=r"resize: box \(0, 0, 11, 10\) of a 10 x 10 x 4"):
        ext.resize(src, 0, 40, 10, 10, 4, 0.0, 0.0, 11.0, 10.0, 4, 4, dst, 0, False, False)
    with pytest.raises(ValueError, match="resize: box"):
        ext.resize(src, 0, 40, 10, 10, 4, 0.0, 0.0, 10.0, 10.0, 4, 4, dst, 1, False, False)
    with pytest.raises(ValueError, match="resize: box"):
        ext.resize(src, 4, 40, 10, 10, 4, 0.0, 0.0, 10.0, 10.0, 4, 4, dst, 0, False, False)
    with pytest.raises(ValueError, match="resize: box"):
        ext.resize(src, 0, 40, 10, 10, 4, float("nan"), 0.0, 10.0, 10.0, 4, 4, dst, 0,
                   False, False)


@needs_ext
@pytest.mark.skipif(os.environ.get("DLPACK_IO_NO_AVX2") is not None, reason="already scalar")
def test_the_scalar_code_gives_the_same_integers():
    """The same tests with the AVX2 passes switched off (what machines without AVX2 run)."""
    env = dict(os.environ, DLPACK_IO_NO_AVX2="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           __file__, "-k", "pillow_13 or matches_the_pil"], env=env,
                          cwd=Path(__file__).parents[2], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-2000:]


@needs_ext
def test_dlpack_io_no_avx2_switches_avx2_off_only_when_set_to_a_true_value():
    """``DLPACK_IO_NO_AVX2=1`` runs the scalar passes; ``0`` or empty is as if unset (it was
    any value at all, so ``=0`` silently switched AVX2 off)."""
    code = "from dlpack_io.reader.format.spec import native_jpeg; print(native_jpeg().resize_isa())"

    def isa(value):
        env = {k: v for k, v in os.environ.items() if k != "DLPACK_IO_NO_AVX2"}
        if value is not None:
            env["DLPACK_IO_NO_AVX2"] = value
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60, check=True).stdout.strip()
    native = isa(None)
    assert native in ("avx2", "scalar")
    assert (isa("1"), isa("yes"), isa("0"), isa("")) == ("scalar", "scalar", native, native)
