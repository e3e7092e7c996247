"""The C resize (reader/_resize.c) under hostile sizes and a source truncated under the read
(issue 28, item 5 review): coefficient tables past Pillow's limit are refused before any
allocation, and a bus error in the middle of a resize leaves no memory behind."""
import mmap
import os

import numpy as np
import pytest

from dlpack_io.reader.format.spec import native_jpeg

ext = native_jpeg()
pytestmark = pytest.mark.skipif(ext is None, reason="C extension not built")


def _sparse_map(path, size: int) -> mmap.mmap:
    """A read-only map of a sparse file of ``size`` bytes (no disk, no memory used)."""
    with open(path, "wb") as f:
        f.truncate(size)
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def test_a_filter_wider_than_pillows_limit_is_refused_with_the_sizes(tmp_path):
    """A 2**30 + 1 pixel row into one pixel: 2**31 + 3 taps (an int overflow in the tap
    count before the check). Pillow refuses out * taps * 8 > 2**31 - 1 with MemoryError."""
    cols = 2**30 + 1
    src = _sparse_map(tmp_path / "wide", cols * 4)
    dst = np.zeros(3, np.uint8)
    with pytest.raises(MemoryError, match=rf"resize: .*{cols} -> 1 .*2147483647"):
        ext.resize(src, 0, cols * 4, 1, cols, 4, 0.0, 0.0, float(cols), 1.0, 1, 1, dst, 0,
                   False, False)
    src.close()


def test_an_upscale_past_pillows_limit_is_refused_before_allocating():
    """One pixel to 2**27 columns: Pillow's MemoryError (3 taps x 8 bytes x 2**27 > 2**31 - 1),
    not gigabytes of coefficient tables; one column fewer than the limit still works."""
    src = np.full(4, 200, np.uint8)
    ow = 2**27
    dst = np.empty(3 * ow, np.uint8)  # never touched when refused
    with pytest.raises(MemoryError, match=rf"resize: .*1 -> {ow} .*2147483647"):
        ext.resize(src, 0, 4, 1, 1, 4, 0.0, 0.0, 1.0, 1.0, 1, ow, dst, 0, False, False)
    small = np.empty(3 * 5, np.uint8)
    ext.resize(src, 0, 4, 1, 1, 4, 0.0, 0.0, 1.0, 1.0, 1, 5, small, 0, False, False)
    assert np.all(small == 200)


def _vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_a_bus_error_in_the_middle_of_a_resize_leaks_nothing(tmp_path):
    """The coefficient tables and rows a resize allocates (about 0.5 MB here) are freed when
    the read of a truncated mapped source jumps out of it: 150 faults, no 75 MB growth."""
    path = tmp_path / "shard"
    path.write_bytes(bytes(64 * 1024))
    with open(path, "rb") as f:
        src = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    os.truncate(path, 0)
    dst = np.zeros(3 * 3000 * 3000, np.uint8)

    def faults(n):
        for _ in range(n):
            with pytest.raises(ext.MappedFileError):
                ext.resize(src, 0, 40, 10, 10, 4, 0.0, 0.0, 10.0, 10.0, 3000, 3000, dst, 0,
                           False, False)
    faults(10)  # the allocator's own first growth
    before = _vm_bytes()
    faults(150)
    grown = _vm_bytes() - before
    src.close()
    assert grown < 8 * 2**20, f"{grown / 2**20:.1f} MB more after 150 bus errors"
