"""ImageFolder's attributes on a Dataset: classes, class_to_idx, targets, samples and
source(i) give what torchvision's ImageFolder gives for the same folder (re-implemented
here from its definition: sorted class folders, sorted files, IMG_EXTENSIONS)."""
import os

import numpy as np
import pytest

from dlpack_io.packer import convert
from dlpack_io.reader import Dataset, FormatError
from dlpack_io.tools.synth import make_image_folder

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _image_folder(root):
    """torchvision.datasets.ImageFolder's (classes, class_to_idx, samples) by its definition
    (on a folder without hidden entries, where it and we agree)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    class_to_idx = {c: i for i, c in enumerate(classes)}
    samples = []
    for c in classes:
        for folder, _, files in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for name in sorted(files):
                if name.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(folder, name), class_to_idx[c]))
    return classes, class_to_idx, samples


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    make_image_folder(root / "src", 14, 3, seed=6, size=(20, 24))
    out = {}
    for name, kw in {"kept": {}, "bare": {"provenance": False},
                     "lmdb": {"format": "lmdb"}}.items():
        convert(root / "src", root / name, workers=1, progress=False, shard_size="10KB", **kw)
        out[name] = Dataset(root / name)
    return root / "src", out


@pytest.mark.parametrize("name", ["kept", "lmdb"])
def test_attributes_match_image_folder(packed, name):
    src, sets = packed
    ds = sets[name]
    classes, class_to_idx, samples = _image_folder(src)
    assert ds.classes == classes and ds.class_to_idx == class_to_idx
    assert len(ds.shards) > 1  # the shuffle spreads samples across shards
    # the same samples, in our (shuffled) order: each path with ImageFolder's label
    assert sorted(ds.samples) == sorted(samples)
    assert ds.targets == [label for _, label in ds.samples]
    assert isinstance(ds.targets, list) and np.array_equal(ds.targets, ds.labels)
    for i in (0, 5, len(ds) - 1, -1):
        path, label = ds.samples[i]
        assert ds.source(i) == path and ds[i][1] == label
        assert ds.source(i, relative=True) == os.path.relpath(path, src)
    assert ds.source_root == str(src.resolve())


def test_no_provenance_refuses_full_paths_and_keeps_relative_ones(packed):
    src, sets = packed
    ds = sets["bare"]
    assert ds.source_root is None
    for get in (lambda: ds.samples, lambda: ds.source(0)):
        with pytest.raises(ValueError, match="packed with --no-provenance.*relative=True"):
            get()
    assert sorted(ds.source(i, relative=True) for i in range(len(ds))) == \
        sorted(os.path.relpath(p, src) for p, _ in _image_folder(src)[2])
    assert ds.targets == sets["kept"].targets  # labels never depend on provenance


def test_missing_or_damaged_paths_are_named(packed, tmp_path, monkeypatch):
    """A shard whose metadata does not list one path per record is refused, by name (the
    shard is written by the real writer, its path list cut short)."""
    from dlpack_io.packer.writers import RecordShardWriter

    src, _ = packed
    real = RecordShardWriter._index_and_meta

    def short(self):
        index, meta = real(self)
        return index, dict(meta, paths=meta["paths"][:-1])

    monkeypatch.setattr(RecordShardWriter, "_index_and_meta", short)
    convert(src, tmp_path / "short", workers=1, progress=False, shard_size="10KB")
    monkeypatch.undo()
    ds = Dataset(tmp_path / "short")
    with pytest.raises(FormatError, match=r"shard-00000\.rec: metadata 'paths' must list the "
                                          r"source path of each of its \d+ records, got \d+ "
                                          r"entries"):
        ds.source(0)
    with pytest.raises(FormatError, match="metadata 'paths'"):
        ds.samples  # noqa: B018
