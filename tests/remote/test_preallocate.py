"""cache.preallocate: the blocks of a growing shard's file reserved when it is made."""
import errno
import os

import pytest

from dlpack_io.reader.remote import cache


def _file(tmp_path, size):
    fd = os.open(tmp_path / "grow", os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, size)
    return fd


def test_reserves_the_blocks_and_reads_zeros(tmp_path):
    fd = _file(tmp_path, 1 << 20)
    try:
        cache.preallocate(fd, 1 << 20)
        st = os.fstat(fd)
        assert (st.st_size, os.pread(fd, 1 << 20, 0)) == (1 << 20, bytes(1 << 20))
        assert st.st_blocks * 512 >= 1 << 20  # reserved, not sparse
    finally:
        os.close(fd)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_a_file_system_that_cannot_is_left_sparse(tmp_path, monkeypatch, code):
    def refuse(fd, at, size):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(os, "posix_fallocate", refuse)
    fd = _file(tmp_path, 4096)
    try:
        cache.preallocate(fd, 4096)  # no error: the writes allocate as they come
        assert os.fstat(fd).st_size == 4096
    finally:
        os.close(fd)


def test_a_full_disk_raises(tmp_path, monkeypatch):
    def full(fd, at, size):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "posix_fallocate", full)
    fd = _file(tmp_path, 4096)
    try:
        with pytest.raises(OSError) as caught:
            cache.preallocate(fd, 4096)
        assert caught.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
