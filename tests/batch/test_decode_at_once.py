"""The batch path's many-record C call (build._decodes_at_once, _jpeg.decode_resized_many):
JPEG and planes records of mapped shards are decoded and resized by one call per range of
samples, to the bits the sample-by-sample path gives; a record the call cannot make goes
alone through that path, which names it (or skips it), and the call goes on after it."""
import shutil

import numpy as np
import pytest

from dlpack_io.reader import (CenterCrop, Dataset, Loader, Output, RandomHorizontalFlip,
                              RandomResizedCrop, Resize, SampleError, Workers, jpegdecode)

RECIPES = {
    "random resized crop": [RandomResizedCrop(40), RandomHorizontalFlip()],
    "resize + center crop": [Resize(36), CenterCrop(32)],  # a float box inside a window
}


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("at_once")
    make_image_folder(root / "src", 48, 4, seed=11, size=(190, 253))
    for mode in ("jpeg", "planes"):
        convert(root / "src", root / mode, mode=mode, shard_size="400KB", workers=1,
                progress=False, overwrite=True)
    convert(root / "src", root / "jpeg-lmdb", mode="jpeg", format="lmdb", workers=1,
            progress=False, overwrite=True)
    return root


def _epoch(path, transforms, **kw):
    with Loader(Dataset(path), batch_size=8, seed=5, num_workers=0, transforms=transforms,
                output=Output(return_index=True), **kw) as loader:
        out = [tuple(t.numpy().copy() if hasattr(t, "numpy") else np.array(t) for t in batch)
               for batch in loader]
        return out, [(s.sample, s.reason) for s in loader.skipped.samples]


def _same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def _counting(monkeypatch):
    """Count the many-record calls and the samples made one at a time."""
    calls = {"many": 0, "one": 0}
    many, one = jpegdecode.native_decode_resized_many, jpegdecode.decode_resized

    def many_counted(*args):
        calls["many"] += 1
        return many(*args)

    def one_counted(*args, **kw):
        calls["one"] += 1
        return one(*args, **kw)

    monkeypatch.setattr(jpegdecode, "native_decode_resized_many", many_counted)
    monkeypatch.setattr(jpegdecode, "decode_resized", one_counted)
    return calls


@pytest.mark.skipif(jpegdecode.native_decode_resized_many is None, reason="no C extension")
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("mode", ["jpeg", "planes"])
def test_one_call_makes_the_bits_of_the_sample_path(sets, mode, recipe, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(jpegdecode, "native_decode_resized_many", None)
        want, _ = _epoch(sets / mode, RECIPES[recipe])
    calls = _counting(monkeypatch)
    got, skipped = _epoch(sets / mode, RECIPES[recipe])
    _same(got, want)
    assert skipped == []
    assert calls == {"many": len(got), "one": 0}  # serial: one range per batch


@pytest.mark.skipif(jpegdecode.native_decode_resized_many is None, reason="no C extension")
@pytest.mark.parametrize("mode", ["jpeg", "planes"])
def test_a_record_the_call_cannot_make_goes_alone(sets, mode, tmp_path, monkeypatch):
    dst = tmp_path / mode
    shutil.copytree(sets / mode, dst)
    ds = Dataset(dst)
    k, _ = ds.locate(21)
    _, entry = ds.record(21)
    with open(ds.shards[k].path, "r+b") as f:  # sample 21's record: garbage (CRC left stale)
        f.seek(int(entry["offset"]))
        f.write(b"\xff" * 24)
    transforms = RECIPES["random resized crop"]
    with monkeypatch.context() as m:
        m.setattr(jpegdecode, "native_decode_resized_many", None)
        want, want_skipped = _epoch(dst, transforms, workers=Workers(on_error="skip"))
    calls = _counting(monkeypatch)
    got, skipped = _epoch(dst, transforms, workers=Workers(on_error="skip"))
    _same(got, want)
    assert [s for s, _ in skipped] == [21] and skipped == want_skipped
    # the bad record alone, then a second call for the rest of its batch
    assert calls == {"many": len(got) + 1, "one": 1}
    with pytest.raises(SampleError, match=r"sample 21\b") as caught:
        _epoch(dst, transforms)
    assert ds.shards[k].path.split("/")[-1] in str(caught.value)


@pytest.mark.skipif(jpegdecode.native_decode_resized_many is None, reason="no C extension")
def test_records_not_in_one_mapped_file_take_the_sample_path_without_a_call(sets, monkeypatch):
    """LMDB records (no one mapped file): no many-record call at all, the bits of the
    record set's."""
    transforms = RECIPES["random resized crop"]
    want, _ = _epoch(sets / "jpeg", transforms)
    calls = _counting(monkeypatch)
    got, _ = _epoch(sets / "jpeg-lmdb", transforms)
    _same(got, want)
    assert calls["many"] == 0 and calls["one"] == 48
