"""--mode planes: each JPEG stored as its decoded Y/Cb/Cr planes (KIND_PLANES) loads back to
the very pixels of its JPEG, through Dataset[i], the region decoder (every orientation,
subsampling, grey, progressive) and the Loader (threads and processes, record and LMDB),
batch for batch equal to jpeg mode's; what planes cannot reproduce is stored as jpeg or raw
mode stores it; a hostile planes record is refused by name, behind a valid checksum."""
import io
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dlpack_io.packer import convert
from dlpack_io.packer.encode import PLANES_KEPT
from dlpack_io.reader import (Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop, Resize,
                              CenterCrop, jpegdecode)
from dlpack_io.reader import format as fmt
from dlpack_io.tools.inspection import record_detail, summary
from dlpack_io.tools.synth import photo_like

from crafted import assert_refused, one_record_shard, run_consumers
from jpegcases import (assert_upright_boxes, collection, orientation_of, random_boxes, reference,
                       save)

pytestmark = pytest.mark.skipif(not jpegdecode.have_extension(),
                                reason="decoded planes need the C extension")
FAST = dict(workers=1, progress=False)
_jpeg = jpegdecode._jpeg


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The fidelity collection (every orientation, colour, subsampling) plus a PNG and a
    photo over --max-side, packed in jpeg and planes modes."""
    root = tmp_path_factory.mktemp("planes")
    cases = collection()
    photos = root / "src" / "photos"
    photos.mkdir(parents=True)
    for name, data in cases.items():
        (photos / f"{name}.jpg").write_bytes(data)
    rng = np.random.default_rng(4)
    (photos / "drawing.png").write_bytes(save(Image.fromarray(photo_like(rng, 30, 41)),
                                              format="PNG"))
    (photos / "big.jpg").write_bytes(save(Image.fromarray(photo_like(rng, 90, 130))))
    results = {mode: convert(root / "src", root / mode, mode=mode, max_side=100, **FAST)
               for mode in ("jpeg", "planes")}
    return root, cases, results


def _names(dst):
    return [record_detail(dst, i)["source"].split("/")[-1] for i in range(len(Dataset(dst)))]


def test_planes_records_hold_the_jpeg_pixels_and_the_rest_falls_back(packed):
    root, cases, results = packed
    ds = Dataset(root / "planes", verify_checksums=True)
    kinds = {}
    for i, name in enumerate(_names(root / "planes")):
        pixels, _ = ds[i]
        payload, entry = ds.record(i)
        kinds[name] = int(entry["kind"])
        if name in ("drawing.png", "big.jpg"):
            continue
        np.testing.assert_array_equal(pixels, reference(cases[name[:-4]]), err_msg=name)
    # CMYK/YCCK have no planes the reader converts: stored as jpeg mode stores them
    for name in ("cmyk.jpg", "ycck.jpg", "cmyk_o6.jpg", "ycck_o3.jpg"):
        assert kinds.pop(name) == fmt.KIND_JPEG, name
    # another format and a JPEG over --max-side: raw pixels, as raw mode stores them
    assert kinds.pop("drawing.png") == fmt.KIND_RAW and kinds.pop("big.jpg") == fmt.KIND_RAW
    assert ds[_names(root / "planes").index("big.jpg")][0].shape == (69, 100, 3)
    # tiny_o7 (3 x 2 pixels: a 4:2:0 width libjpeg upsamples without its fancy filter)
    # falls back too; every other JPEG is a planes record
    assert kinds.pop("tiny_o7.jpg") == fmt.KIND_JPEG
    assert set(kinds.values()) == {fmt.KIND_PLANES}, kinds
    planes = results["planes"]
    assert planes["lossless"] == {PLANES_KEPT: len(kinds)}
    assert planes["reencoded"] == {"resized (--max-side), stored as raw pixels": 1}
    assert summary(root / "planes")["mode"] == "planes"
    assert summary(root / "planes")["storage"]["planes_records"] == len(kinds)


def unpack_reference(payload: bytes) -> tuple[tuple, list]:
    """The header and the planes of a packed (version 2) payload, decoded from the layout
    reader/format/spec.py states, in numpy: 8x8 blocks in raster order, per plane a table of
    minimums, a table of widths, then each block's 64 values of w bits, LSB first."""
    head = fmt.PLANES_HEADER.unpack_from(payload)
    _, version, comps, hs, vs, h, w = head
    assert version == fmt.PLANES_PACKED
    sides = [(h, w)] + [(-(-h // vs), -(-w // hs))] * (comps - 1)
    at, planes, n = fmt.PLANES_HEADER.size, [], fmt.PLANES_BLOCK
    for ph, pw in sides:
        by, bx = -(-ph // n), -(-pw // n)
        mins = np.frombuffer(payload, np.uint8, by * bx, at).astype(np.int64)
        widths = np.frombuffer(payload, np.uint8, by * bx, at + by * bx).astype(np.int64)
        at += 2 * by * bx
        full = np.zeros((by * n, bx * n), np.int64)
        for k, (m, wd) in enumerate(zip(mins, widths)):
            bits = np.unpackbits(np.frombuffer(payload, np.uint8, 8 * wd, at),
                                 bitorder="little")
            values = (bits.reshape(64, wd) << np.arange(wd)).sum(1) if wd else np.zeros(64)
            full[k // bx * n:(k // bx + 1) * n, k % bx * n:(k % bx + 1) * n] = \
                np.minimum(255, m + values.reshape(n, n))
            at += 8 * wd
        planes.append(full[:ph, :pw].astype(np.uint8))
    assert at == len(payload)
    return head, planes


def test_payload_header_is_the_spec_and_sizes_are_exact(packed):
    """The packer's payload (version 2) unpacks, by the spec's layout, to the very planes
    of the plain layout (version 1), whose length is planes_payload_size."""
    _, cases, _ = packed
    for name, subs in (("rgb420_o1", (2, 2)), ("rgb422_o1", (2, 1)), ("rgb444_o1", (1, 1)),
                       ("gray_o1", (1, 1)), ("rgb420_o6", (2, 2))):
        data = cases[name]
        h, w, comps = _jpeg.header(data)
        plain = _jpeg.to_planes(data, 1 << 40, False)
        assert plain[:fmt.PLANES_HEADER.size] == fmt.PLANES_HEADER.pack(
            fmt.PLANES_MAGIC, fmt.PLANES_PLAIN, comps, *subs, h, w), name
        assert len(plain) == fmt.planes_payload_size(comps, *subs, h, w), name
        head, planes = unpack_reference(_jpeg.to_planes(data, 1 << 40))
        assert head == (fmt.PLANES_MAGIC, fmt.PLANES_PACKED, comps, *subs, h, w), name
        np.testing.assert_array_equal(np.concatenate([p.ravel() for p in planes]),
                                      np.frombuffer(plain, np.uint8, -1, fmt.PLANES_HEADER.size),
                                      err_msg=name)
        # the Y plane is libjpeg's own luma: grey JPEGs decode to it exactly
        if comps == 1:
            np.testing.assert_array_equal(planes[0], np.asarray(Image.open(io.BytesIO(data))))
    assert _jpeg.to_planes(cases["cmyk"], 1 << 40) is None
    with pytest.raises(ValueError, match="claims 45 x 70 pixels, more than the 100"):
        _jpeg.to_planes(cases["rgb420_o1"], 100)


def test_packed_and_plain_planes_give_the_same_boxes():
    """Both layouts, every subsampling, sides on and off the 8x8 grid: every box that
    starts or ends at an edge or a block boundary, and random ones, RGB and RGBX."""
    rng = np.random.default_rng(30)
    for h, w in [(17, 33), (8, 8), (9, 5), (1, 9), (40, 57), (64, 48), (23, 71)]:
        img = Image.fromarray(photo_like(rng, h, w))
        for sub in (0, 1, 2):
            data = save(img, quality=95, subsampling=sub)
            plain, packed = _jpeg.to_planes(data, 1 << 40, False), _jpeg.to_planes(data, 1 << 40)
            if plain is None:
                continue
            edges = sorted({0, 1, 7, 8, 9, 15, 16, 17} & set(range(h))) + [h - 1]
            cols = sorted({0, 1, 7, 8, 9, 15, 16, 17} & set(range(w))) + [w - 1]
            boxes = [(t, l, b - t + 1, r - l + 1) for t in edges for b in edges if b >= t
                     for l in cols[:3] for r in cols[-3:] if r >= l]
            boxes += list(random_boxes(rng, h, w, 20))
            for box in boxes:
                for ps in (3, 4):
                    a, b = (np.zeros(h * w * ps, np.uint8) for _ in range(2))
                    assert _jpeg.decode_region(plain, a, *box, 8, ps, 1) == \
                        _jpeg.decode_region(packed, b, *box, 8, ps, 1)
                    np.testing.assert_array_equal(a, b, err_msg=f"{h}x{w} sub {sub} {box}")


def test_packed_samples_saturate_at_255():
    """A block whose minimum plus value passes 255 (no packer writes one; a crafted record
    may) gives 255 in every path: the AVX2 blocks, the plain tail and the scalar build."""
    rng = np.random.default_rng(32)
    blocks, width = 8, 3
    values = rng.integers(0, 1 << width, (blocks, 64))
    bits = b"".join(np.packbits(((v[:, None] >> np.arange(width)) & 1).astype(np.uint8).ravel(),
                                bitorder="little").tobytes() for v in values)
    payload = (fmt.PLANES_HEADER.pack(fmt.PLANES_MAGIC, fmt.PLANES_PACKED, 1, 1, 1, 8, 8 * blocks)
               + bytes(250 - k for k in range(blocks)) + bytes([width]) * blocks + bits)
    _, (want,) = unpack_reference(payload)
    assert want.max() == 255 and (want == 255).sum() > 20
    out = np.zeros(8 * 8 * blocks * 3, np.uint8)
    _jpeg.decode_region(payload, out, 0, 0, 8, 8 * blocks, 8, 3, 1)
    np.testing.assert_array_equal(out.reshape(8, 8 * blocks, 3)[..., 0], want)


def ycc_to_rgb_reference(y, cb, cr) -> np.ndarray:
    """jdcolor.c's YCbCr -> RGB as its tables state it (build_ycc_rgb_table: SCALEBITS 16,
    FIX(x) = round(x * 65536), arithmetic right shifts, the range limit), in int64 numpy."""
    y, b, r = (np.asarray(a, np.int64) for a in (y, cb, cr))
    b, r = b - 128, r - 128
    red = y + ((91881 * r + 32768) >> 16)                  # Cr_r_tab
    green = y + ((-22554 * b + 32768 - 46802 * r) >> 16)   # Cb_g_tab + Cr_g_tab
    blue = y + ((116130 * b + 32768) >> 16)                # Cb_b_tab
    return np.clip(np.stack([red, green, blue], -1), 0, 255).astype(np.uint8)


def test_every_ycc_triple_converts_as_libjpeg_does():
    """All 2**24 (Y, Cb, Cr) triples of a 4:4:4 record, RGB and RGBX (the AVX2 kernel's
    output where the CPU has it; width 4099 also leaves a tail for the scalar code), give
    jdcolor.c's pixels exactly."""
    h, w = 4093, 4099
    p = np.arange(h * w, dtype=np.int64) % (1 << 24)
    planes = [(p & 255).astype(np.uint8), ((p >> 8) & 255).astype(np.uint8),
              (p >> 16).astype(np.uint8)]
    payload = (fmt.PLANES_HEADER.pack(fmt.PLANES_MAGIC, fmt.PLANES_PLAIN, 3, 1, 1, h, w)
               + b"".join(q.tobytes() for q in planes))
    want = ycc_to_rgb_reference(*planes)
    for ps in (3, 4):
        out = np.zeros(h * w * ps, np.uint8)
        assert _jpeg.decode_region(payload, out, 0, 0, h, w, 8, ps, 1)[2:4] == (h, w)
        got = out.reshape(-1, ps)
        for c in range(3):  # channel by channel: a failure names the first triples wrong
            bad = np.flatnonzero(got[:, c] != want[:, c])
            assert not len(bad), (ps, "RGB"[c], [(int(planes[0][i]), int(planes[1][i]),
                                                   int(planes[2][i])) for i in bad[:5]])
        if ps == 4:
            assert (got[:, 3] == 255).all()


_AT_THE_END_OF_MAPPED_MEMORY = """
import ctypes, mmap, sys
import numpy as np
from dlpack_io.reader import jpegdecode
payload = open(sys.argv[1], "rb").read()
h, w = int(sys.argv[2]), int(sys.argv[3])
page = mmap.PAGESIZE
size = -(-len(payload) // page) * page
mem = mmap.mmap(-1, size + page)
at = size - len(payload)
mem[at:size] = payload
base = ctypes.addressof(ctypes.c_char.from_buffer(mem))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mprotect(ctypes.c_void_p(base + size), page, 0) == 0  # PROT_NONE after the record
view = memoryview(mem)[at:size]
out = np.zeros(h * w * 4, np.uint8)
for t, l in [(h - 1, w - 1), (h - 9, w - 9), (0, 0), (h // 2, 0)]:
    jpegdecode._jpeg.decode_region(view, out, t, l, h - t, w - l, 8, 4, 1)
print("read", len(payload))
"""


def test_packed_reads_stay_inside_the_record(tmp_path):
    """The AVX2 block reads fetch 16 bytes a row: the blocks at the end of a payload are read
    another way, so a record that ends where unreadable memory begins decodes (a read past
    it would kill the process)."""
    rng = np.random.default_rng(31)
    for sub in (0, 2):
        # noise: wide blocks, so the last ones sit within 16 bytes of the end
        data = save(Image.fromarray(rng.integers(0, 256, (37, 45, 3), np.uint8)), quality=100,
                    subsampling=sub)
        path = tmp_path / f"{sub}.planes"
        path.write_bytes(_jpeg.to_planes(data, 1 << 40))
        done = subprocess.run([sys.executable, "-c", _AT_THE_END_OF_MAPPED_MEMORY, str(path),
                               "37", "45"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "read" in done.stdout, (done.returncode, done.stderr)


def test_region_boxes_match_the_jpeg_decoder_for_every_orientation(packed):
    """Random upright boxes, RGB and RGBX: the planes give the JPEG decoder's pixels."""
    _, cases, _ = packed
    rng = np.random.default_rng(8)
    for name, data in cases.items():
        planes = _jpeg.to_planes(data, 1 << 40)
        if planes is None or name.startswith("tiny"):
            continue
        assert_upright_boxes(planes, reference(data), orientation_of(data), rng, 8, name,
                             opaque=True)


def test_odd_sizes_and_subsamplings_decode_exactly():
    """Widths and heights odd and even around the MCU, every subsampling, baseline and
    progressive: the whole image from its planes equals Pillow's decode of the JPEG."""
    rng = np.random.default_rng(21)
    for h, w in [(17, 33), (16, 16), (9, 5), (1, 9), (31, 6), (40, 57)]:
        img = Image.fromarray(photo_like(rng, h, w))
        for sub in (0, 1, 2):
            for progressive in (False, True):
                data = save(img, quality=85, subsampling=sub, progressive=progressive)
                planes = _jpeg.to_planes(data, 1 << 40)
                if planes is None:  # a subsampled width of <= 2: not upsampled fancily
                    assert sub != 0 and (w + 1) // 2 <= 2
                    continue
                out = np.empty(h * w * 3, np.uint8)
                _jpeg.decode_region(planes, out, 0, 0, h, w, 8, 3, 1)
                np.testing.assert_array_equal(out.reshape(h, w, 3), reference(data),
                                              err_msg=f"{h}x{w} sub {sub} prog {progressive}")


def _batches(dst, transforms, **kw):
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy keyword reduced_decode
        with Loader(Dataset(dst), batch_size=16, shuffle="global", seed=5,
                    transforms=transforms, **kw) as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                out += [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]
    return out


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Small photos of every subsampling packed in both modes, record and LMDB."""
    root = tmp_path_factory.mktemp("planes-photos")
    rng = np.random.default_rng(2)
    for i in range(24):
        d = root / "src" / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        (d / f"{i}.jpg").write_bytes(save(Image.fromarray(photo_like(rng, h, w)), quality=90,
                                          subsampling=int(i % 3)))
    for mode in ("jpeg", "planes"):
        for form in ("record", "lmdb"):
            convert(root / "src", root / f"{mode}-{form}", mode=mode, format=form, **FAST)
    return root


@pytest.mark.parametrize("form", ["record", "lmdb"])
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_loader_batches_equal_jpeg_mode_batches(photos, form, kind):
    """Same seeds, same batches as jpeg mode's, labels too: RandomResizedCrop + flip (jpeg
    mode at full DCT scale: planes have no reduced scale) and Resize + CenterCrop."""
    work = dict(num_workers=2, worker_kind=kind)
    crop = [RandomResizedCrop(40), RandomHorizontalFlip()]
    jpeg = _batches(photos / f"jpeg-{form}", crop, reduced_decode=False, **work)
    planes = _batches(photos / f"planes-{form}", crop, **work)
    assert len(jpeg) == len(planes) == 4
    for (xa, ya), (xb, yb) in zip(jpeg, planes):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    # Resize + CenterCrop: the filter reads around the box, in the block the decoder hands
    # it; the planes block has the JPEG block's origin, so the arithmetic is the same
    resize = [Resize(48), CenterCrop(40)]
    jpeg = np.concatenate([x for x, _ in _batches(photos / f"jpeg-{form}", resize, **work)])
    planes = np.concatenate([x for x, _ in _batches(photos / f"planes-{form}", resize, **work)])
    np.testing.assert_array_equal(jpeg, planes)


def test_planes_refuse_a_reduced_scale():
    data = save(Image.fromarray(photo_like(np.random.default_rng(1), 32, 32)))
    planes = _jpeg.to_planes(data, 1 << 40)
    with pytest.raises(ValueError, match="full scale only"):
        _jpeg.decode_region(planes, np.empty(32 * 32 * 4, np.uint8), 0, 0, 32, 32, 4, 3, 1)


def _hostile(planes: bytes) -> dict:
    """name -> payload: planes records that lie, each sealed with a valid checksum."""
    head = fmt.PLANES_HEADER.unpack_from(planes)
    body = planes[fmt.PLANES_HEADER.size:]

    def header(**change):
        fields = dict(zip(("magic", "version", "comps", "h", "v", "height", "width"), head))
        fields.update(change)
        return fmt.PLANES_HEADER.pack(*fields.values())

    # the first block 9 bits wide, later ones narrower by as much: the widths still sum to
    # the payload's length, so only the width check can refuse it
    height, width = head[5:]
    blocks = -(-height // 8) * -(-width // 8)
    widths = bytearray(body[blocks:2 * blocks])
    extra, widths[0] = 9 - widths[0], 9
    for k in range(1, blocks):
        take = min(extra, widths[k])
        widths[k] -= take
        extra -= take
    assert extra == 0
    return {"truncated": planes[:-1], "longer": planes + b"\0",
            "wider_than_a_byte": planes[:16 + blocks] + bytes(widths) + body[2 * blocks:],
            "version": header(version=3) + body,
            "comps": header(comps=2) + body,
            "subsampling": header(h=3) + body, "zero_side": header(width=0) + body,
            "claims_huge": header(height=65535, width=65535) + body,
            "grey_subsampled": header(comps=1) + body}


def test_hostile_planes_records_are_refused_by_name(packed, tmp_path):
    """Every consumer (Dataset, Loader threads/processes, inspect, verify) refuses each
    lying record with an error naming it; nothing crashes, hangs or allocates wildly."""
    root, _, _ = packed
    ds = Dataset(root / "planes")
    records = [(bytes(p), e) for p, e in (ds.record(i) for i in range(len(ds)))]
    # an upright 4:2:0 record of a photo that is not square: its sides swapped keep its length
    payload, entry = next((p, e) for p, e in records if int(e["kind"]) == fmt.KIND_PLANES
                          and int(e["orientation"]) == 1
                          and fmt.PLANES_HEADER.unpack_from(p)[3:5] == (2, 2))
    cases = {}
    for name, bad in _hostile(payload).items():
        dst = tmp_path / name
        shutil.copytree(root / "planes", dst)
        one_record_shard(dst, bad, height=int(entry["height"]), width=int(entry["width"]),
                         kind=fmt.KIND_PLANES)
        cases[name] = dst
    # a header that agrees with its length but not with the index (sides swapped)
    dst = tmp_path / "swapped"
    shutil.copytree(root / "planes", dst)
    magic, version, comps, hs, vs, height, width = fmt.PLANES_HEADER.unpack_from(payload)
    swapped = fmt.PLANES_HEADER.pack(magic, version, comps, hs, vs, width, height)
    one_record_shard(dst, swapped + payload[fmt.PLANES_HEADER.size:],
                     height=int(entry["height"]), width=int(entry["width"]), kind=fmt.KIND_PLANES)
    results = run_consumers({**cases, "swapped": dst}, tmp_path)
    for name in cases:
        assert_refused(results[name], "planes", modes=("dataset", "serial", "threads",
                                                        "processes", "verify"))
    assert_refused(results["swapped"], "is not inside the 70 x 45 image",
                   modes=("dataset", "verify"))


def test_export_writes_planes_as_the_png_of_their_pixels(packed):
    """`dlpack export` has no JPEG to write back for a planes record: it writes the PNG of
    its (upright) pixels, which are the JPEG's own."""
    from dlpack_io.tools.export import image_of

    root, cases, _ = packed
    ds = Dataset(root / "planes")
    for i, name in enumerate(_names(root / "planes")):
        payload, entry = ds.record(i)
        data, ext = image_of(payload, entry)
        if int(entry["kind"]) == fmt.KIND_PLANES:
            assert ext == "png"
            np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))),
                                          reference(cases[name[:-4]]), err_msg=name)
        elif int(entry["kind"]) == fmt.KIND_JPEG:
            assert (data, ext) == (bytes(payload), "jpg")


@pytest.mark.skipif(os.environ.get("DLPACK_IO_NO_AVX2") is not None, reason="already scalar")
def test_the_scalar_planes_code_gives_the_same_pixels():
    """The pixel tests again with the AVX2 kernels switched off (machines without AVX2)."""
    env = dict(os.environ, DLPACK_IO_NO_AVX2="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           __file__, "-k", "region_boxes or odd_sizes or hold_the_jpeg_pixels "
                           "or same_boxes or inside_the_record or saturate or every_ycc"],
                          env=env, cwd=Path(__file__).parents[2], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "7 passed" in done.stdout, done.stdout[-2000:]


def test_device_path_batches_equal_jpeg_mode_batches(photos, triton_interpret):
    """Workers(device_transforms=True): planes regions gathered into the batch buffer and
    finished by the kernels (their CPU twin here) give jpeg mode's batches."""
    from dlpack_io.reader import Workers

    def epoch(path, **kw):
        with Loader(Dataset(path), batch_size=8, seed=4, num_workers=1,
                    transforms=[RandomResizedCrop(16), RandomHorizontalFlip()],
                    workers=Workers(device_transforms=True, **kw)) as loader:
            return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]

    jpeg = epoch(photos / "jpeg-record", reduced_decode=False)
    planes = epoch(photos / "planes-record")
    assert len(jpeg) == len(planes) == 3
    for (xa, ya), (xb, yb) in zip(jpeg, planes):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_mutated_packed_payloads_decode_or_are_refused():
    """Random bytes changed anywhere in packed payloads (header, tables, bits), boxes
    anywhere: each read gives pixels or a ValueError that says what is wrong, and nothing
    crashes (test_packed_reads_stay_inside_the_record holds reads to the payload)."""
    rng = np.random.default_rng(33)
    base = [_jpeg.to_planes(save(Image.fromarray(photo_like(rng, h, w)), quality=q,
                                 subsampling=sub), 1 << 40)
            for h, w, q, sub in [(19, 27, 95, 2), (33, 16, 80, 1), (8, 41, 100, 0)]]
    refused = 0
    for trial in range(600):
        data = bytearray(base[trial % len(base)])
        for at in rng.integers(0, len(data), int(rng.integers(1, 4))):
            data[at] = int(rng.integers(0, 256)) if rng.random() < 0.7 else data[at] ^ 1
        h, w = 64, 64
        out = np.zeros(h * w * 4, np.uint8)
        top, left = int(rng.integers(0, 20)), int(rng.integers(0, 20))
        try:
            _jpeg.decode_region(bytes(data), out, top, left, int(rng.integers(1, 20)),
                                int(rng.integers(1, 20)), 8, 4, 1)
        except ValueError as e:
            # a changed magic makes it a JPEG to the reader; a changed side, a box outside
            assert any(k in str(e) for k in ("planes", "JPEG", "crop box", "claims")), e
            refused += 1
    assert 0 < refused < 600
