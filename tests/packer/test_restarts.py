"""--restart-markers: the lossless rewrite with a restart marker every few MCUs (packer), and
the region decoder's fast path that decodes only the restart intervals a box needs."""
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from dlpack_io.reader import Dataset, Workers, jpegdecode
from dlpack_io.packer import convert
from dlpack_io.packer.encode import RESTARTS_ADDED, encode_file
from dlpack_io.packer.options import PackOptions
from dlpack_io.tools.synth import photo_like

pytestmark = pytest.mark.skipif(not jpegdecode.have_extension(),
                                reason="C extension dlpack_io.reader._jpeg not built")

H, W = 203, 157  # not multiples of 16: partial last MCU row and column


def _jpeg(h=H, w=W, seed=0, subsampling=2, progressive=False, restarts=False) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo_like(np.random.default_rng(seed), h, w)).save(
        buf, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)
    data = buf.getvalue()
    return jpegdecode._jpeg.add_restarts(data) if restarts else data


def _pixels(data, n=8) -> np.ndarray:
    img = Image.open(io.BytesIO(data))
    if n < 8:
        img.draft("RGB", (img.width // (8 // n), img.height // (8 // n)))
    return np.asarray(img.convert("RGB"))


def _restart_interval(data: bytes):
    i = data.find(b"\xff\xdd")
    return None if i < 0 else int.from_bytes(data[i + 4:i + 6], "big")


# (subsampling, width, restart interval asked (0: the default, 1 MCU)); 157 px = 10 MCUs
# of 16 or 20 of 8; 205 px = 13 MCUs of 16. 10 and 13: one interval per MCU row (the
# decoder then skips rows only); 3 does not divide the row (the decoder decodes it all).
@pytest.fixture(scope="module", params=[(2, 157, 0), (1, 205, 0), (0, 157, 2), (2, 157, 10),
                                        (2, 205, 13), (2, 157, 3)],
                ids=["420", "422-w205", "444-every2", "420-rows", "420-w205-rows", "420-every3"])
def pair(request):
    """(original, rewritten, width) JPEG bytes of one image."""
    sub, w, interval = request.param
    original = _jpeg(w=w, seed=sub, subsampling=sub)
    rewritten = jpegdecode._jpeg.add_restarts(original, interval)
    assert _restart_interval(rewritten) == (interval or 1)
    assert jpegdecode._jpeg.add_restarts(rewritten, interval) is None  # already so: kept
    return original, rewritten, w


def test_rewrite_is_lossless(pair):
    original, rewritten, _ = pair
    assert rewritten is not None and rewritten != original
    assert np.array_equal(_pixels(rewritten), _pixels(original))
    for n in (1, 2, 4):  # the DCT coefficients are the same, so every scale is too
        assert np.array_equal(_pixels(rewritten, n), _pixels(original, n))
    assert _restart_interval(original) is None


def test_rewrite_is_deterministic_and_kept_when_already_done():
    original = _jpeg(seed=9)
    rewritten = jpegdecode._jpeg.add_restarts(original)
    assert jpegdecode._jpeg.add_restarts(original) == rewritten
    assert jpegdecode._jpeg.add_restarts(rewritten) is None


def test_progressive_is_left_alone_and_broken_data_raises():
    assert jpegdecode._jpeg.add_restarts(_jpeg(progressive=True)) is None
    good = _jpeg()
    with pytest.raises(ValueError, match="truncated"):
        jpegdecode._jpeg.add_restarts(good[:len(good) // 2])
    with pytest.raises(ValueError, match="JPEG decode error: JPEG datastream contains no image"):
        jpegdecode._jpeg.add_restarts(b"\xff\xd8\xff\xe0 not a jpeg at all")


def _boxes(W):
    yield from [(0, 0, H, W), (H - 1, W - 1, 1, 1), (H - 1, 0, 1, W), (0, W - 1, H, 1),
                (16, 0, 16, W), (32, 8, 1, 1), (31, 5, 2, 40), (48, 0, H - 48, W),
                (100, 60, 103, 97), (190, 100, 13, 57), (15, 15, 170, 120), (0, 0, 1, 1),
                (0, 48, 20, 17), (0, W - 16, H, 16), (40, 32, 64, 64), (40, 31, 66, 66),
                (H - 16, W - 17, 16, 17), (100, 0, 50, 15), (32, 16, 32, 32), (48, 48, 16, 16),
                (17, 17, 15, 15), (16, 16, 1, 1), (31, 31, 1, 1), (15, 15, 2, 2),
                (64, 0, 64, W), (0, 64, H, 64), (24, 24, 48, 48), (33, 33, 30, 30)]
    gen = np.random.default_rng(W)
    for _ in range(60):
        t, l = int(gen.integers(0, H)), int(gen.integers(0, W))
        yield t, l, int(gen.integers(1, H - t + 1)), int(gen.integers(1, W - l + 1))


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("pixel_size", [3, 4])
def test_region_of_rewritten_file_is_bit_identical(pair, n, pixel_size):
    """The fast path (only the restart intervals around the box) gives the box's pixels
    exactly as the whole-stream decode of the original file, which equals PIL's decode."""
    original, rewritten, W = pair
    ref = _pixels(original, n)
    a = np.empty(jpegdecode.scratch_bytes(H, W), np.uint8)
    b = np.empty_like(a)
    for box in _boxes(W):
        t, l, h, w = box
        ys, ye = t * n // 8, -(-(t + h) * n // 8)
        xs, xe = l * n // 8, -(-(l + w) * n // 8)
        for data, out in ((rewritten, a), (original, b)):
            r = jpegdecode.decode_region(data, box, n, out, pixel_size)
            assert r.y0 <= ys and r.x0 <= xs and r.pixels.shape[2] == pixel_size
            got = r.pixels[ys - r.y0:ye - r.y0, xs - r.x0:xe - r.x0, :3]
            assert np.array_equal(got, ref[ys:ye, xs:xe]), box


def test_raw_extension_result_reports_full_image_geometry(pair):
    _, rewritten, W = pair
    out = np.empty(jpegdecode.scratch_bytes(H, W), np.uint8)
    y0, x0, rows, cols, sh, sw, ih, iw = jpegdecode._jpeg.decode_region(rewritten, out, 150, 0,
                                                                        53, W, 4)
    assert (sh, sw) == (-(-H * 4 // 8), -(-W * 4 // 8)) and (ih, iw) == (H, W)
    assert y0 == 75 and y0 + rows == sh and (x0, cols) == (0, sw)
    y0, x0, rows, cols, sh2, sw2, _, _ = jpegdecode._jpeg.decode_region(rewritten, out, 60, 70,
                                                                        9, 9, 8)
    assert (sh2, sw2) == (H, W) and y0 == 60 and x0 <= 69 and x0 + cols >= 80 and rows == 9


def test_truncated_rewritten_file_raises():
    data = _jpeg(restarts=True)
    out = np.empty(jpegdecode.scratch_bytes(H, W), np.uint8)
    for cut in (len(data) // 2, len(data) - 40):
        with pytest.raises(ValueError, match="truncated JPEG data: Premature end of JPEG file"):
            jpegdecode.decode_region(data[:cut], (H - 10, 0, 10, W), 8, out)


def test_encode_file_rewrites_only_sequential_jpegs():
    rec = encode_file(_jpeg(), mode="jpeg", restarts=True)
    assert rec.lossless == RESTARTS_ADDED and rec.reencoded is None and _restart_interval(rec.payload)
    assert (rec.height, rec.width) == (H, W)
    prog = _jpeg(progressive=True)
    rec = encode_file(prog, mode="jpeg", restarts=True)
    assert rec.is_passthrough and rec.payload == prog
    assert encode_file(_jpeg(), mode="jpeg").is_passthrough  # off by default
    with pytest.raises(ValueError, match="mode jpeg"):
        PackOptions(mode="raw", size=32, jpeg_restarts=True)


def _shards(dst):
    return {name: open(os.path.join(dst, name), "rb").read() for name in sorted(os.listdir(dst))
            if name not in ("manifest.json", "inputstat.json")}  # both name the run


def test_convert_with_restart_rows(image_folder, odd_folder, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    res = convert(image_folder, a, jpeg_restarts=True, workers=1, progress=False)
    convert(image_folder, b, jpeg_restarts=True, workers=2, progress=False)
    assert _shards(a) == _shards(b)  # worker-count independent
    manifest = json.loads((a / "manifest.json").read_text())
    assert manifest["options"]["jpeg_restarts"] is True
    assert manifest["lossless"] == {RESTARTS_ADDED: 24} == res["lossless"]
    plain = Dataset(convert(image_folder, tmp_path / "plain", workers=1, progress=False)["dst"])
    ds = Dataset(a)
    assert len(ds) == len(plain) == 24
    for i in range(len(ds)):
        (x, lx), (y, ly) = ds[i], plain[i]
        assert lx == ly and np.array_equal(x, y)
    root, kinds = odd_folder
    res = convert(root, tmp_path / "odd", jpeg_restarts=True, workers=1, progress=False)
    png = next(p for p in root.rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x89PNG")
    with Image.open(png) as img:  # kept as its own file (kind 2) when smaller than its pixels
        as_raw = png.stat().st_size >= 3 * img.width * img.height
    assert res["lossless"] == {RESTARTS_ADDED: 2, **({"PNG image stored as raw pixels": 1}
                                                     if as_raw else {})}
    assert res["reencoded"] == {}  # baseline + EXIF-rotated rewritten; the others kept
    assert res["rejects"] == 3  # truncated, zero bytes, not an image
    odd = Dataset(tmp_path / "odd")
    for i in range(len(odd)):
        img, _ = odd[i]
        assert img.ndim == 3 and img.shape[2] == 3


def test_loader_batches_are_identical_with_restart_markers(tmp_path):
    """End to end: the Loader's random-resized crops (host path) over a data set packed
    with --restart-markers equal those over the same images packed as they are."""
    import torch

    from dlpack_io.reader import Loader, RandomHorizontalFlip, RandomResizedCrop
    from dlpack_io.tools.synth import make_image_folder

    make_image_folder(tmp_path / "src", 24, 2, seed=4, size=(150, 200))
    out = {}
    for name, restarts in (("plain", False), ("rst", True)):
        convert(tmp_path / "src", tmp_path / name, jpeg_restarts=restarts, workers=1,
                progress=False)
        for reduced in (True, False):
            loader = Loader(Dataset(tmp_path / name), batch_size=8, num_workers=2, seed=3,
                            transforms=[RandomResizedCrop(40), RandomHorizontalFlip()],
                            workers=Workers(reduced_decode=reduced))
            out[name, reduced] = [(x.clone(), y.clone()) for x, y in loader]
    for reduced in (True, False):
        a, b = out["plain", reduced], out["rst", reduced]
        assert len(a) == len(b) == 3
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_cli_convert_restart_markers(image_folder, tmp_path):
    from click.testing import CliRunner

    from dlpack_io.tools.cli import main

    res = CliRunner().invoke(main, ["convert", str(image_folder), str(tmp_path / "d"),
                                    "--restart-markers", "--quiet", "--workers", "1"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["options"]["jpeg_restarts"] is True
    res = CliRunner().invoke(main, ["convert", str(image_folder), str(tmp_path / "r"),
                                    "--restart-markers", "--mode", "raw", "--size", "32"])
    assert res.exit_code != 0 and "needs --mode jpeg" in res.output
    assert "--restart-markers" in CliRunner().invoke(main, ["convert", "--help"]).output


def _scan_start(data: bytes) -> int:
    return data.find(b"\xff\xda")


@pytest.mark.parametrize("kw", [dict(subsampling=2), dict(subsampling=1), dict(subsampling=0),
                                dict(subsampling=2, optimize=True), dict(subsampling=2, quality=50)])
def test_fast_rewrite_keeps_headers_and_pixels(kw):
    """The bit-copying rewrite: bytes before SOS unchanged (EXIF, tables...), a DRI segment
    inserted right before SOS, bytes after the scan (EOI + trailing data) unchanged, same
    pixels; same pixels as the libjpeg transcode."""
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    Image.fromarray(_pixels(_jpeg(w=157, seed=4))).save(out, format="JPEG", exif=exif, **kw)
    original = out.getvalue() + b"trailing bytes after EOI"
    fast = jpegdecode._jpeg.add_restarts(original, 0, True)
    slow = jpegdecode._jpeg.add_restarts(original, 0, False)
    assert np.array_equal(_pixels(fast), _pixels(original))
    assert np.array_equal(_pixels(slow), _pixels(original))
    sos = _scan_start(original)
    if fast != slow:  # the fast path wrote it (else its DC table lacked a code: libjpeg did)
        assert fast[:sos] == original[:sos]
        assert fast[sos:sos + 6] == b"\xff\xdd\x00\x04\x00\x01"
        assert fast.endswith(b"\xff\xd9trailing bytes after EOI")
    if not kw.get("optimize"):  # standard tables code every DC value: always the fast path
        assert fast != slow and len(fast) < len(original) * 1.2  # 8x8 MCUs (4:4:4) cost most


def test_fast_rewrite_rejects_damage_like_libjpeg():
    good = _jpeg(w=157, seed=2)
    sos = _scan_start(good)
    with pytest.raises(ValueError, match="truncated JPEG data: Premature end of JPEG file"):
        jpegdecode._jpeg.add_restarts(good[:sos + 200])  # truncated inside the scan
    rng = np.random.default_rng(0)
    for _ in range(200):  # flipped bits: never a crash; either rewritten or an error
        data = bytearray(good)
        pos = int(rng.integers(sos + 20, len(data) - 2))
        data[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            out = jpegdecode._jpeg.add_restarts(bytes(data))
        except ValueError:
            continue
        assert out is None or out[:2] == b"\xff\xd8"
