"""`dlpack bench`'s limits measure camera-sized photos (larger than its synthetic images),
EXIF-rotated or not, as the Loader reads them: the decode buffers are sized from the
records, and each record's orientation is honoured."""
from __future__ import annotations

import numpy as np
from PIL import Image

from dlpack_io.packer import convert
from dlpack_io.reader import Dataset
from dlpack_io.tools.bench import limits


def _photos(root, count: int):
    (root / "a").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(count):
        exif = Image.Exif()
        exif[0x0112] = (1, 6, 8)[k % 3]  # upright, rotate 90 one way, then the other
        Image.fromarray(rng.integers(0, 255, (1536, 2048, 3), np.uint8)).save(
            root / "a" / f"p{k}.jpg", quality=80, exif=exif.tobytes())
    Image.fromarray(rng.integers(0, 255, (300, 400, 3), np.uint8)).save(root / "a" / "x.png")
    return root


def test_limits_of_large_rotated_photos_are_measured(tmp_path):
    convert(_photos(tmp_path / "src", 4), tmp_path / "ds", workers=1, progress=False,
            non_jpeg="jpeg")  # as the bench prepares its source
    assert {int(e["orientation"]) for k in range(5)
            for e in [Dataset(tmp_path / "ds").record(k)[1]]} >= {6, 8}
    breakdown = limits.decode_breakdown(tmp_path / "ds", count=5, rounds=1)
    assert all(v > 0 for v in breakdown.values()), breakdown
    assert limits.decode_limit(tmp_path / "ds", threads=1) > 0
