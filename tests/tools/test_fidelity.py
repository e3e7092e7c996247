"""Every photo exactly as it was: each decodable JPEG keeps its original bytes and loads back
pixel-identical to Pillow's ``ImageOps.exif_transpose(Image.open(f)).convert("RGB")``,
through ``Dataset[i]`` and through the Loader's decode functions (boxes in the upright
image), with the C decoder and with the PIL fallback. Other formats follow --non-jpeg;
oversized images are rejected by --max-pixels."""
import warnings

import numpy as np
import pytest
from PIL import Image, features

from dlpack_io.reader import Output, Workers
from dlpack_io.packer import convert
from dlpack_io.packer.encode import RESTARTS_ADDED
from dlpack_io.reader import Dataset, jpegdecode
from dlpack_io.reader import format as fmt
from dlpack_io.tools.inspection import record_detail, summary
from dlpack_io.tools.synth import photo_like
from jpegcases import assert_upright_boxes, collection, exif_with, orientation_of, reference, save

FAST = dict(workers=1, progress=False)
BACKENDS = ["c", "pil"] if jpegdecode.have_extension() else ["pil"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fidelity")
    cases = collection()
    for name, data in cases.items():
        (root / "src" / "photos").mkdir(parents=True, exist_ok=True)
        (root / "src" / "photos" / f"{name}.jpg").write_bytes(data)
    out = {}
    for restarts in (False, True):
        dst = root / f"ds-{restarts}"
        out[restarts] = convert(root / "src", dst, jpeg_restarts=restarts, **FAST)
    return root, cases, out


@pytest.mark.parametrize("restarts", [False, True])
def test_every_jpeg_loads_back_exactly_as_pillow_shows_it(packed, restarts, monkeypatch):
    root, cases, results = packed
    dst = root / f"ds-{restarts}"
    assert results[restarts]["rejects"] == 0 and results[restarts]["reencoded"] == {}
    ds = Dataset(dst, verify_checksums=True)
    assert len(ds) == len(cases)
    for backend in BACKENDS:
        if backend == "pil":
            monkeypatch.setattr(jpegdecode, "_jpeg", None)
        for i in range(len(ds)):
            name = record_detail(dst, i)["source"].split("/")[-1][:-4]
            ref = reference(cases[name])
            pixels, _ = ds[i]
            np.testing.assert_array_equal(pixels, ref, err_msg=f"{name} ({backend})")
            payload, entry = ds.record(i)
            assert (int(entry["height"]), int(entry["width"])) == ref.shape[:2]
            if not restarts:
                assert bytes(payload) == cases[name], name  # the original bytes, untouched


def test_counts_and_index_fields(packed):
    root, cases, results = packed
    plain, rewritten = results[False], results[True]
    assert plain["lossless"] == {} and plain["num_samples"] == len(cases)
    # every baseline 3-component file gets a restart marker per MCU (28: 24 rgb*, both
    # restart_*, tiny_o7, bad_orientation_9); gray, CMYK/YCCK and progressive ones are kept
    assert rewritten["lossless"] == {RESTARTS_ADDED: 28}
    st = summary(root / "ds-False")["storage"]
    assert st["original_bytes"] == len(cases) and st["reencoded"] == {}
    rotated = sum(1 for n in cases if n.rsplit("_o", 1)[-1] in "2345678")
    assert st["at_decode"] == {"EXIF orientation applied": rotated,
                               "grayscale to RGB": 9, "CMYK/YCCK to RGB": 4}


@pytest.mark.parametrize("backend", BACKENDS)
def test_region_decode_takes_upright_boxes(packed, backend, monkeypatch):
    """decode_region at full scale with random boxes in the upright image: exactly the
    reference's pixels, for every orientation, colour and subsampling."""
    _, cases, _ = packed
    if backend == "pil":
        monkeypatch.setattr(jpegdecode, "_jpeg", None)
    rng = np.random.default_rng(3)
    for name, data in cases.items():
        assert_upright_boxes(data, reference(data), orientation_of(data), rng, 6, name)


@pytest.mark.skipif(not jpegdecode.have_extension(), reason="needs the C extension")
@pytest.mark.parametrize("n", [1, 2, 4])
def test_reduced_scale_resized_crops_match_between_backends(packed, n, monkeypatch):
    """At reduced DCT scale the C decoder (stored region, then permuted) and PIL (whole
    image transposed) must agree to the pixel: the mirrored axes' sub-pixel offsets agree."""
    _, cases, _ = packed
    big = Image.fromarray(photo_like(np.random.default_rng(5), 101, 157))
    for o in range(1, 9):
        data = save(big, exif=exif_with(o))
        ref = reference(data)
        H, W = ref.shape[:2]
        scratch = np.empty(jpegdecode.scratch_bytes(H, W), np.uint8)
        for box in [(0, 0, H, W), (7, 13, H - 20, W - 30), (H // 2, 1, H // 2, W // 3)]:
            out = (max(1, box[2] * n // 8), max(1, box[3] * n // 8))
            c = jpegdecode.decode_resized(data, box, out, scratch, orientation=o)
            with monkeypatch.context() as m:
                m.setattr(jpegdecode, "_jpeg", None)
                p = jpegdecode.decode_resized(data, box, out, scratch, orientation=o)
            np.testing.assert_array_equal(c[..., :3], p[..., :3], err_msg=f"o{o} {box} n{n}")
            full = np.asarray(Image.fromarray(ref[box[0]:box[0] + box[2], box[1]:box[1] + box[3]])
                              .resize(out[::-1], Image.BILINEAR))
            assert np.abs(full.astype(int) - c[..., :3]).mean() < 8, (o, box, n)


def test_bad_orientation_is_refused():
    data = save(Image.new("RGB", (8, 8)))
    with pytest.raises(ValueError, match="orientation 9"):
        jpegdecode.decode_region(data, (0, 0, 8, 8), 8, np.empty(1024, np.uint8), orientation=9)


FORMATS = {"png": dict(format="PNG"), "webp": dict(format="WEBP", lossless=True),
           "bmp": dict(format="BMP"), "tiff": dict(format="TIFF"), "gif": dict(format="GIF")}
if not features.check("webp"):  # a Pillow(-SIMD) built without libwebp
    del FORMATS["webp"]
N_OTHER = 2 * len(FORMATS) + 1  # each format, each under a lying .jpg name, an RGBA PNG


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """PNG/WebP/BMP/TIFF/GIF files, each also under a lying .jpg name, an RGBA PNG with an
    EXIF orientation, a JPEG named .png, a text file and a JSON file (ignored)."""
    root = tmp_path_factory.mktemp("mixed")
    rgb = Image.fromarray(photo_like(np.random.default_rng(2), 24, 36))
    folder = root / "src" / "x"
    folder.mkdir(parents=True)
    for ext, kw in FORMATS.items():
        (folder / f"a.{ext}").write_bytes(save(rgb, **kw))
        (folder / f"{ext}_lies.jpg").write_bytes(save(rgb, **kw))
    (folder / "rgba_o6.png").write_bytes(save(rgb.convert("RGBA"), format="PNG", exif=exif_with(6)))
    (folder / "jpeg_lies.png").write_bytes(save(rgb, quality=90))
    (folder / "notes.txt").write_text("not an image")
    (folder / "meta.json").write_text("{}")
    return root / "src"


@pytest.mark.parametrize("policy", ["keep", "raw"])
def test_non_jpeg_keep_and_raw_are_lossless(mixed, tmp_path, policy):
    """keep (the default) stores a PNG or WebP smaller than its pixels as its own file,
    the other formats as raw pixels; raw stores every one as raw pixels: the same pixels."""
    result = convert(mixed, tmp_path / "ds", jpeg_restarts=False, non_jpeg=policy, **FAST)
    assert result["rejects"] == 0 and result["reencoded"] == {}
    assert result["ignored"] == {".json": 1, ".txt": 1}
    def kept_as_file(path) -> bool:  # a PNG or WebP smaller than its RGB pixels
        with Image.open(path) as img:
            return policy == "keep" and img.format in ("PNG", "WEBP") and \
                path.stat().st_size < 3 * img.width * img.height
    files = [p for p in (mixed / "x").iterdir() if p.suffix not in (".txt", ".json")]
    kept = sum(kept_as_file(p) for p in files)
    assert kept >= (2 if policy == "keep" else 0)  # the RGBA one is larger than its pixels
    assert sum(result["lossless"].values()) == N_OTHER - kept
    assert result["num_samples"] == N_OTHER + 1
    ds = Dataset(tmp_path / "ds")
    for i in range(len(ds)):
        rel = record_detail(tmp_path / "ds", i)["source"]
        data = (mixed / rel).read_bytes()
        np.testing.assert_array_equal(ds[i][0], reference(data), err_msg=rel)
        kind = int(ds.record(i)[1]["kind"])
        expected = fmt.KIND_JPEG if rel.endswith("jpeg_lies.png") else fmt.KIND_FILE \
            if kept_as_file(mixed / rel) else fmt.KIND_RAW
        assert kind == expected, rel


def test_non_jpeg_jpeg_and_reject_policies(mixed, tmp_path):
    result = convert(mixed, tmp_path / "j", non_jpeg="jpeg", jpeg_restarts=False, **FAST)
    assert sum(result["reencoded"].values()) == N_OTHER and result["lossless"] == {}
    assert result["reencoded"]["GIF image re-encoded as JPEG (--non-jpeg jpeg)"] == 2
    result = convert(mixed, tmp_path / "r", non_jpeg="reject", jpeg_restarts=False, **FAST)
    assert (result["num_samples"], result["rejects"]) == (1, N_OTHER)
    reasons = (tmp_path / "r" / "rejects.tsv").read_text()
    assert "x/png_lies.jpg\tPNG image, not a JPEG (--non-jpeg reject)" in reasons


def test_max_pixels_rejects_before_decoding_and_silences_pillow(tmp_path):
    folder = tmp_path / "src" / "x"
    folder.mkdir(parents=True)
    (folder / "small.jpg").write_bytes(save(Image.new("RGB", (20, 10))))
    (folder / "big.jpg").write_bytes(save(Image.new("RGB", (200, 100))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DecompressionBombWarning (nor any other)
        result = convert(tmp_path / "src", tmp_path / "ds", max_pixels=19_999, **FAST)
    assert (result["num_samples"], result["rejects"]) == (1, 1)
    reasons = (tmp_path / "ds" / "rejects.tsv").read_text()
    assert ("x/big.jpg\t200 x 100 = 20000 pixels is more than --max-pixels 19999 "
            "(decompression bomb guard); raise --max-pixels to pack it") in reasons
    assert Dataset(tmp_path / "ds").manifest["options"]["max_pixels"] == 19_999
    assert fmt.DEFAULT_MAX_PIXELS == Image.MAX_IMAGE_PIXELS  # Pillow's bomb-warning level


def test_old_format_version_names_the_fix(packed, tmp_path):
    import json
    import shutil

    root, _, _ = packed
    shutil.copytree(root / "ds-False", tmp_path / "old")
    path = tmp_path / "old" / "manifest.json"
    m = json.loads(path.read_text())
    m["version"] = 1
    m["checksum"] = fmt.manifest_checksum(m)
    path.write_text(json.dumps(m))
    with pytest.raises(fmt.FormatError, match=r"format version 1, this dlpack reads versions \(2, 3, 4\) "
                                              r".*re-pack it with this dlpack: dlpack convert "
                                              r"SRC DST --overwrite"):
        Dataset(tmp_path / "old")
    m["version"] = 5  # newer than any manifest this dlpack writes (4: retired records)
    m["checksum"] = fmt.manifest_checksum(m)
    path.write_text(json.dumps(m))
    with pytest.raises(fmt.FormatError, match=r"version 5.*reads versions \(2, 3, 4\).*upgrade dlpack"):
        Dataset(tmp_path / "old")


@pytest.mark.parametrize("device_transforms", [False, True])
def test_loader_crops_are_upright(tmp_path, device_transforms):
    """The Loader's crops of EXIF-rotated records equal the same crops of Pillow's upright
    image (CenterCrop: no resampling, so exact), on the host and on the device path."""
    import torch

    from dlpack_io.reader import CenterCrop, Loader

    rng = np.random.default_rng(9)
    folder = tmp_path / "src" / "x"
    folder.mkdir(parents=True)
    for o in range(1, 9):  # stored so that every image is 30 x 40 when upright
        px = photo_like(rng, 40, 30) if o >= 5 else photo_like(rng, 30, 40)
        (folder / f"o{o}.jpg").write_bytes(save(Image.fromarray(px), exif=exif_with(o)))
    ds = Dataset(convert(tmp_path / "src", tmp_path / "ds", **FAST)["dst"])
    loader = Loader(ds, batch_size=8, shuffle=False, num_workers=0,
                    output=Output(return_index=True),
                    workers=Workers(device_transforms=device_transforms),
                    transforms=[CenterCrop(20)], dtype=torch.uint8)
    images, _, indices = next(iter(loader))
    for img, i in zip(images.numpy(), indices.tolist()):
        rel = record_detail(tmp_path / "ds", i)["source"]
        ref = reference((tmp_path / "src" / rel).read_bytes())[5:25, 10:30]
        np.testing.assert_array_equal(img.transpose(1, 2, 0), ref, err_msg=rel)


def test_cli_summary_counts_kept_lossless_reencoded_ignored(mixed, tmp_path):
    from click.testing import CliRunner

    from dlpack_io.tools.cli import main

    dst = str(tmp_path / "ds")
    result = CliRunner().invoke(main, ["convert", str(mixed), dst, "--quiet", "--workers", "1",
                                       "--no-restart-markers", "--non-jpeg", "jpeg"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].startswith(f"original bytes kept: 1; transformed losslessly: 0; "
                               f"re-encoded: {N_OTHER} (")
    assert lines[2:] == ["skipped 0", "ignored 2 files without an image suffix (.json 1, .txt 1)"]
    shown = CliRunner().invoke(main, ["inspect", dst]).output
    assert "stored        1 with their original bytes" in shown
    assert f"              {N_OTHER} re-encoded" in shown
