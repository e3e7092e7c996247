"""Our Huffman decoder (reader/_huffman.c), which takes baseline scans over from libjpeg's:
the same coefficients, so the same pixels to the bit, for every kind of JPEG the reader
meets; damaged scans handed back to libjpeg (the same pixels, or the same error); and the
switch that leaves every scan to libjpeg."""
import io

import numpy as np
import pytest
from PIL import Image

from dlpack_io.reader import jpegdecode
from dlpack_io.tools.synth import photo_like
from jpegcases import collection

pytestmark = pytest.mark.skipif(not jpegdecode.have_extension(),
                                reason="C extension dlpack_io.reader._jpeg not built")
_jpeg = jpegdecode._jpeg


def _save(px, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "JPEG", **kw)
    return buf.getvalue()


def _cases() -> dict:
    """name -> JPEG: photo-like, noise and stripes (long codes, 10-bit AC values), every
    subsampling, Pillow's standard and optimized tables, restart intervals of every kind,
    and the reader's collection (EXIF, grey, CMYK, YCCK, progressive: left to libjpeg)."""
    rng = np.random.default_rng(5)
    photo, noise = photo_like(rng, 83, 121), rng.integers(0, 256, (37, 51, 3), dtype=np.uint8)
    cases = {}
    for sub in (0, 1, 2):
        cases[f"photo-q90-{sub}"] = _save(photo, quality=90, subsampling=sub)
        cases[f"noise-q100-{sub}"] = _save(noise, quality=100, subsampling=sub)
        cases[f"photo-q30-opt-{sub}"] = _save(photo, quality=30, subsampling=sub, optimize=True)
    cases["noise-q100-opt"] = _save(noise, quality=100, optimize=True)
    # pixel-wide stripes and checks: AC values of 10 bits (|v| >= 512) and long codes
    checks = (np.indices((40, 56)).sum(0) % 2 * 255).astype(np.uint8)
    stripes = np.broadcast_to((np.arange(56) % 2 * 255).astype(np.uint8), (40, 56))
    cases["checks-q100"] = _save(np.dstack([checks, stripes, 255 - checks]), quality=100)
    cases["gray-noise-q100"] = _save(noise[..., 0], quality=100)
    for name, data in list(cases.items()):
        for interval in (0, 1, 2, 3):  # 0: one per MCU; 3 does not divide the MCU row
            rewritten = _jpeg.add_restarts(data, interval)  # None: grey is left as it is
            if rewritten is not None:
                cases[f"{name}-rst{interval}"] = rewritten
    cases["gray-noise-q100-rst-1-block"] = _save(noise[..., 0], quality=100,
                                                 restart_marker_blocks=1)
    cases["photo-rst-rows"] = _save(photo, quality=95, restart_marker_rows=1)
    cases["photo-rst-7-blocks"] = _save(photo, quality=95, restart_marker_blocks=7)
    cases.update(collection())
    return cases


CASES = _cases()


def _decode(data, box, scale):
    h, w, _ = _jpeg.header(data)
    out = np.full(h * w * 4 + 64, 7, np.uint8)
    got = jpegdecode._jpeg.decode_region(data, out, *box, scale, 3)
    return got, out


@pytest.fixture
def libjpeg_only():
    """Runs the test's body with our decoder switched off; restores it after."""
    was = _jpeg.fast_huffman(False)
    yield
    _jpeg.fast_huffman(was)


def _both(data, box, scale):
    """decode_region of box with our decoder, then with libjpeg's alone."""
    was = _jpeg.fast_huffman(True)
    try:
        ours = _decode(data, box, scale)
        _jpeg.fast_huffman(False)
        theirs = _decode(data, box, scale)
    finally:
        _jpeg.fast_huffman(was)
    return ours, theirs


@pytest.mark.parametrize("name", sorted(CASES))
def test_pixels_are_libjpegs_to_the_bit(name):
    data = CASES[name]
    h, w, _ = _jpeg.header(data)
    rng = np.random.default_rng(len(data))
    boxes = [(0, 0, h, w)] + [
        (t, l, int(rng.integers(1, h - t + 1)), int(rng.integers(1, w - l + 1)))
        for t, l in zip(rng.integers(0, h, 5).tolist(), rng.integers(0, w, 5).tolist())]
    for box in boxes:
        for scale in (8, 4, 1, 3):
            (got, a), (want, b) = _both(data, box, scale)
            assert got == want, (name, box, scale)
            assert np.array_equal(a, b), (name, box, scale)


def test_it_takes_every_baseline_scan_and_leaves_the_rest():
    taken0, refused0 = _jpeg.fast_huffman_counts()
    baseline = [n for n in CASES if "progressive" not in n]
    for name in baseline:
        h, w, _ = _jpeg.header(CASES[name])
        _decode(CASES[name], (0, 0, h, w), 8)
    taken1, refused1 = _jpeg.fast_huffman_counts()
    assert (taken1 - taken0, refused1 - refused0) == (len(baseline), 0)
    for name in CASES:
        if "progressive" in name:
            h, w, _ = _jpeg.header(CASES[name])
            _decode(CASES[name], (0, 0, h, w), 8)
    assert _jpeg.fast_huffman_counts() == (taken1, refused1)


def test_the_switch_leaves_every_scan_to_libjpeg(libjpeg_only):
    before = _jpeg.fast_huffman_counts()
    data = CASES["photo-q90-2-rst0"]
    _decode(data, (0, 0, *_jpeg.header(data)[:2]), 8)
    assert _jpeg.fast_huffman() is False
    assert _jpeg.fast_huffman_counts() == before


def _intervals(data: bytes):
    """(start, end) of each restart interval's entropy-coded bytes."""
    at = data.rfind(b"\xff\xda")
    start = at + 2 + int.from_bytes(data[at + 2:at + 4], "big")
    out, p = [], start
    while True:
        q = data.find(b"\xff", p)
        if data[q + 1] == 0:
            p = q + 2
            continue
        out.append((start, q))
        if not 0xD0 <= data[q + 1] <= 0xD7:
            return out
        start = p = q + 2


def test_a_code_that_is_no_code_goes_back_to_libjpeg():
    """An interval overwritten with one-bits (FF 00 stuffed): no Huffman code is all ones,
    so ours refuses the scan and libjpeg conceals the damage as it always did."""
    data = bytearray(CASES["photo-q90-2-rst0"])
    start, end = _intervals(bytes(data))[10]
    data[start:end] = b"\xff\x00" * ((end - start) // 2) + b"\xff" * ((end - start) % 2 == 1)
    data = bytes(data)
    h, w, _ = _jpeg.header(data)
    before = _jpeg.fast_huffman_counts()
    (got, a), (want, b) = _both(data, (0, 0, h, w), 8)
    taken, refused = np.subtract(_jpeg.fast_huffman_counts(), before)
    assert (taken, refused) == (1, 1)
    assert got == want and np.array_equal(a, b)


def test_a_scan_without_its_markers_is_left_to_libjpeg():
    """A missing RST marker, one out of order, or a scan cut short: libjpeg's own handling
    (resynchronising, or the truncation error) for each, and ours never starts."""
    data = CASES["photo-q90-2-rst0"]
    cuts = _intervals(data)
    missing = data[:cuts[4][1]] + data[cuts[5][0]:]  # RST4 dropped
    swapped = bytearray(data)
    swapped[cuts[4][1] + 1] = 0xD6  # RST4 numbered 6
    truncated = data[:cuts[20][1] - 5]
    for damaged in (missing, bytes(swapped), truncated):
        h, w, _ = _jpeg.header(damaged)
        before = _jpeg.fast_huffman_counts()
        outcomes = []
        for on in (True, False):
            was = _jpeg.fast_huffman(on)
            try:
                outcomes.append(_decode(damaged, (0, 0, h, w), 8))
            except ValueError as e:
                outcomes.append(str(e))
            finally:
                _jpeg.fast_huffman(was)
        assert _jpeg.fast_huffman_counts() == before
        if isinstance(outcomes[0], str):
            assert outcomes[0] == outcomes[1] and "truncated" in outcomes[0].lower()
        else:
            assert outcomes[0][0] == outcomes[1][0]
            assert np.array_equal(outcomes[0][1], outcomes[1][1])


def _planes_both(data):
    """to_planes (packed and plain) with our decoder, then with libjpeg's alone."""
    was = _jpeg.fast_huffman(True)
    try:
        ours = [_jpeg.to_planes(data, 1 << 40, packed) for packed in (True, False)]
        _jpeg.fast_huffman(False)
        theirs = [_jpeg.to_planes(data, 1 << 40, packed) for packed in (True, False)]
    finally:
        _jpeg.fast_huffman(was)
    return ours, theirs


def test_decoded_planes_are_libjpegs_to_the_bit():
    """The packer's --mode planes decodes with ours too: the same planes, byte for byte."""
    kept = 0
    for name in sorted(CASES):
        before = _jpeg.fast_huffman_counts()
        ours, theirs = _planes_both(CASES[name])
        assert ours == theirs, name
        if ours[0] is not None:
            kept += 1
            if "progressive" not in name:  # every baseline scan was ours (twice each way)
                assert np.subtract(_jpeg.fast_huffman_counts(), before).tolist() == [2, 0], name
    assert kept > 20


def test_damaged_planes_go_back_to_libjpeg():
    data = bytearray(CASES["photo-q90-2-rst0"])
    start, end = _intervals(bytes(data))[10]
    data[start:end] = b"\xff\x00" * ((end - start) // 2) + b"\xff" * ((end - start) % 2 == 1)
    before = _jpeg.fast_huffman_counts()
    ours, theirs = _planes_both(bytes(data))
    assert np.subtract(_jpeg.fast_huffman_counts(), before).tolist() == [2, 2]
    assert ours == theirs and ours[0] is not None


def test_an_interval_short_of_bits_goes_back_to_libjpeg():
    """Intervals whose last bytes are cut off (their markers kept): decoding runs past the
    end, where libjpeg reads zeros after a warning; ours notices (or meets a code that is no
    code in what follows) and hands the scan back: libjpeg's pixels every time."""
    data = CASES["photo-q90-2-rst0"]
    h, w, _ = _jpeg.header(data)
    cuts = _intervals(data)
    before = _jpeg.fast_huffman_counts()
    tried = 0
    for at in range(4, 16):
        start, end = cuts[at]
        for cut in (1, 2, 3, 5, 8):
            if end - cut <= start:
                continue
            short = data[:end - cut] + data[end:]
            (got, a), (want, b) = _both(short, (0, 0, h, w), 8)
            assert got == want and np.array_equal(a, b), (at, cut)
            tried += 1
    taken, refused = np.subtract(_jpeg.fast_huffman_counts(), before)
    assert taken == tried and refused > tried // 2
