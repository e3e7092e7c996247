"""fmt.crc32 is zlib's CRC-32, whichever implementation computes it (zlib-ng when present)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from dlpack_io.reader import format as fmt


@pytest.mark.parametrize("size", [0, 1, 7, 4096, 5121, 110_003])
def test_crc32_equals_zlibs_on_unaligned_slices(size):
    data = np.random.default_rng(size).integers(0, 256, size + 5, dtype=np.uint8).tobytes()
    for view in (data[:size], memoryview(data)[3:3 + size], bytearray(data[5:])):
        assert fmt.crc32(view) == zlib.crc32(view) & 0xFFFFFFFF
    assert fmt.crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value
