"""The per-read recheck of an assembled shard compares the mapped file's own ``fstat``
(its descriptor stays open beside the map) with the signature it was mapped with: an edit
in place after mapping, even with the mtime set back, is caught at the next read; a name
swapped onto the path is caught too (the mapped inode lost a link: new ctime) and the new
file is verified before use; no descriptor is left open by a discarded map (real SeaweedFS).
"""
from __future__ import annotations

import os
import shutil

import pytest

from dlpack_io.reader import Loader, RandomResizedCrop
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.remote import assembled

from helpers import pack_and_upload

URL = "s3://dlpack-test/recheck/base"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    return pack_and_upload(tmp_path_factory.mktemp("recheck"), URL, s3_server.env(), count=24,
                           classes=2, seed=5, size=(48, 64))


def _mapped(packed):
    """(local data set, remote data set after epoch 0, shard 1's path, its mapped view)."""
    remote = Dataset(URL)
    loader = Loader(remote, batch_size=8, seed=3, transforms=[RandomResizedCrop(24)])
    for _ in loader:
        pass
    loader.close()
    whole = remote._remote.whole
    view = whole.view(1)
    assert view is not None  # assembled, verified and mapped in this process
    return Dataset(packed), remote, whole.path(1), view


def _fds_on(path: str) -> int:
    """Descriptors of this process open on the file at ``path`` (by inode)."""
    st, n = os.stat(path), 0
    for name in os.listdir("/proc/self/fd"):
        try:
            n += os.path.samestat(os.stat(f"/proc/self/fd/{name}"), st)
        except OSError:
            pass
    return n


def test_an_edit_in_place_after_mapping_is_caught_at_the_next_read(s3_env, packed, caplog):
    local, remote, path, view = _mapped(packed)
    entry = remote.shards[1].index[2]
    at, n = int(entry["offset"]), int(entry["length"])
    assert remote.shards[1].payload(2) == local.shards[1].payload(2)
    st = os.stat(path)
    with open(path, "r+b") as f:  # same inode, size and (below) mtime: only the ctime tells
        f.seek(at)
        f.write(bytes(n))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert bytes(view[at:at + n]) == bytes(n)  # the mapped bytes did change
    with caplog.at_level("WARNING"):
        assert remote._remote.whole.view(1) is None  # verified again: fails, discarded
    assert "record 2 fails its checksum" in caplog.text and path in caplog.text
    assert not os.path.exists(path)
    assert bytes(remote.shards[1].payload(2)) == bytes(local.shards[1].payload(2))  # fetched


def test_a_name_swapped_after_mapping_is_caught_and_the_new_file_verified(s3_env, packed,
                                                                         monkeypatch):
    local, remote, path, _ = _mapped(packed)
    checked = []
    real = assembled._first_bad
    monkeypatch.setattr(assembled, "_first_bad", lambda fd, shard: checked.append(1) or
                        real(fd, shard))
    assert remote._remote.whole.view(1) is not None and checked == []  # unchanged: no check
    copy = path + ".copy"
    shutil.copyfile(path, copy)  # the same bytes, another inode (no stamp matches it)
    os.rename(copy, path)
    again = remote._remote.whole.view(1)
    assert checked == [1]  # the file now at the path was read and verified before use
    assert bytes(again) == open(local.shards[1].path, "rb").read()
    assert remote._remote.whole.view(1) is not None and checked == [1]  # mapped once


def test_a_discarded_map_leaves_no_descriptor_open(s3_env, packed):
    _, remote, path, view = _mapped(packed)
    del view
    held = _fds_on(path)  # ours for the recheck, the mmap module's own (+ the grown file's)
    keep = os.open(path, os.O_RDONLY)  # to find the old inode's descriptors after the remap
    try:
        with open(path + ".tmp", "wb") as f:
            f.write(open(path, "rb").read())
        os.rename(path + ".tmp", path)  # a new inode at the path: the old map is dropped
        assert remote._remote.whole.view(1) is not None
        old = os.fstat(keep)
        on_old = sum(_same(f"/proc/self/fd/{n}", old) for n in os.listdir("/proc/self/fd"))
        assert on_old == held - 2 + 1  # ``keep``: the dropped map's two descriptors closed
    finally:
        os.close(keep)


def _same(link: str, st) -> bool:
    try:
        return os.path.samestat(os.stat(link), st)
    except OSError:
        return False
