"""Packed per-sample records: one host buffer carries images, geometry, jitter and labels.

The ``*_packed`` ops must give exactly what the keyword form gives (both backends), read
every field from the records (a wrong field fails these tests), validate the record
columns like the keyword arguments, and never read outside the buffer when unvalidated.
"""

import numpy as np
import pytest
import torch

from dlpack_io import kernels
from dlpack_io.kernels import records as R
from dlpack_io.kernels import reference

from helpers import random_images

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZES = [(9, 14), (1, 1), (17, 5), (6, 6), (12, 30)]
BOXES = [[1, 2, 8, 11], [0, 0, 1, 1], [3, 0, 14, 5], [0, 0, 6, 6], [2, 1, 9, 29]]


def test_layout_is_64_bytes_with_aligned_int64_fields():
    assert R.RECORD_DTYPE.itemsize == R.RECORD_BYTES == 64
    assert R.RECORD_DTYPE.fields["offset"][1] % 8 == 0
    assert R.RECORD_DTYPE.fields["label"][1] % 8 == 0
    assert R.WORD == {"top": 0, "left": 1, "box_height": 2, "box_width": 3, "flags": 4,
                      "order": 5, "height": 6, "width": 7, "offset": 8, "label": 10,
                      "brightness": 12, "contrast": 13, "saturation": 14, "hue": 15}


def test_order_codes_round_trip_and_validate():
    perms = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]])
    codes = R.encode_order(perms)
    assert codes.tolist() == [R.IDENTITY_ORDER, 3 | 2 << 2 | 1 << 4, 1 | 3 << 2 | 2 << 6]
    assert torch.equal(R.decode_order(codes), perms)
    bad = torch.tensor([R.IDENTITY_ORDER, 0, 255, 256, -1])
    assert R.valid_order(bad).tolist() == [True, False, False, False, False]
    with pytest.raises(ValueError, match="permutation of 0, 1, 2, 3"):
        R.encode_order(torch.tensor([[0, 0, 1, 2]]))


def _slot(seed=0, gap=3):
    """A pinned-slot-like host buffer: ragged images, then 8-aligned records of them."""
    g = torch.Generator().manual_seed(seed)
    samples = [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g)
               for h, w in SIZES]
    offsets, pos = [], gap
    for s in samples:
        offsets.append(pos)
        pos += s.numel() + gap
    rec_at = -(-pos // 8) * 8 + 8  # some slack, then the records, 8-byte aligned
    slot = torch.zeros(rec_at + len(samples) * R.RECORD_BYTES, dtype=torch.uint8)
    for s, off in zip(samples, offsets):
        slot[off:off + s.numel()] = s.flatten()
    rec = R.host_records(slot, rec_at, len(samples))
    rec["top"], rec["left"], rec["box_height"], rec["box_width"] = np.array(BOXES).T
    rec["flags"] = [1, 0, 3, 2, 1]
    rec["height"], rec["width"] = np.array(SIZES).T
    rec["offset"] = offsets
    rec["label"] = [7, 2**40, 0, 999, 3]
    rec["order"] = R.encode_order(torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2],
                                                [2, 3, 0, 1], [0, 2, 1, 3]])).numpy()
    rec["brightness"] = [0.7, 1.3, 1.0, 0.9, 1.2]
    rec["contrast"] = [1.2, 0.6, 1.0, 0.8, 1.1]
    rec["saturation"] = [0.5, 1.4, 1.0, 0.0, 1.0]
    rec["hue"] = [0.1, -0.05, 0.0, 0.5, -0.5]
    return slot, rec_at, samples, offsets


def _keyword_args(slot, rec_at):
    rec = R.host_records(slot, rec_at, len(SIZES))
    flags = torch.from_numpy(rec["flags"].copy())
    return dict(boxes=torch.tensor(BOXES), flip_h=(flags & 1) != 0, flip_v=(flags & 2) != 0,
                offsets=torch.from_numpy(rec["offset"].copy()),
                heights=torch.tensor([h for h, _ in SIZES]),
                widths=torch.tensor([w for _, w in SIZES]),
                order=torch.from_numpy(rec["order"].copy()),
                **{k: torch.from_numpy(rec[k].copy()) for k in R.JITTER_OPS})


@pytest.mark.parametrize("backend", ["kernel", "reference"])
@pytest.mark.parametrize("antialias", [False, True])
def test_packed_ragged_resize_equals_keyword_form(backend, antialias, triton_interpret):
    slot, rec_at, _, _ = _slot()
    records = R.records_view(slot, rec_at, len(SIZES))
    assert torch.equal(R.labels_of(records), torch.tensor([7, 2**40, 0, 999, 3]))
    mod = kernels if backend == "kernel" else reference
    kw = dict(out_dtype=torch.float16, mean=MEAN, std=STD, antialias=antialias)
    packed = mod.resized_crop_packed(slot, records, (7, 8), jitter=R.JITTER_OPS, **kw)
    keyword = _keyword_args(slot, rec_at)
    want = mod.resized_crop(slot, keyword.pop("boxes"), (7, 8), keyword.pop("flip_h"),
                            keyword.pop("flip_v"), **keyword, **kw)
    assert torch.equal(packed, want)


@pytest.mark.usefixtures("triton_interpret")
def test_packed_dense_crop_and_resize_read_every_field():
    images = random_images(3, 10, 12, 3, seed=4)
    buf = torch.zeros(3 * R.RECORD_BYTES, dtype=torch.uint8)
    rec = R.host_records(buf, 0, 3)
    rec["top"], rec["left"] = [0, 3, 5], [2, 0, 4]
    rec["box_height"], rec["box_width"] = [10, 4, 5], [10, 9, 8]
    rec["flags"] = [0, 1, 2]
    rec["order"] = R.IDENTITY_ORDER
    rec["brightness"], rec["saturation"] = [1.5, 0.5, 1.0], [0.0, 1.0, 2.0]
    records = R.records_view(buf, 0, 3)
    jitter = ("brightness", "saturation")
    crop = kernels.crop_flip_permute_packed(images, records, 5, 8, jitter=jitter,
                                            out_dtype=torch.float32)
    b, s = torch.tensor(rec["brightness"]), torch.tensor(rec["saturation"])
    top, left = torch.tensor(rec["top"]), torch.tensor(rec["left"])
    fh, fv = torch.tensor([False, True, False]), torch.tensor([False, False, True])
    want = reference.crop_flip_permute(images, top, left, 5, 8, fh, fv, brightness=b,
                                       saturation=s, out_dtype=torch.float32)
    torch.testing.assert_close(crop, want, rtol=0, atol=1e-6)
    boxes = torch.tensor(np.stack([rec["top"], rec["left"], rec["box_height"],
                                   rec["box_width"]], 1))
    res = kernels.resized_crop_packed(images, records, (6, 7), antialias=True, jitter=jitter,
                                      out_dtype=torch.float32)
    want = reference.resized_crop(images, boxes, (6, 7), fh, fv, antialias=True, brightness=b,
                                  saturation=s, out_dtype=torch.float32)
    torch.testing.assert_close(res, want, rtol=0, atol=1e-5)
    plain = kernels.resized_crop_packed(images, records, (6, 7), antialias=True)
    diff = (plain.int() - reference.resized_crop(images, boxes, (6, 7), fh, fv,
                                                 antialias=True).int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() <= 0.02  # uint8: round-half ties


def test_views_check_alignment_and_bounds():
    buf = torch.zeros(200, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"records_view: records must start at an 8-byte "
                                         r"aligned address.*offset 4"):
        R.records_view(buf, 4, 1)
    with pytest.raises(ValueError, match=r"4 records of 64 bytes at offset 8 end at byte "
                                         r"264, past the 200-byte buffer"):
        R.records_view(buf, 8, 4)
    with pytest.raises(TypeError, match="records_view: buffer must be a 1-D uint8 tensor"):
        R.records_view(buf.view(10, 20), 0, 1)
    with pytest.raises(ValueError, match="host_records: offset must be an int >= 0"):
        R.host_records(buf, -8, 1)
    assert R.records_view(buf, 8, 3).shape == (3, 16)


def _packed_call(**over):
    slot, rec_at, _, _ = _slot()
    kw = dict(images=slot, records=R.records_view(slot, rec_at, len(SIZES)), out_size=(4, 5),
              jitter=R.JITTER_OPS)
    kw.update(over)
    return kw


def _poke(field, index, value):
    """A valid packed call with one record field overwritten."""
    slot, rec_at, _, _ = _slot()
    R.host_records(slot, rec_at, len(SIZES))[field][index] = value
    return _packed_call(images=slot, records=R.records_view(slot, rec_at, len(SIZES)))


PACKED_CASES = {
    "records-int64": (_packed_call(records=torch.zeros((5, 8), dtype=torch.int64)), TypeError,
                      r"records must be int32"),
    "records-shape": (_packed_call(records=torch.zeros((5, 15), dtype=torch.int32)), ValueError,
                      r"records must have shape \(N, 16\), got \(5, 15\)"),
    "records-strided": (_packed_call(records=torch.zeros((5, 32), dtype=torch.int32)[:, ::2]),
                        ValueError, r"records must be contiguous"),
    "jitter-unknown": (_packed_call(jitter=("brightness", "gamma")), ValueError,
                       r"jitter has unknown op names \['gamma'\]"),
    "jitter-str": (_packed_call(jitter="hue"), TypeError, r"jitter must be a tuple of op names"),
    "box-outside": (_poke("box_width", 4, 30), ValueError,
                    r"records\[4\] = \(top=2, left=1, height=9, width=30\) does not fit in "
                    r"the 12x30 image"),
    "offset-past-end": (_poke("offset", 0, 10**6), ValueError,
                        r"sample 0: offset=1000000, height=9, width=14"),
    "order-invalid": (_poke("order", 2, 0), ValueError,
                      r"order\[2\] = 0 is not an order code"),
    "hue-range": (_poke("hue", 1, 0.75), ValueError, r"hue\[1\] must be in \[-0.5, 0.5\], "
                                                     r"got 0.75"),
    "saturation-negative": (_poke("saturation", 3, -1.0), ValueError,
                            r"saturation\[3\] must be a finite factor >= 0"),
}


@pytest.mark.parametrize("fn", [kernels.resized_crop_packed, reference.resized_crop_packed],
                         ids=["launcher", "reference"])
@pytest.mark.parametrize("case", PACKED_CASES, ids=list(PACKED_CASES))
def test_packed_errors(fn, case, monkeypatch):
    import dlpack_io.kernels.resize as resize
    monkeypatch.setattr(resize, "_launch", lambda a: pytest.fail("launched"))
    kwargs, exc, match = PACKED_CASES[case]
    with pytest.raises(exc, match=r"^resized_crop_packed: " + match):
        fn(**kwargs)


@pytest.mark.usefixtures("triton_interpret")
def test_unvalidated_bad_records_stay_in_the_buffer():
    slot, rec_at, _, _ = _slot()
    rec = R.host_records(slot, rec_at, len(SIZES))
    rec["offset"][0] = 2**40  # far past the buffer
    rec["height"][1], rec["width"][1] = 2**30, 2**30  # overflows int32 sizes
    rec["offset"][2] = -5
    rec["order"][3] = 77  # not a permutation
    rec["box_height"][4] = -3
    records = R.records_view(slot, rec_at, len(SIZES))
    for antialias in (False, True):
        out = kernels.resized_crop_packed(slot, records, (4, 5), antialias=antialias,
                                          jitter=R.JITTER_OPS, validate=False)
        ref = reference.resized_crop_packed(slot, records, (4, 5), antialias=antialias,
                                            jitter=R.JITTER_OPS, validate=False)
        assert out.shape == (5, 3, 4, 5)
        # bad ragged records read byte 0.. of the buffer as a 1x1 image in both backends
        assert torch.equal(out[:3], ref[:3])
